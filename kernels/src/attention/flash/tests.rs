//! The FlashAttention contract against the probabilities-keeping kernels run on the bf16 (or
//! f16) roundings of the same inputs, which differ only by the roundings of P (and dS) where
//! they enter products: within bf16's step, 2^-8 (f16's, 2^-11). The backward rebuilds P from
//! `lse` and takes Δ from `out`.

use half::{bf16, f16};

use super::super::tests::{case, view, view_mut, Case};
use super::super::{attention, attention_backward};
use super::*;
use crate::testing::{self, rel_l2};

/// GQA ratios 1 and > 1, T == S and T < S, T = 1, odd sizes, head dims 64 and 128.
/// Several key tiles (64 keys, 32 past head dim 64) in the last two.
const CASES: [Case; 9] = [
    case(2, 3, 3, 7, 7, 5),
    case(2, 6, 2, 7, 7, 16),
    case(1, 4, 1, 3, 9, 8),
    case(1, 2, 2, 1, 1, 3),
    case(1, 4, 2, 1, 6, 64),
    case(1, 2, 1, 33, 33, 64),
    case(1, 2, 2, 19, 21, 128),
    case(1, 2, 1, 150, 150, 64),
    case(1, 2, 2, 70, 100, 72),
];

fn round(values: &[f32]) -> Vec<f32> {
    round_to(DType::BF16, values)
}

fn round_to(rounding: DType, values: &[f32]) -> Vec<f32> {
    match rounding {
        DType::F16 => values.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
        DType::BF16 => values.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
        _ => values.to_vec(),
    }
}

fn draw(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<f32> {
    testing::to_f32(&testing::uniform(rng, len, -2.0, 2.0))
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| x as f64).collect()
}

struct Problem {
    c: Case,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    grad_out: Vec<f32>,
}

impl Problem {
    fn new(rng: &mut rand::rngs::StdRng, c: Case) -> Problem {
        Problem {
            c,
            q: draw(rng, c.q_len()),
            k: draw(rng, c.kv_len()),
            v: draw(rng, c.kv_len()),
            grad_out: draw(rng, c.q_len()),
        }
    }
    fn q_shape(&self) -> [usize; 4] {
        [self.c.b, self.c.hq, self.c.t, self.c.d]
    }
    fn kv_shape(&self) -> [usize; 4] {
        [self.c.b, self.c.hkv, self.c.s, self.c.d]
    }
    fn bthd(&self) -> [usize; 4] {
        [self.c.b, self.c.t, self.c.hq, self.c.d]
    }
    fn scale(&self) -> f64 {
        1.0 / (self.c.d as f64).sqrt()
    }

    /// `(out, lse)` of the bf16 [`flash_attention`].
    fn flash(&self) -> (Vec<f32>, Vec<f32>) {
        self.flash_to(DType::BF16)
    }

    /// `(out, lse)` of [`flash_attention`] rounding to `rounding`.
    fn flash_to(&self, rounding: DType) -> (Vec<f32>, Vec<f32>) {
        let mut out = vec![f32::NAN; self.c.q_len()];
        let mut lse = vec![f32::NAN; self.c.b * self.c.hq * self.c.t];
        let lse_shape = [self.c.b, self.c.hq, self.c.t];
        flash_attention(
            &view(&self.q, &self.q_shape()),
            &view(&self.k, &self.kv_shape()),
            &view(&self.v, &self.kv_shape()),
            (self.scale(), rounding),
            &mut view_mut(&mut out, &self.bthd()),
            &mut view_mut(&mut lse, &lse_shape),
        )
        .unwrap();
        (out, lse)
    }

    /// `(out, probs)` of [`attention`] on the bf16-rounded inputs.
    fn reference(&self) -> (Vec<f32>, Vec<f32>) {
        self.reference_to(DType::BF16)
    }

    /// `(out, probs)` of [`attention`] on the inputs rounded to `rounding`.
    fn reference_to(&self, rounding: DType) -> (Vec<f32>, Vec<f32>) {
        let mut out = vec![f32::NAN; self.c.q_len()];
        let mut probs = vec![f32::NAN; self.c.probs_len()];
        let probs_shape = [self.c.b, self.c.hq, self.c.t, self.c.s];
        attention(
            &view(&round_to(rounding, &self.q), &self.q_shape()),
            &view(&round_to(rounding, &self.k), &self.kv_shape()),
            &view(&round_to(rounding, &self.v), &self.kv_shape()),
            self.scale(),
            &mut view_mut(&mut probs, &probs_shape),
            &mut view_mut(&mut out, &self.bthd()),
        )
        .unwrap();
        (out, probs)
    }
}

#[test]
fn the_forward_is_attention_of_the_rounded_inputs_and_keeps_the_log_sum_exp() {
    let mut rng = testing::rng("flash_forward");
    // Only the rounding of the probabilities in P·V differs: bf16's unit roundoff 2^-8 bounds
    // it, f16's 2^-11 (half of that measured at most).
    for (rounding, bound) in [(DType::BF16, 4e-3), (DType::F16, 5e-4)] {
        for c in CASES {
            forward_case(&Problem::new(&mut rng, c), rounding, bound);
        }
    }
}

fn forward_case(problem: &Problem, rounding: DType, bound: f64) {
    let c = problem.c;
    let (out, lse) = problem.flash_to(rounding);
    let (want, probs) = problem.reference_to(rounding);
    let error = rel_l2(&widen(&out), &widen(&want));
    assert!(error <= bound, "{c:?} {rounding}: relative error {error:e}");
    // exp(score − lse) is the probability: rebuild row t's first key's from the scores.
    let (q, k) = (
        round_to(rounding, &problem.q),
        round_to(rounding, &problem.k),
    );
    let d = c.d;
    for (row, &row_lse) in lse.iter().enumerate() {
        let (bh, t) = (row / c.t, row % c.t);
        let (b, h) = (bh / c.hq, bh % c.hq);
        let kv = (b * c.hkv + h / (c.hq / c.hkv)) * c.s;
        let score: f32 =
            (0..d).map(|j| q[row * d + j] * k[kv * d + j]).sum::<f32>() * problem.scale() as f32;
        let p = (score - row_lse).exp();
        let want = probs[row * c.s];
        assert!(
            (p - want).abs() <= 1e-5 * want.max(1e-3),
            "{c:?} {rounding} row {row} t {t}"
        );
    }
}

/// The f16 rounding keeps three more bits of the scores than bf16's: on inputs whose scores
/// are large (the regime of a model's biased keys), its output is nearer exact f32
/// attention's. An f32 operand beyond f16's range rounds to an infinity, as on the device: a
/// value's makes every row that sees its key non-finite there (infinite, or NaN where the
/// key's probability rounds to 0).
#[test]
fn the_f16_rounding_is_nearer_f32_attention_and_overflows_past_its_range() {
    let mut rng = testing::rng("flash_f16");
    let c = case(1, 4, 2, 40, 40, 64);
    let mut problem = Problem::new(&mut rng, c);
    problem.k.iter_mut().for_each(|x| *x *= 8.0);
    let (exact, _) = problem.reference_to(DType::F32);
    let error = |rounding| rel_l2(&widen(&problem.flash_to(rounding).0), &widen(&exact));
    let (bf16_error, f16_error) = (error(DType::BF16), error(DType::F16));
    assert!(
        f16_error * 4.0 < bf16_error,
        "f16 {f16_error:e} against bf16 {bf16_error:e}"
    );

    // Element 0 of key 0's value in kv head 0, which every row of query heads 0 and 1 sees.
    problem.v[0] = 70000.0;
    let (out, lse) = problem.flash_to(DType::F16);
    for (i, x) in out.iter().enumerate() {
        let (head, d) = ((i / c.d) % c.hq, i % c.d);
        assert_eq!(!x.is_finite(), head < 2 && d == 0, "out[{i}] = {x}");
    }
    assert!(lse.iter().all(|x| x.is_finite()));
}

#[test]
fn the_backward_equals_attention_backward_of_the_rounded_inputs() {
    let mut rng = testing::rng("flash_backward");
    for c in CASES {
        let problem = Problem::new(&mut rng, c);
        let (out, lse) = problem.flash();
        let (_, probs) = problem.reference();
        let lse_shape = [c.b, c.hq, c.t];
        let mut got = [c.q_len(), c.kv_len(), c.kv_len()].map(|n| vec![f32::NAN; n]);
        let [gq, gk, gv] = &mut got;
        flash_attention_backward(
            &view(&problem.q, &problem.q_shape()),
            &view(&problem.k, &problem.kv_shape()),
            &view(&problem.v, &problem.kv_shape()),
            &view(&out, &problem.bthd()),
            &view(&lse, &lse_shape),
            &view(&problem.grad_out, &problem.bthd()),
            problem.scale(),
            [
                &mut view_mut(gq, &problem.q_shape()),
                &mut view_mut(gk, &problem.kv_shape()),
                &mut view_mut(gv, &problem.kv_shape()),
            ],
        )
        .unwrap();

        let mut want = [c.q_len(), c.kv_len(), c.kv_len()].map(|n| vec![f32::NAN; n]);
        let mut workspace = vec![f32::NAN; c.s];
        let [wq, wk, wv] = &mut want;
        attention_backward(
            &view(&round(&problem.q), &problem.q_shape()),
            &view(&round(&problem.k), &problem.kv_shape()),
            &view(&round(&problem.v), &problem.kv_shape()),
            &view(&probs, &[c.b, c.hq, c.t, c.s]),
            &view(&round(&problem.grad_out), &problem.bthd()),
            problem.scale(),
            &mut view_mut(wq, &problem.q_shape()),
            &mut view_mut(wk, &problem.kv_shape()),
            &mut view_mut(wv, &problem.kv_shape()),
            &mut view_mut(&mut workspace, &[c.s]),
        )
        .unwrap();
        // Only the bf16 roundings of P and dS differ, each within bf16's unit roundoff 2^-8 of
        // its term. A gradient that sums a few keys' terms of both signs (S = 6 to 9 here)
        // loses relative accuracy to the cancellation: 1500 seeds gave up to 4.6e-3, past one
        // unit roundoff in 2 of 13500 sums, so the bound is two.
        let names = ["grad_q", "grad_k", "grad_v"];
        for (name, (got, want)) in names.iter().zip(got.iter().zip(&want)) {
            let error = rel_l2(&widen(got), &widen(want));
            assert!(
                error <= 2.0 * 2f64.powi(-8),
                "{c:?} {name}: relative error {error:e}"
            );
        }
    }
}

#[test]
fn operands_other_than_f32_and_wrong_shapes_are_refused() {
    let c = case(1, 2, 1, 3, 3, 4);
    let q64 = vec![0.5f64; c.q_len()];
    let kv64 = vec![0.5f64; c.kv_len()];
    let mut out = vec![0.0f32; c.q_len()];
    let mut lse = vec![0.0f32; 6];
    let error = flash_attention(
        &view(&q64, &[1, 2, 3, 4]),
        &view(&kv64, &[1, 1, 3, 4]),
        &view(&kv64, &[1, 1, 3, 4]),
        (0.5, DType::BF16),
        &mut view_mut(&mut out, &[1, 3, 2, 4]),
        &mut view_mut(&mut lse, &[1, 2, 3]),
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            Error::DType {
                operand: "q",
                expected: DType::F32,
                ..
            }
        ),
        "{error}"
    );

    let q = vec![0.5f32; c.q_len()];
    let kv = vec![0.5f32; c.kv_len()];
    let mut short = vec![0.0f32; 5];
    let error = flash_attention(
        &view(&q, &[1, 2, 3, 4]),
        &view(&kv, &[1, 1, 3, 4]),
        &view(&kv, &[1, 1, 3, 4]),
        (0.5, DType::BF16),
        &mut view_mut(&mut out, &[1, 3, 2, 4]),
        &mut view_mut(&mut short, &[1, 5]),
    )
    .unwrap_err();
    assert!(error.to_string().contains("lse"), "{error}");

    let mut lse = vec![0.0f32; 6];
    let error = flash_attention(
        &view(&q, &[1, 2, 3, 4]),
        &view(&kv, &[1, 1, 3, 4]),
        &view(&kv, &[1, 1, 3, 4]),
        (0.5, DType::F32),
        &mut view_mut(&mut out, &[1, 3, 2, 4]),
        &mut view_mut(&mut lse, &[1, 2, 3]),
    )
    .unwrap_err();
    assert!(error.to_string().contains("bf16 or f16"), "{error}");
}
