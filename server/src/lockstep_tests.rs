//! A leader and a follower on simulated CPU ranks (threads joined by a `collective::World`),
//! each over its half of a tensor-parallel engine: the follower makes the leader's calls, and
//! both give every request the tokens the whole engine gives it.

use kiln_engine::engine::{Engine, EngineOptions};
use kiln_engine::sampling::SamplingParams;
use kiln_engine::scheduler::Outcome;
use kiln_engine::stop::StopCriteria;
use kiln_frontend::model::{random_weights, ModelConfig, Precision};
use kiln_runtime::collective::World;
use kiln_runtime::{Backend, RunMode};

use super::*;

fn engine(rank: Option<(usize, usize)>) -> Engine {
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, 41).unwrap();
    let options = EngineOptions {
        prefill_lengths: vec![4, 8],
        prefill_batches: vec![1, 2],
        decode_batches: vec![1, 2],
        tensor_parallel: rank,
        ..EngineOptions::new(2, 24, Precision::F32, RunMode::Eager)
    };
    Engine::new((&config, &weights), &Backend::Cpu, options).unwrap()
}

fn request(prompt: &[u32], temperature: f32, new: usize) -> Request {
    Request {
        prompt: prompt.to_vec(),
        sampling: SamplingParams {
            temperature,
            seed: 9,
            ..SamplingParams::default()
        },
        stop: StopCriteria {
            eos_token_ids: vec![],
            stop_strings: vec![],
            max_new_tokens: new,
        },
    }
}

/// Three requests onto two slots, one cancelled mid-flight, one refused; steps until idle.
fn drive(
    scheduler: &mut ContinuousBatchScheduler<'_>,
    leader: &mut Option<Leader>,
) -> Vec<Outcome> {
    let mut ids = Vec::new();
    for (prompt, temperature, new) in [
        (&[3u32, 5, 7][..], 0.0, 6),
        (&[11, 2], 0.9, 8),
        (&[4, 4, 4, 4, 4], 0.0, 5),
    ] {
        ids.push(submit(scheduler, leader, request(prompt, temperature, new)).unwrap());
    }
    // Longer than any prefill bucket: refused alike on every rank.
    assert!(submit(scheduler, leader, request(&[1; 30], 0.0, 2)).is_err());
    let mut steps = 0;
    while !scheduler.is_idle() {
        if let Some(leader) = leader {
            leader.publish(Call::Step).unwrap();
        }
        let events = scheduler.step().unwrap();
        if let Some(leader) = leader {
            leader.agree(&events).unwrap();
        }
        steps += 1;
        if steps == 2 {
            cancel(scheduler, leader, ids[1]);
        }
    }
    if let Some(leader) = leader {
        leader.publish(Call::Stop).unwrap();
    }
    ids.iter()
        .map(|&id| scheduler.outcome(id).unwrap())
        .collect()
}

#[test]
fn a_follower_makes_the_leaders_calls_and_both_get_the_whole_engines_tokens() {
    let whole = drive(
        &mut ContinuousBatchScheduler::new(engine(None), None),
        &mut None,
    );
    assert!(
        whole[1].tokens.len() < 8,
        "request 1 was cancelled mid-flight"
    );
    let mut ranks = World::ranks(2).unwrap().into_iter();
    let (zero, one) = (ranks.next().unwrap(), ranks.next().unwrap());
    let (led, followed) = std::thread::scope(|s| {
        let follower = s.spawn(move || {
            let one: Arc<dyn Communicator> = Arc::new(one);
            let mut engine = engine(Some((1, 2)));
            engine.join(&one).unwrap();
            let mut scheduler = ContinuousBatchScheduler::new(engine, None);
            follow(&mut scheduler, &*one).unwrap();
            (0..3)
                .map(|i| scheduler.outcome(RequestId(i)).unwrap())
                .collect::<Vec<_>>()
        });
        let zero: Arc<dyn Communicator> = Arc::new(zero);
        let mut engine = engine(Some((0, 2)));
        engine.join(&zero).unwrap();
        let mut scheduler = ContinuousBatchScheduler::new(engine, None);
        let led = drive(&mut scheduler, &mut Some(Leader::new(zero)));
        (led, follower.join().unwrap())
    });
    for (i, outcome) in whole.iter().enumerate() {
        assert_eq!(led[i].tokens, outcome.tokens, "request {i} on the leader");
        assert_eq!(
            followed[i].tokens, outcome.tokens,
            "request {i} on the follower"
        );
        assert_eq!(
            followed[i].finish_reason, outcome.finish_reason,
            "request {i}"
        );
    }
}

#[test]
fn a_long_journal_goes_in_several_messages_and_diverged_steps_are_caught() {
    let mut ranks = World::ranks(2).unwrap().into_iter();
    let (zero, one): (Arc<dyn Communicator>, Arc<dyn Communicator>) = (
        Arc::new(ranks.next().unwrap()),
        Arc::new(ranks.next().unwrap()),
    );
    std::thread::scope(|s| {
        let follower = s.spawn(|| {
            let mut engine = engine(Some((1, 2)));
            engine.join(&one).unwrap();
            let mut scheduler = ContinuousBatchScheduler::new(engine, None);
            follow(&mut scheduler, &*one).unwrap();
            (0..6)
                .map(|i| scheduler.phase(RequestId(i)))
                .collect::<Vec<_>>()
        });
        let mut engine = engine(Some((0, 2)));
        engine.join(&zero).unwrap();
        let mut scheduler = ContinuousBatchScheduler::new(engine, None);
        // Messages of at most 300 bytes: a few calls each.
        let mut leader = Some(Leader {
            limit: 300,
            ..Leader::new(zero.clone())
        });
        for i in 0..6u32 {
            submit(&mut scheduler, &mut leader, request(&[i + 1, 2, 3], 0.0, 3)).unwrap();
        }
        let leader_ref = leader.as_mut().unwrap();
        leader_ref.publish(Call::Step).unwrap();
        let events = scheduler.step().unwrap();
        leader_ref.agree(&events).unwrap();
        leader_ref.publish(Call::Stop).unwrap();
        let led: Vec<_> = (0..6).map(|i| scheduler.phase(RequestId(i))).collect();
        assert_eq!(follower.join().unwrap(), led);
    });
    // Ranks whose steps gave other tokens fail their check.
    let ranks = World::ranks(2).unwrap();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (ranks.iter().enumerate())
            .map(|(rank, world)| {
                s.spawn(move || {
                    let event = Event {
                        id: RequestId(0),
                        token: Some(10 + rank as u32),
                        text: None,
                        finished: None,
                    };
                    agree(world, &[event])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    for result in results {
        let error = result.unwrap_err().to_string();
        assert!(error.contains("the ranks are out of step"), "{error}");
    }
}
