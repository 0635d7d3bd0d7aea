//! Random inputs for tests: a fresh seed each run, printed so a failure can be replayed with
//! `KILN_TEST_SEED=<seed>`.

use kiln_frontend::model::{forward, Eager, ModelConfig, ModelWeights};
use kiln_frontend::Var;
use kiln_runtime::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A generator for `test`'s inputs, seeded from `KILN_TEST_SEED` or else afresh.
pub(crate) fn fresh_rng(test: &str) -> ChaCha8Rng {
    let seed = std::env::var("KILN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("{test}: input seed {seed} (replay with KILN_TEST_SEED={seed})");
    ChaCha8Rng::seed_from_u64(seed)
}

/// `len` logits drawn uniformly from `[-spread, spread)`.
pub(crate) fn random_logits(rng: &mut ChaCha8Rng, len: usize, spread: f32) -> Vec<f32> {
    (0..len)
        .map(|_| rng.random_range(-spread..spread))
        .collect()
}

/// Greedy continuation of `prompt` by the eager oracle: the whole sequence through the full
/// forward at every step, the last position's argmax (ties to the lowest id).
pub(crate) fn oracle_greedy(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    prompt: &[u32],
    n: usize,
) -> Vec<u32> {
    let mut sequence: Vec<i64> = prompt.iter().map(|&t| i64::from(t)).collect();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = sequence.len();
        let tokens = Var::constant(Tensor::from_vec(sequence.clone(), [1, t]).unwrap());
        let positions = Var::constant(Tensor::from_vec((0..t as i64).collect(), [1, t]).unwrap());
        let logits = forward(&Eager::F32, config, weights, &tokens, &positions).unwrap();
        let all = logits.value().to_vec::<f32>().unwrap();
        let last = &all[(t - 1) * config.vocab_size..];
        let mut best = 0;
        for (id, &v) in last.iter().enumerate() {
            if v > last[best] {
                best = id;
            }
        }
        out.push(best as u32);
        sequence.push(best as i64);
    }
    out
}
