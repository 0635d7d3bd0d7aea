//! The length-bucketed scheduler on the CPU: greedy and seeded sampled tokens equal the serial
//! reference's, each request lands in the smallest bucket that holds it (or, opted in, the
//! first larger one with room), never in one too small, and stays there.

use kiln_frontend::model::{random_weights, ModelConfig, Precision};
use kiln_runtime::{Backend, RunMode};
use rand::Rng;

use super::*;
use crate::engine::EngineOptions;
use crate::generate::ReferenceGenerator;
use crate::sampling::SamplingParams;
use crate::scheduler::metrics::run_workload;
use crate::scheduler::metrics::Arrival;
use crate::scheduler::reference::ReferenceScheduler;
use crate::stop::StopCriteria;
use crate::testing::fresh_rng;

/// Two buckets of two slots: 12 positions and 24.
fn buckets(config: &ModelConfig, seed: u64, spill: bool) -> LengthBucketedBatchScheduler<'static> {
    let weights = random_weights(config, seed).unwrap();
    let options = |max_seq| EngineOptions {
        prefill_lengths: vec![4, 8],
        prefill_batches: vec![1, 2],
        decode_batches: vec![1, 2],
        ..EngineOptions::new(2, max_seq, Precision::F32, RunMode::Graph)
    };
    let engines = Engine::group(
        (config, &weights),
        &Backend::Cpu,
        vec![options(24), options(12)],
    );
    LengthBucketedBatchScheduler::new(engines.unwrap(), None, spill)
}

fn request(prompt: Vec<u32>, max_new_tokens: usize) -> Request {
    Request {
        prompt,
        sampling: SamplingParams::greedy(),
        stop: StopCriteria {
            eos_token_ids: Vec::new(),
            stop_strings: Vec::new(),
            max_new_tokens,
        },
    }
}

#[test]
fn bucketed_tokens_equal_the_reference_and_requests_take_the_smallest_bucket() {
    let mut rng = fresh_rng("bucketed_greedy_equals_the_reference");
    let config = ModelConfig::tiny();
    let seed = rng.random();
    // (prompt, new tokens, arrival): 12 positions hold 5 + 8 - 1, not 7 + 10 - 1.
    let shapes = [
        (5, 8, 0),
        (7, 10, 0),
        (3, 4, 1),
        (8, 14, 1),
        (2, 9, 2),
        (6, 6, 4),
    ];
    let weights = random_weights(&config, seed).unwrap();
    let sampling_seed: u64 = rng.random();
    // Greedy, then seeded sampling: each request's own draws whichever scheduler runs it.
    for sampled in [false, true] {
        let arrivals: Vec<Arrival> = (shapes.iter().enumerate())
            .map(|(i, &(length, new, step))| {
                let mut request =
                    request((0..length).map(|_| rng.random_range(0..97)).collect(), new);
                if sampled {
                    request.sampling = SamplingParams {
                        temperature: 0.9,
                        top_k: 20,
                        seed: sampling_seed.wrapping_add(i as u64),
                        ..SamplingParams::default()
                    };
                }
                Arrival { step, request }
            })
            .collect();
        let generator = ReferenceGenerator::new(
            (&config, &weights),
            Backend::Cpu,
            (RunMode::Graph, Precision::F32),
            24,
        )
        .unwrap();
        let mut reference = ReferenceScheduler::new(generator, None);
        let reference = run_workload(&mut reference, &arrivals, |_| {}).unwrap();
        let mut scheduler = buckets(&config, seed, false);
        assert_eq!(scheduler.buckets(), [(2, 12), (2, 24)]);
        let bucketed = run_workload(&mut scheduler, &arrivals, |_| {}).unwrap();
        let tokens = |report: &crate::scheduler::metrics::WorkloadReport| -> Vec<Vec<u32>> {
            report.outcomes.iter().map(|o| o.tokens.clone()).collect()
        };
        assert_eq!(tokens(&bucketed), tokens(&reference), "sampled {sampled}");
        let routed: Vec<usize> = (0..shapes.len())
            .map(|i| scheduler.bucket_of(RequestId(i)).unwrap())
            .collect();
        assert_eq!(routed, [0, 1, 0, 1, 0, 0]);
    }
}

#[test]
fn spilling_is_opt_in_and_never_shrinks_a_request() {
    let config = ModelConfig::tiny();
    for spill in [false, true] {
        let mut scheduler = buckets(&config, 11, spill);
        // Three short requests: the small bucket's two slots, then a third.
        let ids: Vec<RequestId> = (0..3)
            .map(|i| scheduler.submit(request(vec![1, 2, i], 4)).unwrap())
            .collect();
        let routed: Vec<usize> = ids
            .iter()
            .map(|&id| scheduler.bucket_of(id).unwrap())
            .collect();
        assert_eq!(
            routed,
            if spill { [0, 0, 1] } else { [0, 0, 0] },
            "spill {spill}"
        );
        // A long request goes to the long bucket whatever is free.
        let long = scheduler.submit(request(vec![5; 8], 12)).unwrap();
        assert_eq!(scheduler.bucket_of(long), Some(1));
        while !scheduler.is_idle() {
            scheduler.step().unwrap();
        }
        for id in ids.into_iter().chain([long]) {
            assert!(matches!(scheduler.phase(id), Some(Phase::Finished(_))));
        }
        let err = scheduler
            .submit(request(vec![5; 8], 20))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fit no bucket") && err.contains("24 positions"),
            "{err}"
        );
    }
}
