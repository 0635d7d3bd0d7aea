//! The FlashAttention contract on the CPU: causal GQA attention (the module above's math) that
//! keeps each query row's log-sum-exp instead of its probabilities, with `q`, `k`, `v` (and
//! `grad_out` in the backward) entering their products as their bf16 roundings and everything
//! else in f32. The device kernels (kernels/cuda/flash.cu, flash_backward.cu) compute the same
//! function block by block; this is the reference they are checked against. The forward also rounds to f16
//! instead (`r` below the f16 rounding: bf16 inference's prefill, whose scores need the three
//! more mantissa bits); an f32 element beyond f16's range rounds to an infinity there, as on
//! the device.
//!
//! Forward, per query row, over the visible keys in tiles of [`key_tile`] (online softmax, as
//! the device's kernel runs it):
//!
//! ```text
//! score[s] = (r(q) · r(k[s])) · scale
//! per tile: m' = max(m, max of the tile's scores)      α = exp(m − m')
//!           l  = l·α + Σ exp(score − m')                o = o·α + Σ r(exp(score − m')) · r(v[s])
//! out = o / l        lse = m + ln l
//! ```
//!
//! With one tile and no rounding of `exp(score − m)` this is `attention` of the rounded inputs;
//! the rounding is where the device's tensor cores take the probabilities, so the reference
//! rounds there too, in the tiles of the device's one-group forward (the maximum they are
//! taken against depends on them). Its two-group forward (grids below one wave) walks tiles of
//! half the length from head dim 64 on, every other one in each group, and merges the groups'
//! sums at the end: its probabilities are rounded against other maxima, within the same bound
//! of the reference.
//!
//! Backward, the probabilities rebuilt from `lse`, and `P` and `dS` rounded to bf16 where they
//! enter their products, as the device's tensor cores take them:
//!
//! ```text
//! P[s] = exp(score[s] − lse)      Δ = r(dO) · out        dP[s] = r(dO) · r(v[s])
//! dS[s] = P[s] · (dP[s] − Δ) · scale
//! dQ = Σ_s r(dS[s]) · r(k[s])      dK[s] += r(dS[s]) · r(q)      dV[s] += r(P[s]) · r(dO)
//! ```
//!
//! `Δ = Σ_s P[s]·dP[s]` when `out` is the forward's, which is why the saved output replaces the
//! probabilities. The rounding's own gradient is taken as the identity, as `Cast`'s is.
//! Reductions run in the fixed orders of `attention_backward`: bit-for-bit reproducible.

use half::{bf16, f16};

use super::{axpy, check_qkv, dot, row, row_mut, Dims};
use crate::error::{expect_shape, Error, Result};
use crate::view::{TensorView, TensorViewMut};
use kiln_ir::DType;

/// The bf16 rounding of every element of an f32 operand.
fn rounded(op: &'static str, operand: &'static str, view: &TensorView<'_>) -> Result<Vec<f32>> {
    rounded_to(round, op, operand, view)
}

/// `round` of every element of an f32 operand.
fn rounded_to(
    round: fn(f32) -> f32,
    op: &'static str,
    operand: &'static str,
    view: &TensorView<'_>,
) -> Result<Vec<f32>> {
    if view.dtype() != DType::F32 {
        return Err(Error::DType {
            op,
            operand,
            expected: DType::F32,
            got: view.dtype(),
        });
    }
    let data = view.slice::<f32>(op, operand)?;
    Ok(data.iter().map(|&x| round(x)).collect())
}

fn round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

fn round_f16(x: f32) -> f32 {
    f16::from_f32(x).to_f32()
}

/// The rounding of the forward's products for `rounding` (bf16 or f16).
fn rounding_of(op: &'static str, rounding: DType) -> Result<fn(f32) -> f32> {
    match rounding {
        DType::BF16 => Ok(round),
        DType::F16 => Ok(round_f16),
        _ => Err(Error::Argument {
            op,
            argument: "rounding",
            reason: format!("{rounding}: flash attention rounds to bf16 or f16"),
        }),
    }
}

/// The widest head the device kernels take (kernels/src/gpu/flash.rs); programs attend wider
/// heads with `Attention`.
pub const MAX_HEAD_DIM: usize = 128;

/// Keys per tile of the forward: 64, or 32 for head dims above 64 (kernels/cuda/flash.cu's
/// tiles in its one-group forward).
pub fn key_tile(head_dim: usize) -> usize {
    if head_dim > 64 {
        32
    } else {
        64
    }
}

fn lse_shape(dims: &Dims) -> [usize; 3] {
    [dims.batch, dims.q_heads, dims.q_len]
}

/// Writes `out [B,T,Hq,D]` and `lse [B,Hq,T]` (f32) from f32 `q [B,Hq,T,D]`, `k`, `v
/// [B,Hkv,S,D]`, the products' operands rounded to `rounding` (bf16 or f16).
pub fn flash_attention(
    q: &TensorView<'_>,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
    (scale, rounding): (f64, DType),
    out: &mut TensorViewMut<'_>,
    lse: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "flash_attention";
    let to_rounding = rounding_of(OP, rounding)?;
    let dims = check_qkv(OP, q, k, v)?;
    expect_shape(OP, "out", out.shape(), &dims.bthd_shape())?;
    expect_shape(OP, "lse", lse.shape(), &lse_shape(&dims))?;
    let (q, k, v) = (
        rounded_to(to_rounding, OP, "q", q)?,
        rounded_to(to_rounding, OP, "k", k)?,
        rounded_to(to_rounding, OP, "v", v)?,
    );
    let out = out.slice_mut::<f32>(OP, "out")?;
    let lse = lse.slice_mut::<f32>(OP, "lse")?;
    let scale = scale as f32;
    let Dims {
        batch,
        q_heads,
        q_len,
        kv_len,
        head_dim,
        ..
    } = dims;
    let tile = key_tile(head_dim);
    let mut scores = vec![0.0f32; tile];
    for b in 0..batch {
        for h in 0..q_heads {
            let kv_base = (b * dims.kv_heads + h / dims.group()) * kv_len;
            let q_base = (b * q_heads + h) * q_len;
            for t in 0..q_len {
                let q_row = row(&q, q_base + t, head_dim);
                let out_row = row_mut(out, (b * q_len + t) * q_heads + h, head_dim);
                out_row.fill(0.0);
                let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
                for first in (0..dims.visible(t)).step_by(tile) {
                    let keys = first..dims.visible(t).min(first + tile);
                    let scores = &mut scores[..keys.len()];
                    for (score, key) in scores.iter_mut().zip(keys.clone()) {
                        *score = dot(q_row, row(&k, kv_base + key, head_dim)) * scale;
                    }
                    let top = scores.iter().copied().fold(max, f32::max);
                    // A row with no finite maximum yet keeps 0 as its reference.
                    let reference = if top == f32::NEG_INFINITY { 0.0 } else { top };
                    let alpha = (max - reference).exp();
                    max = top;
                    sum *= alpha;
                    out_row.iter_mut().for_each(|o| *o *= alpha);
                    for (&score, key) in scores.iter().zip(keys) {
                        let p = (score - reference).exp();
                        sum += p;
                        axpy(out_row, to_rounding(p), row(&v, kv_base + key, head_dim));
                    }
                }
                let inverse = 1.0 / sum;
                out_row.iter_mut().for_each(|o| *o *= inverse);
                // Every score -inf: l = 0, and the row is NaN, its lse too.
                lse[q_base + t] = if sum > 0.0 { max + sum.ln() } else { f32::NAN };
            }
        }
    }
    Ok(())
}

/// The backward of [`flash_attention`]: from its inputs, its `out` and `lse` and the output
/// gradient `grad_out [B,T,Hq,D]`, overwrites `grad_q [B,Hq,T,D]`, `grad_k` and `grad_v
/// [B,Hkv,S,D]` (all f32).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_backward(
    q: &TensorView<'_>,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
    out: &TensorView<'_>,
    lse: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    scale: f64,
    grads: [&mut TensorViewMut<'_>; 3],
) -> Result<()> {
    const OP: &str = "flash_attention_backward";
    let dims = check_qkv(OP, q, k, v)?;
    expect_shape(OP, "out", out.shape(), &dims.bthd_shape())?;
    expect_shape(OP, "lse", lse.shape(), &lse_shape(&dims))?;
    expect_shape(OP, "grad_out", grad_out.shape(), &dims.bthd_shape())?;
    let [grad_q, grad_k, grad_v] = grads;
    expect_shape(OP, "grad_q", grad_q.shape(), &dims.q_shape())?;
    expect_shape(OP, "grad_k", grad_k.shape(), &dims.kv_shape())?;
    expect_shape(OP, "grad_v", grad_v.shape(), &dims.kv_shape())?;
    let (q, k, v) = (
        rounded(OP, "q", q)?,
        rounded(OP, "k", k)?,
        rounded(OP, "v", v)?,
    );
    let grad_out = rounded(OP, "grad_out", grad_out)?;
    let out = out.slice::<f32>(OP, "out")?;
    let lse = lse.slice::<f32>(OP, "lse")?;
    let grad_q = grad_q.slice_mut::<f32>(OP, "grad_q")?;
    let grad_k = grad_k.slice_mut::<f32>(OP, "grad_k")?;
    let grad_v = grad_v.slice_mut::<f32>(OP, "grad_v")?;
    let scale = scale as f32;
    let Dims {
        batch,
        q_heads,
        q_len,
        kv_len,
        head_dim,
        ..
    } = dims;
    let mut ds = vec![0.0f32; kv_len];
    // Several query heads (and rows) add into one kv row, so start from zero.
    grad_k.fill(0.0);
    grad_v.fill(0.0);
    for b in 0..batch {
        for h in 0..q_heads {
            let kv_base = (b * dims.kv_heads + h / dims.group()) * kv_len;
            let q_base = (b * q_heads + h) * q_len;
            for t in 0..q_len {
                let visible = dims.visible(t);
                let q_row = row(&q, q_base + t, head_dim);
                let bthd = (b * q_len + t) * q_heads + h;
                let grad_out_row = row(&grad_out, bthd, head_dim);
                let delta = dot(grad_out_row, row(out, bthd, head_dim));
                let row_lse = lse[q_base + t];
                for (s, ds_s) in ds[..visible].iter_mut().enumerate() {
                    let key = kv_base + s;
                    let p = (dot(q_row, row(&k, key, head_dim)) * scale - row_lse).exp();
                    let grad_score =
                        p * (dot(grad_out_row, row(&v, key, head_dim)) - delta) * scale;
                    *ds_s = round(grad_score);
                    axpy(row_mut(grad_v, key, head_dim), round(p), grad_out_row);
                }
                let grad_q_row = row_mut(grad_q, q_base + t, head_dim);
                grad_q_row.fill(0.0);
                for (s, &ds_s) in ds[..visible].iter().enumerate() {
                    axpy(grad_q_row, ds_s, row(&k, kv_base + s, head_dim));
                    axpy(row_mut(grad_k, kv_base + s, head_dim), ds_s, q_row);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
