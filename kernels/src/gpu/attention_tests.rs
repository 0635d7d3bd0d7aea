//! The attention pipelines run on a CPU model of their launches (the GEMM as [`Gemm`]
//! defines it; the strided copy, the zero fill and the row kernels re-stated) against the
//! CPU reference kernels. A CPU machine thus checks every GEMM descriptor, workspace offset
//! and launch order; the GPU test (tests/gpu.rs) checks the kernels themselves.

use super::*;
use crate::gpu::{Arg, Gemm, Kernel};
use crate::testing::{self, assert_close};
use crate::view::{TensorView, TensorViewMut};

/// Device memory as f32 words, one vector per slot.
struct Memory(Vec<Vec<f32>>);

impl Memory {
    fn index(at: Addr) -> (usize, usize) {
        assert_eq!(at.offset % 4, 0, "{at:?} is not f32-aligned");
        (at.slot as usize, (at.offset / 4) as usize)
    }

    fn get(&self, at: Addr, element: u64) -> f32 {
        let (slot, start) = Memory::index(at);
        self.0[slot][start + element as usize]
    }

    fn set(&mut self, at: Addr, element: u64, value: f32) {
        let (slot, start) = Memory::index(at);
        self.0[slot][start + element as usize] = value;
    }

    fn gemm(&mut self, g: &Gemm) {
        assert_eq!(g.dtype, GemmDType::F32);
        for batch in 0..g.batch {
            for i in 0..g.m {
                for j in 0..g.n {
                    let mut sum = 0.0f64;
                    for l in 0..g.k {
                        let a = match g.transpose_a {
                            false => i * g.lda + l,
                            true => l * g.lda + i,
                        };
                        let b = match g.transpose_b {
                            false => l * g.ldb + j,
                            true => j * g.ldb + l,
                        };
                        let a = self.get(g.a, batch * g.stride_a + a);
                        let b = self.get(g.b, batch * g.stride_b + b);
                        sum += f64::from(a) * f64::from(b);
                    }
                    self.set(g.c, batch * g.stride_c + i * g.ldc + j, sum as f32);
                }
            }
        }
    }

    fn kernel(&mut self, k: &Kernel) {
        let ptr = |i: usize| match k.args[i] {
            Arg::Ptr(at) => at,
            ref other => panic!("argument {i} of {}: {other:?}", k.function),
        };
        let int = |i: usize| match k.args[i] {
            Arg::I64(value) => value as u64,
            ref other => panic!("argument {i} of {}: {other:?}", k.function),
        };
        let float = |i: usize| match k.args[i] {
            Arg::F32(value) => value,
            ref other => panic!("argument {i} of {}: {other:?}", k.function),
        };
        match k.function {
            "zero_f32" => (0..int(1)).for_each(|i| self.set(ptr(0), i, 0.0)),
            "strided_copy_b32" => {
                let dims: Vec<u64> = (3..9).map(int).collect();
                let strides: Vec<u64> = (9..15).map(int).collect();
                for i in 0..int(2) {
                    let (mut rest, mut source) = (i, 0);
                    for axis in (0..6).rev() {
                        source += rest % dims[axis] * strides[axis];
                        rest /= dims[axis];
                    }
                    let value = self.get(ptr(1), source);
                    self.set(ptr(0), i, value);
                }
            }
            "attention_softmax_f32" => {
                let (rows, t, s, scale) = (int(1), int(2), int(3), float(4));
                for row in 0..rows {
                    let visible = s - t + row % t + 1;
                    let at = |c: u64| row * s + c;
                    let scores: Vec<f32> = (0..visible)
                        .map(|c| self.get(ptr(0), at(c)) * scale)
                        .collect();
                    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let exps: Vec<f32> = scores.iter().map(|x| (x - max).exp()).collect();
                    let sum: f32 = exps.iter().sum();
                    for c in 0..s {
                        let p = if c < visible {
                            exps[c as usize] / sum
                        } else {
                            0.0
                        };
                        self.set(ptr(0), at(c), p);
                    }
                }
            }
            "attention_softmax_backward_f32" => {
                let (rows, t, s, scale) = (int(3), int(4), int(5), float(6));
                for row in 0..rows {
                    let visible = s - t + row % t + 1;
                    let at = |c: u64| row * s + c;
                    let p_dot_dp: f32 = (0..visible)
                        .map(|c| self.get(ptr(2), at(c)) * self.get(ptr(0), at(c)))
                        .sum();
                    for c in 0..s {
                        let (ds, p) = if c < visible {
                            let p = self.get(ptr(2), at(c));
                            (p * (self.get(ptr(0), at(c)) - p_dot_dp) * scale, p)
                        } else {
                            (0.0, 0.0)
                        };
                        self.set(ptr(0), at(c), ds);
                        self.set(ptr(1), at(c), p);
                    }
                }
            }
            other => panic!("no model of `{other}`"),
        }
    }

    fn run(&mut self, launches: &[Launch]) {
        for launch in launches {
            match launch {
                Launch::Gemm(g) => self.gemm(g),
                Launch::Kernel(k) => self.kernel(k),
                Launch::Copy { .. } | Launch::AllReduce { .. } => {
                    panic!("no copies or collectives expected: {launch:?}")
                }
            }
        }
    }
}

fn addr(slot: u32) -> Addr {
    Addr { slot, offset: 0 }
}

/// Shapes: MHA, GQA, MQA; T == S and T < S; one row; T = 0; D = 0.
const CASES: [[u64; 6]; 8] = [
    // [B, Hq, Hkv, T, S, D]
    [2, 4, 2, 5, 5, 3],
    [1, 6, 2, 3, 7, 4],
    [2, 3, 3, 4, 4, 2],
    [1, 4, 1, 2, 5, 8],
    [1, 2, 1, 1, 1, 1],
    [2, 12, 2, 9, 9, 16],
    [2, 4, 2, 0, 3, 5],
    [1, 2, 1, 3, 4, 0],
];

fn dims_of([batch, q_heads, kv_heads, q_len, kv_len, head_dim]: [u64; 6]) -> AttentionDims {
    AttentionDims {
        batch,
        q_heads,
        kv_heads,
        q_len,
        kv_len,
        head_dim,
    }
}

/// Random values, or NaN (unwritten memory) when `poison`.
fn slot(rng: &mut rand::rngs::StdRng, len: u64, poison: bool) -> Vec<f32> {
    if poison {
        vec![f32::NAN; len as usize]
    } else {
        testing::to_f32(&testing::signed(rng, len as usize))
    }
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| f64::from(x)).collect()
}

#[test]
fn the_forward_pipeline_matches_the_reference() {
    let mut rng = testing::rng("the_forward_pipeline_matches_the_reference");
    for case in CASES {
        let dims = dims_of(case);
        let [b, hq, hkv, t, s, d] = case.map(|x| x as usize);
        let scale = 0.7f32;
        let (q_len, kv_len, probs_len) = (
            dims.rows() * case[5],
            (b * hkv * s * d) as u64,
            dims.rows() * case[4],
        );
        // Slots: q, k, v, out, probs.
        let mut memory = Memory(vec![
            slot(&mut rng, q_len, false),
            slot(&mut rng, kv_len, false),
            slot(&mut rng, kv_len, false),
            slot(&mut rng, q_len, true),
            slot(&mut rng, probs_len, true),
        ]);
        let at = AttentionForward {
            q: addr(0),
            k: addr(1),
            v: addr(2),
            out: addr(3),
            probs: addr(4),
        };
        memory.run(&attention_f32(at, dims, scale).unwrap());

        let (mut out, mut probs) = (
            vec![0.0f32; q_len as usize],
            vec![0.0f32; probs_len as usize],
        );
        crate::attention::attention(
            &TensorView::contiguous(&memory.0[0][..], [b, hq, t, d]).unwrap(),
            &TensorView::contiguous(&memory.0[1][..], [b, hkv, s, d]).unwrap(),
            &TensorView::contiguous(&memory.0[2][..], [b, hkv, s, d]).unwrap(),
            f64::from(scale),
            &mut TensorViewMut::contiguous(&mut probs[..], [b, hq, t, s]).unwrap(),
            &mut TensorViewMut::contiguous(&mut out[..], [b, t, hq, d]).unwrap(),
        )
        .unwrap();
        let what = format!("{case:?}");
        assert_close(
            &format!("probs {what}"),
            &widen(&memory.0[4]),
            &widen(&probs),
            1e-5,
            1e-6,
        );
        assert_close(
            &format!("out {what}"),
            &widen(&memory.0[3]),
            &widen(&out),
            1e-5,
            1e-6,
        );
    }
}

#[test]
fn the_backward_pipeline_matches_the_reference_and_ignores_masked_probs() {
    let mut rng = testing::rng("the_backward_pipeline_matches_the_reference");
    for case in CASES {
        let dims = dims_of(case);
        let [b, hq, hkv, t, s, d] = case.map(|x| x as usize);
        let scale = 0.7f32;
        let (q_len, kv_len, probs_len) = (
            dims.rows() * case[5],
            (b * hkv * s * d) as u64,
            dims.rows() * case[4],
        );
        // Slots: q, k, v, probs (random everywhere, also past the causal limit), grad_out,
        // grad_q, grad_k, grad_v, workspace.
        let mut memory = Memory(vec![
            slot(&mut rng, q_len, false),
            slot(&mut rng, kv_len, false),
            slot(&mut rng, kv_len, false),
            slot(&mut rng, probs_len, false),
            slot(&mut rng, q_len, false),
            slot(&mut rng, q_len, true),
            slot(&mut rng, kv_len, true),
            slot(&mut rng, kv_len, true),
            slot(&mut rng, dims.backward_workspace_bytes() / 4, true),
        ]);
        let at = AttentionBackward {
            q: addr(0),
            k: addr(1),
            v: addr(2),
            probs: addr(3),
            grad_out: addr(4),
            grad_q: addr(5),
            grad_k: addr(6),
            grad_v: addr(7),
            workspace: addr(8),
        };
        memory.run(&attention_backward_f32(at, dims, scale).unwrap());

        let mut grads = [q_len, kv_len, kv_len].map(|len| vec![0.0f32; len as usize]);
        let mut scratch = vec![0.0f32; s.max(1)];
        let [grad_q, grad_k, grad_v] = &mut grads;
        let view = |slot: usize, shape: [usize; 4]| {
            TensorView::contiguous(&memory.0[slot][..], shape).unwrap()
        };
        crate::attention::attention_backward(
            &view(0, [b, hq, t, d]),
            &view(1, [b, hkv, s, d]),
            &view(2, [b, hkv, s, d]),
            &view(3, [b, hq, t, s]),
            &view(4, [b, t, hq, d]),
            f64::from(scale),
            &mut TensorViewMut::contiguous(&mut grad_q[..], [b, hq, t, d]).unwrap(),
            &mut TensorViewMut::contiguous(&mut grad_k[..], [b, hkv, s, d]).unwrap(),
            &mut TensorViewMut::contiguous(&mut grad_v[..], [b, hkv, s, d]).unwrap(),
            &mut TensorViewMut::contiguous(&mut scratch[..], [s.max(1)]).unwrap(),
        )
        .unwrap();
        for (name, slot, want) in [
            ("grad_q", 5, &grads[0]),
            ("grad_k", 6, &grads[1]),
            ("grad_v", 7, &grads[2]),
        ] {
            let what = format!("{name} {case:?}");
            // Each element is an f32 sum over keys or queries, added in another order than the
            // reference's: an element near zero out of larger terms keeps an absolute error of
            // the terms' scale, so the absolute bound follows the largest element.
            let want = widen(want);
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            assert_close(&what, &widen(&memory.0[slot]), &want, 1e-5, 1e-5 * scale);
        }
    }
}
