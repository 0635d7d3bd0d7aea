//! Causal grouped-query attention (GQA), forward and backward, as Hugging Face's eager
//! attention computes it after `repeat_kv`.
//!
//! Math, per batch `b`, query head `h` and query row `t`:
//!
//! ```text
//! kv     = h / (Hq / Hkv)                      query heads share kv heads in contiguous groups
//! pos    = S − T + t                           absolute position of query t
//! score  = (q[b,h,t,:] · k[b,kv,s,:]) · scale  for s in 0..=pos (keys after pos are masked)
//! P[s]   = exp(score[s] − max) / Σ exp(score − max)     max over the unmasked keys; masked P = 0
//! out[b,t,h,:] = Σ_s P[s] · v[b,kv,s,:]
//! ```
//!
//! `S > T` is a block of `T` new queries after a cached prefix of `S − T` keys; `S == T` is
//! ordinary causal self-attention.
//!
//! Backward, with `dO = grad_out[b,t,h,:]`:
//!
//! ```text
//! dV[s] += P[s] · dO          dP[s] = dO · v[s]          dS[s] = P[s] · (dP[s] − Σ_j dP[j]·P[j])
//! dQ     = scale · Σ_s dS[s] · k[s]                      dK[s] += scale · dS[s] · q
//! ```
//!
//! Layouts (all contiguous, one float dtype):
//! - `q` `[B,Hq,T,D]`, `k` and `v` `[B,Hkv,S,D]`, with `Hkv ≥ 1` dividing `Hq` and `T ≤ S`;
//! - `probs` `[B,Hq,T,S]`: written by the forward (masked entries exactly 0) and read by the
//!   backward — it is the activation saved for the backward;
//! - `out` and `grad_out` `[B,T,Hq,D]` (BTHD), so the output reshapes to `[B,T,Hq·D]` for the
//!   output projection without a copy;
//! - `grad_q` `[B,Hq,T,D]`, `grad_k` and `grad_v` `[B,Hkv,S,D]`, all overwritten;
//! - `workspace` at least `S` elements: one row of `dP`, then `dS`.
//!
//! Reductions run serially in a fixed order: dot products over `d` ascending, softmax sums over
//! `s` ascending, and a kv head's gradients accumulate its query heads in increasing head order
//! (then `t` ascending), so results are bit-for-bit reproducible.

use crate::dispatch_real;
use crate::element::Real;
use crate::error::{expect_rank, expect_shape, Error, Result};
use crate::view::{TensorView, TensorViewMut};

/// The sizes of one attention call, checked against `q`, `k` and `v`.
#[derive(Clone, Copy, Debug)]
struct Dims {
    batch: usize,
    q_heads: usize,
    kv_heads: usize,
    /// `T`, the number of query rows.
    q_len: usize,
    /// `S`, the number of keys (cached prefix plus the query block).
    kv_len: usize,
    head_dim: usize,
}

impl Dims {
    /// Query heads per kv head.
    fn group(&self) -> usize {
        self.q_heads / self.kv_heads
    }

    /// How many keys query row `t` sees: those at positions `0..=S − T + t`.
    fn visible(&self, t: usize) -> usize {
        self.kv_len - self.q_len + t + 1
    }

    fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.q_heads, self.q_len, self.head_dim]
    }
    fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.kv_heads, self.kv_len, self.head_dim]
    }
    fn probs_shape(&self) -> [usize; 4] {
        [self.batch, self.q_heads, self.q_len, self.kv_len]
    }
    fn bthd_shape(&self) -> [usize; 4] {
        [self.batch, self.q_len, self.q_heads, self.head_dim]
    }
}

fn dims4(op: &'static str, operand: &'static str, view: &TensorView<'_>) -> Result<[usize; 4]> {
    expect_rank(op, operand, view.shape(), 4)?;
    let mut dims = [0; 4];
    dims.copy_from_slice(view.shape().dims());
    Ok(dims)
}

/// Checks the shapes of `q`, `k`, `v` and derives the call's sizes.
fn check_qkv(
    op: &'static str,
    q: &TensorView<'_>,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
) -> Result<Dims> {
    let [batch, q_heads, q_len, head_dim] = dims4(op, "q", q)?;
    let [_, kv_heads, kv_len, _] = dims4(op, "k", k)?;
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(Error::Shape {
            op,
            operand: "k",
            expected: format!(
                "[{batch},Hkv,S,{head_dim}] with Hkv >= 1 dividing the {q_heads} query heads"
            ),
            got: k.shape().clone(),
        });
    }
    let dims = Dims {
        batch,
        q_heads,
        kv_heads,
        q_len,
        kv_len,
        head_dim,
    };
    expect_shape(op, "k", k.shape(), &dims.kv_shape())?;
    expect_shape(op, "v", v.shape(), &dims.kv_shape())?;
    if q_len > kv_len {
        return Err(Error::Shape {
            op,
            operand: "q",
            expected: format!("[{batch},{q_heads},T,{head_dim}] with T <= {kv_len} keys"),
            got: q.shape().clone(),
        });
    }
    Ok(dims)
}

/// Row `index` of a row-major matrix with rows of `len` elements.
fn row<T>(data: &[T], index: usize, len: usize) -> &[T] {
    &data[index * len..(index + 1) * len]
}

fn row_mut<T>(data: &mut [T], index: usize, len: usize) -> &mut [T] {
    &mut data[index * len..(index + 1) * len]
}

fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut sum = T::zero();
    for (&x, &y) in a.iter().zip(b) {
        sum += x * y;
    }
    sum
}

/// `acc += alpha · x`.
fn axpy<T: Real>(acc: &mut [T], alpha: T, x: &[T]) {
    for (a, &xi) in acc.iter_mut().zip(x) {
        *a += alpha * xi;
    }
}

/// Causal GQA forward: writes the probabilities `probs` `[B,Hq,T,S]` and the output `out`
/// `[B,T,Hq,D]` from `q` `[B,Hq,T,D]`, `k` and `v` `[B,Hkv,S,D]` (see the module doc).
pub fn attention(
    q: &TensorView<'_>,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
    scale: f64,
    probs: &mut TensorViewMut<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "attention";
    let dims = check_qkv(OP, q, k, v)?;
    expect_shape(OP, "probs", probs.shape(), &dims.probs_shape())?;
    expect_shape(OP, "out", out.shape(), &dims.bthd_shape())?;
    dispatch_real!(
        OP,
        q.dtype(),
        attention_typed(dims, q, k, v, scale, probs, out)
    )
}

fn attention_typed<T: Real>(
    dims: Dims,
    q: &TensorView<'_>,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
    scale: f64,
    probs: &mut TensorViewMut<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "attention";
    let (q, k, v) = (
        q.slice::<T>(OP, "q")?,
        k.slice::<T>(OP, "k")?,
        v.slice::<T>(OP, "v")?,
    );
    let probs = probs.slice_mut::<T>(OP, "probs")?;
    let out = out.slice_mut::<T>(OP, "out")?;
    let scale = T::of(scale);
    let Dims {
        batch,
        q_heads,
        q_len,
        kv_len,
        head_dim,
        ..
    } = dims;

    for b in 0..batch {
        for h in 0..q_heads {
            // First key/value row of this query head's kv head.
            let kv_base = (b * dims.kv_heads + h / dims.group()) * kv_len;
            let q_base = (b * q_heads + h) * q_len;
            for t in 0..q_len {
                attend_row(
                    row(q, q_base + t, head_dim),
                    &k[kv_base * head_dim..],
                    &v[kv_base * head_dim..],
                    scale,
                    dims.visible(t),
                    row_mut(probs, q_base + t, kv_len),
                    row_mut(out, (b * q_len + t) * q_heads + h, head_dim),
                );
            }
        }
    }
    Ok(())
}

/// One query row of causal attention: softmax of `q_row · keys[s] · scale` over the first
/// `visible` key rows into `probs[..visible]` (the rest of `probs` is set to exactly 0), and
/// `out_row = Σ_s probs[s] · values[s]`.
///
/// `keys` and `values` start at key row 0 of the query's kv head, with rows of
/// `q_row.len()` elements and at least `visible` of them; `probs` has at least `visible`
/// elements. The cached attention kernel runs this same function, so both give the same bits
/// for the same keys.
pub(crate) fn attend_row<T: Real>(
    q_row: &[T],
    keys: &[T],
    values: &[T],
    scale: T,
    visible: usize,
    probs: &mut [T],
    out_row: &mut [T],
) {
    let head_dim = q_row.len();
    let (visible, masked) = probs.split_at_mut(visible);

    let mut max = T::neg_infinity();
    for (s, p) in visible.iter_mut().enumerate() {
        *p = dot(q_row, row(keys, s, head_dim)) * scale;
        max = max.max(*p);
    }
    // Subtracting the row max keeps exp from overflowing; it cancels in the ratio.
    let mut sum = T::zero();
    for p in visible.iter_mut() {
        *p = (*p - max).exp();
        sum += *p;
    }
    for p in visible.iter_mut() {
        *p /= sum;
    }
    masked.fill(T::zero());

    out_row.fill(T::zero());
    for (s, &p) in visible.iter().enumerate() {
        axpy(out_row, p, row(values, s, head_dim));
    }
}

/// Causal GQA backward: from the forward's inputs, its saved `probs` and the output gradient
/// `grad_out` `[B,T,Hq,D]`, overwrites `grad_q` `[B,Hq,T,D]`, `grad_k` and `grad_v`
/// `[B,Hkv,S,D]`. `workspace` (same float dtype, at least `S` elements) holds one row of
/// `dP`/`dS`.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    q: &TensorView<'_>,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
    probs: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    scale: f64,
    grad_q: &mut TensorViewMut<'_>,
    grad_k: &mut TensorViewMut<'_>,
    grad_v: &mut TensorViewMut<'_>,
    workspace: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "attention_backward";
    let dims = check_qkv(OP, q, k, v)?;
    expect_shape(OP, "probs", probs.shape(), &dims.probs_shape())?;
    expect_shape(OP, "grad_out", grad_out.shape(), &dims.bthd_shape())?;
    expect_shape(OP, "grad_q", grad_q.shape(), &dims.q_shape())?;
    expect_shape(OP, "grad_k", grad_k.shape(), &dims.kv_shape())?;
    expect_shape(OP, "grad_v", grad_v.shape(), &dims.kv_shape())?;
    if workspace.numel() < dims.kv_len {
        return Err(Error::Workspace {
            op: OP,
            operand: "workspace",
            needed: dims.kv_len,
            got: workspace.numel(),
        });
    }
    let inputs = BackwardInputs {
        q,
        k,
        v,
        probs,
        grad_out,
    };
    dispatch_real!(
        OP,
        q.dtype(),
        attention_backward_typed(dims, &inputs, scale, grad_q, grad_k, grad_v, workspace)
    )
}

/// The read-only operands of the backward, grouped to keep signatures short.
struct BackwardInputs<'v, 'a> {
    q: &'v TensorView<'a>,
    k: &'v TensorView<'a>,
    v: &'v TensorView<'a>,
    probs: &'v TensorView<'a>,
    grad_out: &'v TensorView<'a>,
}

fn attention_backward_typed<T: Real>(
    dims: Dims,
    inputs: &BackwardInputs<'_, '_>,
    scale: f64,
    grad_q: &mut TensorViewMut<'_>,
    grad_k: &mut TensorViewMut<'_>,
    grad_v: &mut TensorViewMut<'_>,
    workspace: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "attention_backward";
    let q = inputs.q.slice::<T>(OP, "q")?;
    let k = inputs.k.slice::<T>(OP, "k")?;
    let v = inputs.v.slice::<T>(OP, "v")?;
    let probs = inputs.probs.slice::<T>(OP, "probs")?;
    let grad_out = inputs.grad_out.slice::<T>(OP, "grad_out")?;
    let grad_q = grad_q.slice_mut::<T>(OP, "grad_q")?;
    let grad_k = grad_k.slice_mut::<T>(OP, "grad_k")?;
    let grad_v = grad_v.slice_mut::<T>(OP, "grad_v")?;
    let scratch = &mut workspace.slice_mut::<T>(OP, "workspace")?[..dims.kv_len];
    let scale = T::of(scale);
    let Dims {
        batch,
        q_heads,
        q_len,
        kv_len,
        head_dim,
        ..
    } = dims;

    // Several query heads (and rows) add into one kv row, so start from zero.
    grad_k.fill(T::zero());
    grad_v.fill(T::zero());
    for b in 0..batch {
        for h in 0..q_heads {
            let kv_base = (b * dims.kv_heads + h / dims.group()) * kv_len;
            let q_base = (b * q_heads + h) * q_len;
            for t in 0..q_len {
                // Masked keys have P = 0, hence dS = 0 and no contribution: skip them.
                let visible = dims.visible(t);
                let p_row = &row(probs, q_base + t, kv_len)[..visible];
                let grad_out_row = row(grad_out, (b * q_len + t) * q_heads + h, head_dim);
                let ds = &mut scratch[..visible];

                let mut p_dot_dp = T::zero();
                for (s, (ds_s, &p)) in ds.iter_mut().zip(p_row).enumerate() {
                    *ds_s = dot(grad_out_row, row(v, kv_base + s, head_dim));
                    p_dot_dp += p * *ds_s;
                    axpy(row_mut(grad_v, kv_base + s, head_dim), p, grad_out_row);
                }
                // dS, with the score scale folded in once for both dQ and dK.
                for (ds_s, &p) in ds.iter_mut().zip(p_row) {
                    *ds_s = p * (*ds_s - p_dot_dp) * scale;
                }

                let q_row = row(q, q_base + t, head_dim);
                let grad_q_row = row_mut(grad_q, q_base + t, head_dim);
                grad_q_row.fill(T::zero());
                for (s, &ds_s) in ds.iter().enumerate() {
                    axpy(grad_q_row, ds_s, row(k, kv_base + s, head_dim));
                    axpy(row_mut(grad_k, kv_base + s, head_dim), ds_s, q_row);
                }
            }
        }
    }
    Ok(())
}

pub mod flash;
#[cfg(test)]
mod rejection_tests;
#[cfg(test)]
mod tests;
