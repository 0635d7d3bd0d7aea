//! The serve workload of `kiln bench --program serve` on the CPU with the tiny preset: the
//! reference, continuous and length-bucketed schedulers finish every request with the same
//! greedy tokens, and the report adds up.

use kiln::commands::{bench_serve, serve_table, ServeArgs};
use kiln_frontend::model::Precision;
use kiln_runtime::{Backend, RunMode};

#[test]
fn the_serve_workload_gives_both_schedulers_the_same_tokens() {
    let args = ServeArgs {
        model: "tiny".to_string(),
        seed: 5,
        requests: 6,
        prompt_len: 9,
        new_tokens: 5,
        arrival_every: 1,
        slots: 4,
        buckets: vec![(2, 10), (2, 16)],
        precision: Precision::F32,
        mode: RunMode::Graph,
        backend: Backend::Cpu,
    };
    let result = bench_serve(&args).unwrap();
    assert_eq!(result.same_tokens, 6);
    for figures in [&result.reference, &result.continuous] {
        assert_eq!(figures.generated_tokens, 6 * 5, "{}", figures.scheduler);
        let first = figures.first_token_s.unwrap();
        assert!(first.p95 >= first.p50 && first.p50 > 0.0);
    }
    // Serial: a prefill step and four decode steps per request; batched: fewer.
    assert_eq!(result.reference.steps, 6 * 5);
    assert!(result.continuous.steps < result.reference.steps);
    assert!(result.arena_bytes < result.arena_sum_bytes);
    let (bucketed, same) = result.bucketed.as_ref().unwrap();
    assert_eq!((bucketed.generated_tokens, *same), (6 * 5, 6));
    let table = serve_table(&result);
    assert!(table.contains("same tokens for 6 of 6 requests"), "{table}");
}
