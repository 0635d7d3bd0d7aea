//! Test support shared by kiln's crates (feature `testing`): fresh random inputs with a printed
//! seed, finite differences and closeness checks.
//!
//! Every run draws a fresh seed unless `KILN_TEST_SEED` is set; the seed is printed, so a
//! failing run can be replayed exactly with `KILN_TEST_SEED=<seed>`.
//!
//! GPU tests skip where no GPU can be used, saying why ([`skip_without_gpu`]); on the GPU
//! machine `KILN_REQUIRE_GPU=1` turns every such skip into a failure, so a device run can never
//! pass by skipping.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A random generator seeded freshly (or from `KILN_TEST_SEED`); prints the seed.
pub fn rng(test: &str) -> StdRng {
    let seed = match std::env::var("KILN_TEST_SEED") {
        Ok(s) => s
            .parse()
            .unwrap_or_else(|_| panic!("KILN_TEST_SEED={s} is not a u64")),
        Err(_) => rand::rng().random(),
    };
    eprintln!("{test}: KILN_TEST_SEED={seed}");
    StdRng::seed_from_u64(seed)
}

/// Whether `KILN_REQUIRE_GPU=1`: GPU tests must run, not skip.
pub fn gpu_required() -> bool {
    std::env::var("KILN_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// Skips a GPU test because no GPU can be used (`reason`): prints `SKIPPED: <what>: <reason>`,
/// or fails the test when [`gpu_required`].
pub fn skip_without_gpu(what: &str, reason: &str) {
    assert!(
        !gpu_required(),
        "KILN_REQUIRE_GPU=1 but {what} cannot run: {reason}"
    );
    println!("SKIPPED: {what}: {reason}");
}

/// `len` values uniform in `[lo, hi)`.
pub fn uniform(rng: &mut StdRng, len: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..len).map(|_| rng.random_range(lo..hi)).collect()
}

/// `len` values uniform in `[-1, 1)`.
pub fn signed(rng: &mut StdRng, len: usize) -> Vec<f64> {
    uniform(rng, len, -1.0, 1.0)
}

/// `len` integers uniform in `0..bound`.
pub fn indices(rng: &mut StdRng, len: usize, bound: usize) -> Vec<i64> {
    (0..len)
        .map(|_| rng.random_range(0..bound as i64))
        .collect()
}

/// Converts f64 values to f32.
pub fn to_f32(values: &[f64]) -> Vec<f32> {
    values.iter().map(|&v| v as f32).collect()
}

/// Central finite differences of a scalar function: `∂f/∂x_i ≈ (f(x + h e_i) − f(x − h e_i)) / 2h`.
pub fn central_difference(mut f: impl FnMut(&[f64]) -> f64, x: &[f64], h: f64) -> Vec<f64> {
    let mut probe = x.to_vec();
    (0..x.len())
        .map(|i| {
            probe[i] = x[i] + h;
            let plus = f(&probe);
            probe[i] = x[i] - h;
            let minus = f(&probe);
            probe[i] = x[i];
            (plus - minus) / (2.0 * h)
        })
        .collect()
}

/// `Σ a_i · b_i`: turns a tensor function into the scalar whose gradient a VJP computes.
pub fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "dot of different lengths");
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Relative L2 error `‖got − want‖ / max(‖want‖, tiny)`.
pub fn rel_l2(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "rel_l2 of different lengths");
    let diff: f64 = got.iter().zip(want).map(|(g, w)| (g - w) * (g - w)).sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    diff.sqrt() / norm.sqrt().max(1e-300)
}

/// Asserts `|got_i − want_i| <= atol + rtol·|want_i|` for every element, naming the first
/// element that is off.
#[track_caller]
pub fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g - w).abs() <= atol + rtol * w.abs();
        assert!(
            ok,
            "{what}: element {i}: got {g}, want {w} (rtol {rtol}, atol {atol})"
        );
    }
}
