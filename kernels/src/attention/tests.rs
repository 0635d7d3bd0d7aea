//! Tests of the causal GQA kernels against an independent naive f64 computation and against
//! central differences.

use super::*;
use crate::element::Element;
use crate::testing::{self, assert_close, central_difference, rel_l2};
use rand::rngs::StdRng;

/// One problem size: batch, query heads, kv heads, query rows, keys, head dim.
#[derive(Clone, Copy, Debug)]
pub(super) struct Case {
    pub(super) b: usize,
    pub(super) hq: usize,
    pub(super) hkv: usize,
    pub(super) t: usize,
    pub(super) s: usize,
    pub(super) d: usize,
}

pub(super) const fn case(b: usize, hq: usize, hkv: usize, t: usize, s: usize, d: usize) -> Case {
    Case {
        b,
        hq,
        hkv,
        t,
        s,
        d,
    }
}

impl Case {
    pub(super) fn q_len(&self) -> usize {
        self.b * self.hq * self.t * self.d
    }
    pub(super) fn kv_len(&self) -> usize {
        self.b * self.hkv * self.s * self.d
    }
    pub(super) fn probs_len(&self) -> usize {
        self.b * self.hq * self.t * self.s
    }
    fn scale(&self) -> f64 {
        // Not 1/sqrt(d) exactly for d = 0; any positive scale exercises the math.
        1.0 / (self.d.max(1) as f64).sqrt()
    }
}

/// MHA, GQA and MQA; T == S and T < S; odd sizes; empty query blocks; D = 0.
const CASES: [Case; 9] = [
    case(2, 3, 3, 7, 7, 5),
    case(2, 6, 2, 7, 7, 5),
    case(1, 4, 1, 3, 9, 8),
    case(2, 6, 2, 5, 11, 3),
    case(1, 2, 2, 1, 1, 1),
    case(1, 4, 2, 9, 10, 12),
    case(2, 4, 2, 0, 0, 5),
    case(2, 4, 1, 0, 3, 5),
    case(1, 2, 1, 3, 4, 0),
];

pub(super) fn view<'a, T: Element>(data: &'a [T], shape: &[usize]) -> TensorView<'a> {
    TensorView::contiguous(data, shape).unwrap()
}

pub(super) fn view_mut<'a, T: Element>(data: &'a mut [T], shape: &[usize]) -> TensorViewMut<'a> {
    TensorViewMut::contiguous(data, shape).unwrap()
}

fn cast<T: Real>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&x| T::of(x)).collect()
}

fn widen<T: Real>(values: &[T]) -> Vec<f64> {
    values.iter().map(|&x| Element::to_f64(x)).collect()
}

struct Inputs {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

fn random_inputs(rng: &mut StdRng, c: Case) -> Inputs {
    // Spread of ±2 makes the softmax rows uneven, not nearly uniform.
    let mut draw = |len| testing::uniform(rng, len, -2.0, 2.0);
    Inputs {
        q: draw(c.q_len()),
        k: draw(c.kv_len()),
        v: draw(c.kv_len()),
    }
}

/// Hugging Face's eager attention written out plainly: repeat_kv, the full `[T,S]` score
/// matrix with a −∞ causal mask, softmax, `P·V`, transpose to BTHD. Returns (out, probs).
fn naive_attention(c: Case, x: &Inputs, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let Case {
        b,
        hq,
        hkv,
        t,
        s,
        d,
    } = c;
    let group = hq / hkv;
    let at = |data: &[f64], heads: usize, len: usize, bi, h, i, j| {
        data[((bi * heads + h) * len + i) * d + j]
    };
    let mut k_rep = vec![0.0; b * hq * s * d];
    let mut v_rep = vec![0.0; b * hq * s * d];
    for bi in 0..b {
        for h in 0..hq {
            for si in 0..s {
                for j in 0..d {
                    let dst = ((bi * hq + h) * s + si) * d + j;
                    k_rep[dst] = at(&x.k, hkv, s, bi, h / group, si, j);
                    v_rep[dst] = at(&x.v, hkv, s, bi, h / group, si, j);
                }
            }
        }
    }
    let mut probs = vec![0.0; b * hq * t * s];
    let mut out = vec![0.0; b * t * hq * d];
    for bi in 0..b {
        for h in 0..hq {
            for ti in 0..t {
                let mut scores = vec![0.0; s];
                for (si, score) in scores.iter_mut().enumerate() {
                    let qk: f64 = (0..d)
                        .map(|j| at(&x.q, hq, t, bi, h, ti, j) * at(&k_rep, hq, s, bi, h, si, j))
                        .sum();
                    let mask = if si > s - t + ti {
                        f64::NEG_INFINITY
                    } else {
                        0.0
                    };
                    *score = qk * scale + mask;
                }
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for si in 0..s {
                    let p = exps[si] / total;
                    probs[((bi * hq + h) * t + ti) * s + si] = p;
                    for j in 0..d {
                        out[((bi * t + ti) * hq + h) * d + j] +=
                            p * at(&v_rep, hq, s, bi, h, si, j);
                    }
                }
            }
        }
    }
    (out, probs)
}

/// Runs the forward kernel in `T` on `x` rounded to `T`; returns (out, probs) widened to f64.
/// The outputs start as garbage so that every element must be written.
fn run_forward<T: Real>(c: Case, x: &Inputs, scale: f64) -> (Vec<f64>, Vec<f64>) {
    let (q, k, v) = (cast::<T>(&x.q), cast::<T>(&x.k), cast::<T>(&x.v));
    let mut probs = vec![T::of(7.0); c.probs_len()];
    let mut out = vec![T::of(7.0); c.q_len()];
    attention(
        &view(&q, &[c.b, c.hq, c.t, c.d]),
        &view(&k, &[c.b, c.hkv, c.s, c.d]),
        &view(&v, &[c.b, c.hkv, c.s, c.d]),
        scale,
        &mut view_mut(&mut probs, &[c.b, c.hq, c.t, c.s]),
        &mut view_mut(&mut out, &[c.b, c.t, c.hq, c.d]),
    )
    .unwrap();
    (widen(&out), widen(&probs))
}

struct Grads {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
}

/// Runs forward then backward in `T`; gradients start as garbage to check they are overwritten.
fn run_backward<T: Real>(c: Case, x: &Inputs, grad_out: &[f64], scale: f64) -> Grads {
    let (q, k, v) = (cast::<T>(&x.q), cast::<T>(&x.k), cast::<T>(&x.v));
    let mut probs = vec![T::zero(); c.probs_len()];
    let mut out = vec![T::zero(); c.q_len()];
    let q_shape = [c.b, c.hq, c.t, c.d];
    let kv_shape = [c.b, c.hkv, c.s, c.d];
    let bthd = [c.b, c.t, c.hq, c.d];
    let probs_shape = [c.b, c.hq, c.t, c.s];
    attention(
        &view(&q, &q_shape),
        &view(&k, &kv_shape),
        &view(&v, &kv_shape),
        scale,
        &mut view_mut(&mut probs, &probs_shape),
        &mut view_mut(&mut out, &bthd),
    )
    .unwrap();
    let grad_out = cast::<T>(grad_out);
    let mut grad_q = vec![T::of(3.0); c.q_len()];
    let mut grad_k = vec![T::of(3.0); c.kv_len()];
    let mut grad_v = vec![T::of(3.0); c.kv_len()];
    let mut workspace = vec![T::of(3.0); c.s];
    attention_backward(
        &view(&q, &q_shape),
        &view(&k, &kv_shape),
        &view(&v, &kv_shape),
        &view(&probs, &probs_shape),
        &view(&grad_out, &bthd),
        scale,
        &mut view_mut(&mut grad_q, &q_shape),
        &mut view_mut(&mut grad_k, &kv_shape),
        &mut view_mut(&mut grad_v, &kv_shape),
        &mut view_mut(&mut workspace, &[c.s]),
    )
    .unwrap();
    Grads {
        q: widen(&grad_q),
        k: widen(&grad_k),
        v: widen(&grad_v),
    }
}

#[test]
fn forward_matches_naive_in_f64_and_f32() {
    let mut rng = testing::rng("attention_forward");
    for c in CASES {
        let x = random_inputs(&mut rng, c);
        let scale = c.scale();
        let what = format!("{c:?}");

        let (want_out, want_probs) = naive_attention(c, &x, scale);
        let (out, probs) = run_forward::<f64>(c, &x, scale);
        assert_close(&format!("{what} f64 out"), &out, &want_out, 1e-12, 1e-12);
        assert_close(
            &format!("{what} f64 probs"),
            &probs,
            &want_probs,
            1e-12,
            1e-12,
        );

        // The f32 reference uses the same f32-rounded inputs the kernel sees.
        let x32 = Inputs {
            q: widen(&cast::<f32>(&x.q)),
            k: widen(&cast::<f32>(&x.k)),
            v: widen(&cast::<f32>(&x.v)),
        };
        let (want_out, want_probs) = naive_attention(c, &x32, scale);
        let (out, probs) = run_forward::<f32>(c, &x, scale);
        assert_close(&format!("{what} f32 out"), &out, &want_out, 1e-5, 1e-6);
        assert_close(
            &format!("{what} f32 probs"),
            &probs,
            &want_probs,
            1e-5,
            1e-6,
        );

        // Masked probabilities are exactly zero, visible ones positive.
        for (i, &p) in probs.iter().enumerate() {
            let (si, ti) = (i % c.s, (i / c.s) % c.t);
            if si > c.s - c.t + ti {
                assert_eq!(p, 0.0, "{what}: masked prob {i}");
            } else {
                assert!(p > 0.0, "{what}: visible prob {i} is {p}");
            }
        }
    }
}

#[test]
fn query_block_after_a_prefix_equals_the_tail_of_full_attention() {
    // Queries at positions S−T..S attending a cache of S keys must match the last T rows of
    // full causal self-attention over all S positions.
    let mut rng = testing::rng("attention_prefix");
    let (full, block) = (case(2, 6, 3, 9, 9, 5), case(2, 6, 3, 4, 9, 5));
    let x = random_inputs(&mut rng, full);
    let (out_full, _) = run_forward::<f64>(full, &x, 0.7);
    // q[b,h, 5..9, :] of the full problem.
    let mut q_block = Vec::new();
    for bh in 0..full.b * full.hq {
        let start = (bh * full.t + (full.t - block.t)) * full.d;
        q_block.extend_from_slice(&x.q[start..start + block.t * full.d]);
    }
    let x_block = Inputs {
        q: q_block,
        k: x.k.clone(),
        v: x.v.clone(),
    };
    let (out_block, _) = run_forward::<f64>(block, &x_block, 0.7);
    // out is BTHD, so the tail rows of each batch are one contiguous run.
    let row = full.hq * full.d;
    for b in 0..full.b {
        let want = &out_full[(b * full.t + full.t - block.t) * row..(b + 1) * full.t * row];
        let got = &out_block[b * block.t * row..(b + 1) * block.t * row];
        assert_close("prefix tail", got, want, 1e-14, 1e-14);
    }
}

#[test]
fn backward_matches_central_differences() {
    let mut rng = testing::rng("attention_backward");
    for c in CASES {
        let x = random_inputs(&mut rng, c);
        let cotangent = testing::signed(&mut rng, c.q_len());
        let scale = c.scale();
        let grads = run_backward::<f64>(c, &x, &cotangent, scale);
        let loss = |x: &Inputs| testing::dot(&cotangent, &run_forward::<f64>(c, x, scale).0);
        let h = 1e-6;
        let what = format!("{c:?}");

        let numeric = central_difference(
            |q| {
                loss(&Inputs {
                    q: q.to_vec(),
                    k: x.k.clone(),
                    v: x.v.clone(),
                })
            },
            &x.q,
            h,
        );
        assert_close(&format!("{what} grad_q"), &grads.q, &numeric, 1e-6, 1e-7);
        let numeric = central_difference(
            |k| {
                loss(&Inputs {
                    q: x.q.clone(),
                    k: k.to_vec(),
                    v: x.v.clone(),
                })
            },
            &x.k,
            h,
        );
        assert_close(&format!("{what} grad_k"), &grads.k, &numeric, 1e-6, 1e-7);
        let numeric = central_difference(
            |v| {
                loss(&Inputs {
                    q: x.q.clone(),
                    k: x.k.clone(),
                    v: v.to_vec(),
                })
            },
            &x.v,
            h,
        );
        assert_close(&format!("{what} grad_v"), &grads.v, &numeric, 1e-6, 1e-7);

        // The f32 path computes the same gradients to f32 accuracy.
        let grads32 = run_backward::<f32>(c, &x, &cotangent, scale);
        for (name, got, want) in [
            ("q", &grads32.q, &grads.q),
            ("k", &grads32.k, &grads.k),
            ("v", &grads32.v, &grads.v),
        ] {
            if !want.is_empty() {
                let err = rel_l2(got, want);
                assert!(err < 1e-5, "{what} f32 grad_{name}: rel_l2 {err}");
            }
        }
    }
}

#[test]
fn same_inputs_give_the_same_bits() {
    let mut rng = testing::rng("attention_determinism");
    let c = case(2, 8, 2, 13, 29, 24);
    let x = random_inputs(&mut rng, c);
    let cotangent = testing::signed(&mut rng, c.q_len());
    let bits = |values: &[f64]| values.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let run = || {
        let (out, probs) = run_forward::<f32>(c, &x, 0.2);
        let g = run_backward::<f32>(c, &x, &cotangent, 0.2);
        [out, probs, g.q, g.k, g.v].map(|v| bits(&v))
    };
    assert_eq!(run(), run());
}
