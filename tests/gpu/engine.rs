//! 4. The schedulers: continuous and length-bucketed batching over engines on the CPU and,
//!    where one can be used, on the GPU (eager and replayed) give every request the greedy
//!    tokens of the serial reference on the CPU — both tiny families, mixed prompt lengths,
//!    arrivals mid-flight, an end-of-sequence stop, a cancellation mid-flight and slots
//!    reused.

use kiln_engine::engine::{Engine, EngineOptions};
use kiln_engine::generate::ReferenceGenerator;
use kiln_engine::sampling::SamplingParams;
use kiln_engine::scheduler::bucketed::LengthBucketedBatchScheduler;
use kiln_engine::scheduler::continuous::ContinuousBatchScheduler;
use kiln_engine::scheduler::reference::ReferenceScheduler;
use kiln_engine::scheduler::{Request, RequestId, Scheduler};
use kiln_engine::stop::{FinishReason, StopCriteria};
use kiln_frontend::model::{random_weights, ModelConfig, Precision};
use kiln_kernels::testing;
use kiln_runtime::{Backend, RunMode};

use super::device;

/// (prompt length, new tokens, arrival step) of each request.
const SHAPES: [(usize, usize, usize); 7] = [
    (5, 7, 0),
    (3, 9, 0),
    (5, 4, 0),
    (11, 6, 2),
    (1, 8, 3),
    (8, 5, 3),
    (2, 3, 9),
];

fn request(prompt: Vec<u32>, max_new_tokens: usize, eos: Vec<u32>) -> Request {
    Request {
        prompt,
        sampling: SamplingParams::greedy(),
        stop: StopCriteria {
            eos_token_ids: eos,
            stop_strings: Vec::new(),
            max_new_tokens,
        },
    }
}

/// Runs `requests` (with their arrival steps) through `scheduler`; request `cancel` is
/// cancelled once it has 3 tokens. Returns each request's tokens and finish reason.
fn run(
    scheduler: &mut dyn Scheduler,
    requests: &[(usize, Request)],
    cancel: usize,
) -> Vec<(Vec<u32>, Option<FinishReason>)> {
    let mut ids: Vec<Option<RequestId>> = vec![None; requests.len()];
    let (mut step, mut cancelled) = (0, false);
    while ids.iter().any(Option::is_none) || !scheduler.is_idle() {
        for (i, (arrival, request)) in requests.iter().enumerate() {
            if *arrival == step {
                ids[i] = Some(scheduler.submit(request.clone()).unwrap());
            }
        }
        scheduler.step().unwrap();
        step += 1;
        if let Some(id) = ids[cancel] {
            if !cancelled && scheduler.outcome(id).unwrap().tokens.len() == 3 {
                cancelled = scheduler.cancel(id);
            }
        }
        assert!(step < 500, "the workload does not finish");
    }
    (ids.iter())
        .map(|id| {
            let outcome = scheduler.outcome(id.unwrap()).unwrap();
            (outcome.tokens, outcome.finish_reason)
        })
        .collect()
}

#[test]
fn batching_schedulers_give_the_references_greedy_tokens() {
    let mut backends = vec![Backend::Cpu];
    backends.extend(device().map(Backend::Cuda));
    let mut rng = testing::rng("continuous_batching_on_the_gpu");
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let mut requests: Vec<(usize, Request)> = (SHAPES.iter())
            .map(|&(length, new, arrival)| {
                let prompt = testing::indices(&mut rng, length, config.vocab_size);
                let prompt = prompt.into_iter().map(|t| t as u32).collect();
                (arrival, request(prompt, new, Vec::new()))
            })
            .collect();
        // Request 1 stops at its fourth greedy token, found by a first reference run.
        let generator = |mode| {
            let model = (&config, &weights);
            ReferenceGenerator::new(model, Backend::Cpu, (mode, Precision::F32), 24).unwrap()
        };
        let mut probe = ReferenceScheduler::new(generator(RunMode::Eager), None);
        let greedy = run(&mut probe, &requests, 0);
        requests[1].1.stop.eos_token_ids = vec![greedy[1].0[3]];
        let want = run(
            &mut ReferenceScheduler::new(generator(RunMode::Graph), None),
            &requests,
            5,
        );
        assert_eq!(want[1].1, Some(FinishReason::Stop));
        assert_eq!(want[5].1, Some(FinishReason::Cancelled));
        for (backend, mode) in backends
            .iter()
            .flat_map(|b| [(b, RunMode::Eager), (b, RunMode::Graph)])
        {
            let options = EngineOptions {
                prefill_lengths: vec![4, 8, 16],
                ..EngineOptions::new(3, 24, Precision::F32, mode)
            };
            let engine = Engine::new((&config, &weights), backend, options).unwrap();
            let mut continuous = ContinuousBatchScheduler::new(engine, None);
            let got = run(&mut continuous, &requests, 5);
            let on = backend.workspaces();
            assert_eq!(got, want, "{:?} {on:?} {mode:?}", config.family);
            // Two pools, 2 slots of 16 positions and 2 of 24: the long requests take the latter.
            let pools = [(2, 16), (2, 24)].map(|(slots, positions)| EngineOptions {
                prefill_lengths: vec![4, 8, 16],
                ..EngineOptions::new(slots, positions, Precision::F32, mode)
            });
            let engines = Engine::group((&config, &weights), backend, pools.to_vec()).unwrap();
            let mut bucketed = LengthBucketedBatchScheduler::new(engines, None, true);
            let got = run(&mut bucketed, &requests, 5);
            assert_eq!(got, want, "{:?} {on:?} {mode:?} bucketed", config.family);
        }
        println!(
            "{:?}: 7 requests, continuous and bucketed on {} backend(s) = reference on the CPU",
            config.family,
            backends.len()
        );
    }
}
