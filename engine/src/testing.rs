//! Random inputs for tests: a fresh seed each run, printed so a failure can be replayed with
//! `KILN_TEST_SEED=<seed>`.

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
