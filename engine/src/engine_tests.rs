//! The engine and its schedulers on the CPU: greedy tokens of the continuous scheduler equal
//! the serial reference's, whose equal a plain greedy loop over the eager oracle — mixed prompt
//! lengths, arrivals mid-flight, stops and cancellations mid-flight, slots reused; sampled
//! tokens by seed whatever the scheduler; the memory the engine reports; bad requests.

use kiln_frontend::model::{random_weights, shard_weights, ModelConfig, ModelWeights, Precision};
use kiln_frontend::Var;
use kiln_runtime::{Backend, RunMode};
use rand::Rng;

use super::*;
use crate::generate::ReferenceGenerator;
use crate::sampling::SamplingParams;
use crate::scheduler::continuous::ContinuousBatchScheduler;
use crate::scheduler::metrics::{run_workload, Arrival};
use crate::scheduler::reference::ReferenceScheduler;
use crate::scheduler::{Phase, Request, Scheduler};
use crate::stop::{FinishReason, StopCriteria};
use crate::testing::{fresh_rng, oracle_greedy};

const MAX_SEQ: usize = 24;

/// Few buckets, so prompts are padded, batches split and padding rows run.
fn options(slots: usize, mode: RunMode) -> EngineOptions {
    let mut decode_batches = vec![1, slots];
    decode_batches.dedup();
    EngineOptions {
        prefill_lengths: vec![4, 8, 16],
        prefill_batches: vec![1],
        decode_batches,
        ..EngineOptions::new(slots, MAX_SEQ, Precision::F32, mode)
    }
}

fn engine(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    slots: usize,
    mode: RunMode,
) -> Engine {
    Engine::new((config, weights), &Backend::Cpu, options(slots, mode)).unwrap()
}

fn request(
    prompt: Vec<u32>,
    max_new_tokens: usize,
    eos: &[u32],
    sampling: SamplingParams,
) -> Request {
    Request {
        prompt,
        sampling,
        stop: StopCriteria {
            eos_token_ids: eos.to_vec(),
            stop_strings: Vec::new(),
            max_new_tokens,
        },
    }
}

fn prompt(rng: &mut impl Rng, config: &ModelConfig, length: usize) -> Vec<u32> {
    (0..length)
        .map(|_| rng.random_range(0..config.vocab_size as u32))
        .collect()
}

/// Seven requests of lengths 1 to 11 (two of one length), arriving over several steps, onto
/// 3 slots: admissions wait for free slots, slots are reused, batches shrink and grow.
fn workload(
    rng: &mut impl Rng,
    config: &ModelConfig,
    sampling: &dyn Fn(usize) -> SamplingParams,
) -> Vec<Arrival> {
    let shapes = [
        (5, 0, 7),
        (3, 0, 9),
        (5, 0, 4),
        (11, 2, 6),
        (1, 3, 8),
        (8, 3, 5),
        (2, 9, 3),
    ];
    (shapes.iter().enumerate())
        .map(|(i, &(length, step, new))| Arrival {
            step,
            request: request(prompt(rng, config, length), new, &[], sampling(i)),
        })
        .collect()
}

fn tokens(scheduler: &mut dyn Scheduler, arrivals: &[Arrival]) -> Vec<Vec<u32>> {
    let report = run_workload(scheduler, arrivals, |_| {}).unwrap();
    report.outcomes.into_iter().map(|o| o.tokens).collect()
}

#[test]
fn continuous_greedy_equals_the_reference_and_the_oracle() {
    let mut rng = fresh_rng("continuous_greedy_equals_the_reference_and_the_oracle");
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        let weights = random_weights(&config, rng.random()).unwrap();
        let arrivals = workload(&mut rng, &config, &|_| SamplingParams::greedy());
        let want: Vec<Vec<u32>> = (arrivals.iter())
            .map(|a| {
                oracle_greedy(
                    &config,
                    &weights,
                    &a.request.prompt,
                    a.request.stop.max_new_tokens,
                )
            })
            .collect();
        for mode in [RunMode::Eager, RunMode::Graph] {
            let generator = ReferenceGenerator::new(
                (&config, &weights),
                Backend::Cpu,
                (mode, Precision::F32),
                MAX_SEQ,
            )
            .unwrap();
            let reference = tokens(&mut ReferenceScheduler::new(generator, None), &arrivals);
            assert_eq!(reference, want, "{:?} {mode:?}: reference", config.family);
            let mut continuous =
                ContinuousBatchScheduler::new(engine(&config, &weights, 3, mode), None);
            let got = tokens(&mut continuous, &arrivals);
            assert_eq!(got, want, "{:?} {mode:?}: continuous", config.family);
        }
    }
}

#[test]
fn seeded_sampling_is_the_same_whichever_scheduler_runs_it() {
    let mut rng = fresh_rng("seeded_sampling_is_the_same_whichever_scheduler_runs_it");
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, rng.random()).unwrap();
    let seed: u64 = rng.random();
    let sampling = move |i: usize| SamplingParams {
        temperature: 0.8,
        top_p: 0.9,
        seed: seed.wrapping_add(i as u64),
        ..SamplingParams::default()
    };
    let arrivals = workload(&mut rng, &config, &sampling);
    let generator = ReferenceGenerator::new(
        (&config, &weights),
        Backend::Cpu,
        (RunMode::Graph, Precision::F32),
        MAX_SEQ,
    )
    .unwrap();
    let reference = tokens(&mut ReferenceScheduler::new(generator, None), &arrivals);
    for slots in [1, 2, 4] {
        let mut continuous =
            ContinuousBatchScheduler::new(engine(&config, &weights, slots, RunMode::Graph), None);
        assert_eq!(
            tokens(&mut continuous, &arrivals),
            reference,
            "{slots} slots"
        );
    }
}

#[test]
fn stops_and_cancellations_mid_flight_free_slots_for_the_rest() {
    let mut rng = fresh_rng("stops_and_cancellations_mid_flight_free_slots_for_the_rest");
    let config = ModelConfig::tiny_llama();
    let weights = random_weights(&config, rng.random()).unwrap();
    let prompts: Vec<Vec<u32>> = [4, 6, 3, 7]
        .iter()
        .map(|&n| prompt(&mut rng, &config, n))
        .collect();
    let greedy: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| oracle_greedy(&config, &weights, p, 10))
        .collect();
    // Request 0 stops at its third greedy token (the first time it appears).
    let eos = greedy[0][2];
    let stop_at = greedy[0].iter().position(|&t| t == eos).unwrap();
    let mut scheduler =
        ContinuousBatchScheduler::new(engine(&config, &weights, 2, RunMode::Graph), None);
    let ids: Vec<_> = (prompts.iter().enumerate())
        .map(|(i, p)| {
            let eos: &[u32] = if i == 0 { &[eos] } else { &[] };
            scheduler
                .submit(request(p.clone(), 10, eos, SamplingParams::greedy()))
                .unwrap()
        })
        .collect();
    // Two slots: requests 2 and 3 wait. Cancel request 1 after its fourth token.
    let mut steps = 0;
    while !scheduler.is_idle() {
        scheduler.step().unwrap();
        steps += 1;
        let running = scheduler.phase(ids[1]) == Some(Phase::Decoding);
        if running && scheduler.outcome(ids[1]).unwrap().tokens.len() == 4 {
            assert!(scheduler.cancel(ids[1]));
        }
        assert!(steps < 100, "the workload does not finish");
    }
    let outcome = |i: usize| scheduler.outcome(ids[i]).unwrap();
    assert_eq!(outcome(0).tokens, greedy[0][..=stop_at].to_vec());
    assert_eq!(outcome(0).finish_reason, Some(FinishReason::Stop));
    assert_eq!(outcome(1).tokens, greedy[1][..4].to_vec());
    assert_eq!(outcome(1).finish_reason, Some(FinishReason::Cancelled));
    for i in [2, 3] {
        assert_eq!(outcome(i).tokens, greedy[i], "request {i} on a reused slot");
        assert_eq!(outcome(i).finish_reason, Some(FinishReason::Length));
    }
    assert_eq!(
        scheduler.phase(ids[3]),
        Some(Phase::Finished(FinishReason::Length))
    );
    assert!(
        !scheduler.cancel(ids[3]),
        "a finished request cannot be cancelled"
    );
}

#[test]
fn the_engine_reports_one_arena_and_the_pool_by_its_formula() {
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, 7).unwrap();
    let engine = engine(&config, &weights, 3, RunMode::Eager);
    let memory = engine.memory();
    // 3 prefill programs and 2 decode programs.
    assert_eq!(memory.programs, 5);
    assert!(memory.group.arena_bytes < memory.group.arena_sum_bytes);
    let layers = config.num_hidden_layers as u64;
    let per_cache = (3 * config.num_key_value_heads * MAX_SEQ * config.head_dim * 4) as u64;
    assert_eq!(memory.pool_bytes, 2 * layers * per_cache);
}

#[test]
fn default_buckets_are_doublings_up_to_the_limit() {
    let options =
        |slots, max_seq| EngineOptions::new(slots, max_seq, Precision::F32, RunMode::Graph);
    let wide = options(32, 100);
    assert_eq!(wide.decode_batches, [1, 2, 4, 8, 16, 32]);
    assert_eq!(wide.prefill_batches, [1, 2, 4, 8]);
    assert_eq!(wide.prefill_lengths, [16, 32, 64, 100]);
    assert_eq!(options(20, 16).decode_batches, [1, 2, 4, 8, 16, 20]);
    assert_eq!(options(3, 16).decode_batches, [1, 2, 3]);
    assert_eq!(options(3, 16).prefill_lengths, [16]);
}

#[test]
fn bad_requests_are_refused_and_the_others_go_on() {
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, 3).unwrap();
    let mut scheduler =
        ContinuousBatchScheduler::new(engine(&config, &weights, 2, RunMode::Eager), None);
    let good = scheduler
        .submit(request(vec![1, 2, 3], 4, &[], SamplingParams::greedy()))
        .unwrap();
    scheduler.step().unwrap();
    let mut refused = |prompt: Vec<u32>, new: usize| {
        let err = scheduler
            .submit(request(prompt, new, &[], SamplingParams::greedy()))
            .unwrap_err();
        err.to_string()
    };
    assert!(refused(vec![], 4).contains("prompt is empty"));
    let vocab = config.vocab_size as u32;
    let err = refused(vec![1, vocab], 4);
    assert!(err.contains(&format!("prompt token 1 is {vocab}")), "{err}");
    // 10 prompt tokens and 16 new ones need 25 positions of the 24.
    let err = refused(vec![1; 10], 16);
    assert!(err.contains("25 positions") && err.contains("24"), "{err}");
    let err = refused(vec![1; 17], 2);
    assert!(err.contains("17 tokens") && err.contains("16"), "{err}");
    assert!(refused(vec![1], 0).contains("max_new_tokens"));
    // A count that would overflow is refused, not wrapped.
    assert!(refused(vec![1, 2], usize::MAX).contains("more than the 24"));
    while !scheduler.is_idle() {
        scheduler.step().unwrap();
    }
    assert_eq!(
        scheduler.outcome(good).unwrap().tokens,
        oracle_greedy(&config, &weights, &[1, 2, 3], 4)
    );
}

#[test]
fn a_request_with_nan_logits_fails_alone() {
    let mut rng = fresh_rng("a_request_with_nan_logits_fails_alone");
    let config = ModelConfig::tiny();
    let mut weights = random_weights(&config, rng.random()).unwrap();
    let healthy = prompt(&mut rng, &config, 4);
    let want = oracle_greedy(&config, &weights, &healthy, 6);
    // A NaN embedding row of a token the healthy request never sees.
    let poisoned = (0..config.vocab_size as u32)
        .find(|t| !healthy.contains(t) && !want.contains(t))
        .unwrap();
    let mut table = weights.embed_tokens.value().to_vec::<f32>().unwrap();
    let hidden = config.hidden_size;
    table[poisoned as usize * hidden..(poisoned as usize + 1) * hidden].fill(f32::NAN);
    let dims = [config.vocab_size, hidden];
    weights.embed_tokens = Var::constant(kiln_runtime::Tensor::from_vec(table, dims).unwrap());
    for greedy in [true, false] {
        let sampling = match greedy {
            true => SamplingParams::greedy(),
            false => SamplingParams {
                seed: 3,
                ..SamplingParams::default()
            },
        };
        let mut scheduler =
            ContinuousBatchScheduler::new(engine(&config, &weights, 2, RunMode::Graph), None);
        let bad = scheduler
            .submit(request(vec![1, poisoned, 2], 6, &[], sampling.clone()))
            .unwrap();
        let good = scheduler
            .submit(request(healthy.clone(), 6, &[], SamplingParams::greedy()))
            .unwrap();
        while !scheduler.is_idle() {
            scheduler.step().unwrap();
        }
        let failed = scheduler.outcome(bad).unwrap();
        assert_eq!(
            failed.finish_reason,
            Some(FinishReason::Error),
            "greedy {greedy}"
        );
        assert!(failed.error.unwrap().contains("NaN"));
        assert_eq!(
            scheduler.outcome(good).unwrap().tokens,
            want,
            "greedy {greedy}"
        );
    }
}

/// A program whose next run fails while `armed` is set (it disarms itself), standing in for a
/// device that faults.
struct Faulty {
    inner: Box<dyn Executable>,
    armed: std::rc::Rc<std::cell::Cell<bool>>,
}

impl Executable for Faulty {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn set(&mut self, name: &str, tensor: &Tensor) -> kiln_runtime::Result<()> {
        self.inner.set(name, tensor)
    }
    fn zero(&mut self, name: &str) -> kiln_runtime::Result<()> {
        self.inner.zero(name)
    }
    fn run(&mut self, mode: RunMode) -> kiln_runtime::Result<()> {
        match self.armed.replace(false) {
            true => Err(kiln_runtime::Error::Device {
                backend: "test",
                what: "run".to_string(),
                reason: "injected fault".to_string(),
            }),
            false => self.inner.run(mode),
        }
    }
    fn get(&self, name: &str) -> kiln_runtime::Result<Tensor> {
        self.inner.get(name)
    }
}

#[test]
fn a_failed_program_run_fails_its_requests_alone() {
    let mut rng = fresh_rng("a_failed_program_run_fails_its_requests_alone");
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, rng.random()).unwrap();
    let mut engine = engine(&config, &weights, 2, RunMode::Graph);
    let armed = std::rc::Rc::new(std::cell::Cell::new(false));
    engine.executables = (std::mem::take(&mut engine.executables).into_iter())
        .map(|inner| {
            let armed = armed.clone();
            Box::new(Faulty { inner, armed }) as Box<dyn Executable>
        })
        .collect();
    let mut scheduler = ContinuousBatchScheduler::new(engine, None);
    let greedy = |prompt: &[u32]| request(prompt.to_vec(), 6, &[], SamplingParams::greedy());
    let prompts: Vec<Vec<u32>> = [3, 5, 4].map(|n| prompt(&mut rng, &config, n)).into();
    let first = scheduler.submit(greedy(&prompts[0])).unwrap();
    scheduler.step().unwrap();
    // This step prefills the second request (the run that fails) and decodes the first.
    let second = scheduler.submit(greedy(&prompts[1])).unwrap();
    armed.set(true);
    let events = scheduler.step().unwrap();
    let failed = scheduler.outcome(second).unwrap();
    assert_eq!(failed.finish_reason, Some(FinishReason::Error));
    let message = failed.error.unwrap();
    assert!(message.contains("injected fault"), "{message}");
    assert!(events.iter().any(|e| e.id == first && e.token.is_some()));
    // A decode run that fails ends the first request; the third takes a freed slot.
    armed.set(true);
    scheduler.step().unwrap();
    let failed = scheduler.outcome(first).unwrap();
    assert_eq!(failed.finish_reason, Some(FinishReason::Error));
    assert_eq!(failed.tokens.len(), 2);
    assert!(scheduler.running().is_empty());
    let third = scheduler.submit(greedy(&prompts[2])).unwrap();
    while !scheduler.is_idle() {
        scheduler.step().unwrap();
    }
    assert_eq!(
        scheduler.outcome(third).unwrap().tokens,
        oracle_greedy(&config, &weights, &prompts[2], 6)
    );
}

#[test]
fn a_finished_request_is_forgotten_once_its_outcome_is_taken() {
    let mut rng = fresh_rng("a_finished_request_is_forgotten");
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, rng.random()).unwrap();
    let mut scheduler =
        ContinuousBatchScheduler::new(engine(&config, &weights, 2, RunMode::Graph), None);
    let mut greedy = |n| {
        request(
            prompt(&mut rng, &config, 3),
            n,
            &[],
            SamplingParams::greedy(),
        )
    };
    let (short, long) = (greedy(2), greedy(6));
    let want = oracle_greedy(&config, &weights, &long.prompt, 6);
    let short = scheduler.submit(short).unwrap();
    let long = scheduler.submit(long).unwrap();
    scheduler.step().unwrap();
    assert_eq!(scheduler.forget(long), None, "a running request is kept");
    while scheduler.phase(short) != Some(Phase::Finished(FinishReason::Length)) {
        scheduler.step().unwrap();
    }
    let taken = scheduler.forget(short).unwrap();
    assert_eq!(taken.tokens.len(), 2);
    assert_eq!(
        (scheduler.outcome(short), scheduler.phase(short)),
        (None, None)
    );
    assert!(!scheduler.cancel(short));
    assert_eq!(scheduler.forget(short), None);
    let next = scheduler.submit(greedy(3)).unwrap();
    assert!(next > long, "ids are never reused");
    while !scheduler.is_idle() {
        scheduler.step().unwrap();
    }
    assert_eq!(scheduler.forget(long).unwrap().tokens, want);
}

/// Tensor-parallel engines on simulated CPU ranks (threads joined by a `collective::World`):
/// the workload's tokens, greedy and sampled, are the whole engine's on every rank, whether a
/// rank is given the whole model's weights (rank 0: the engine keeps its part) or its part
/// alone (rank 1, as `ModelSource::load_shard` reads it).
#[test]
fn tensor_parallel_ranks_generate_the_whole_engines_tokens() {
    use kiln_runtime::collective::{Communicator, World};
    use std::sync::Arc;
    let mut rng = fresh_rng("tensor_parallel_ranks_generate_the_whole_engines_tokens");
    let config = ModelConfig::tiny();
    // Each rank makes the same weights (the eager leaves stay on their thread).
    let weight_seed: u64 = rng.random();
    let weights = random_weights(&config, weight_seed).unwrap();
    let seed: u64 = rng.random();
    for temperature in [0.0, 0.8] {
        let sampling = move |i: usize| SamplingParams {
            temperature,
            seed: seed.wrapping_add(i as u64),
            ..SamplingParams::default()
        };
        let arrivals = workload(&mut rng, &config, &sampling);
        let mut whole =
            ContinuousBatchScheduler::new(engine(&config, &weights, 3, RunMode::Graph), None);
        let want = tokens(&mut whole, &arrivals);
        let ranks = World::ranks(2).unwrap();
        let got: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (ranks.into_iter().enumerate())
                .map(|(rank, world)| {
                    let (config, arrivals) = (&config, &arrivals);
                    s.spawn(move || {
                        let whole_weights = random_weights(config, weight_seed).unwrap();
                        let weights = &match rank {
                            0 => whole_weights,
                            _ => shard_weights(config, &whole_weights, 2, rank).unwrap(),
                        };
                        let world: Arc<dyn Communicator> = Arc::new(world);
                        let whole = options(3, RunMode::Graph);
                        let shard = EngineOptions {
                            tensor_parallel: Some((rank, 2)),
                            ..whole.clone()
                        };
                        let mut engine =
                            Engine::new((config, weights), &Backend::Cpu, shard).unwrap();
                        // Half the heads of the whole pool.
                        assert_eq!(engine.memory().pool_bytes * 2, pool_bytes(config, &whole));
                        engine.join(&world).unwrap();
                        tokens(&mut ContinuousBatchScheduler::new(engine, None), arrivals)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, tokens) in got.iter().enumerate() {
            assert_eq!(tokens, &want, "temperature {temperature}, rank {rank}");
        }
    }
}
