//! Rotary position embedding (RoPE) in the split-half ("rotate_half") form Hugging Face Qwen2
//! applies, fused with the optional projection bias and the `[B,T,H,D] → [B,H,T,D]` layout
//! change that follows the q/k projections.
//!
//! For each batch `b`, token `t` and head `h`, with `p = positions[b,t]` and
//! `y = x[b,t,h,:] + bias[h,:]` (bias `[H*D]` read as `[H,D]`), for `i` in `0..D/2`:
//!
//! ```text
//! out[b,h,t,i]       = y[i]·cos_i − y[i+D/2]·sin_i
//! out[b,h,t,i+D/2]   = y[i+D/2]·cos_i + y[i]·sin_i
//! ```
//!
//! The angles are computed exactly as Hugging Face computes them, in f32 even for f64 tensors,
//! so an f64 run checks the very rotation an f32 model uses:
//!
//! ```text
//! inv_freq_i = 1f32 / (theta as f32)^((2i) as f32 / D as f32)
//! angle      = (p as f32) · inv_freq_i,   cos_i = cos(angle),  sin_i = sin(angle)   (all f32)
//! ```
//!
//! and `cos_i`, `sin_i` are then converted (exactly) to the tensors' dtype. They are computed
//! per (token, i) inside the loops rather than read from a table, so the kernel needs no
//! workspace.
//!
//! Backward is the transposed rotation with the layout change undone, from `grad_out`
//! `[B,H,T,D]` to `grad_x` `[B,T,H,D]`:
//!
//! ```text
//! grad_y[i]     = g[i]·cos_i + g[i+D/2]·sin_i
//! grad_y[i+D/2] = g[i+D/2]·cos_i − g[i]·sin_i
//! ```
//!
//! `grad_y` is the gradient of both `x` and the bias; the bias gradient is the caller's sum of
//! `grad_x` over `B` and `T`.
//!
//! Invariants: every operand is contiguous; `D` is even; `positions` is `[B,T]` of i32 or i64,
//! every value >= 0; `theta` is finite and > 0, also once rounded to f32. Float operands share
//! `x`'s (or `grad_out`'s) dtype, f32 or f64.

use crate::dispatch_real;
use crate::element::Real;
use crate::error::{expect_shape, Error, Result};
use crate::indices::Indices;
use crate::view::{TensorView, TensorViewMut};

/// The positions `[B,T]` (shape already checked) of either integer dtype, all checked >= 0.
fn positions_of<'a>(op: &'static str, view: &TensorView<'a>) -> Result<Indices<'a>> {
    let positions = Indices::of(op, "positions", view)?;
    positions.check_non_negative(op, "positions")?;
    Ok(positions)
}

/// `theta` as f32, after checking it is finite and > 0 both as given and once rounded.
fn check_theta(op: &'static str, theta: f64) -> Result<f32> {
    let rounded = theta as f32;
    if theta.is_finite() && theta > 0.0 && rounded.is_finite() && rounded > 0.0 {
        Ok(rounded)
    } else {
        Err(Error::Argument {
            op,
            argument: "theta",
            reason: format!("must be finite and > 0 (also as f32), got {theta}"),
        })
    }
}

/// `(cos, sin)` of the angle of frequency `i` at `position`, in f32 exactly as HF computes it.
fn rotation<T: Real>(theta: f32, position: i64, i: usize, head_dim: usize) -> (T, T) {
    let inv_freq = 1.0f32 / theta.powf((2 * i) as f32 / head_dim as f32);
    let angle = position as f32 * inv_freq;
    (T::of(f64::from(angle.cos())), T::of(f64::from(angle.sin())))
}

/// The `[B,T,H,D]` dims of `operand` (`x`, or `grad_x`); `D` must be even.
fn bthd(op: &'static str, operand: &'static str, shape: &kiln_ir::Shape) -> Result<[usize; 4]> {
    match *shape.dims() {
        [batch, seq, heads, head_dim] if head_dim % 2 == 0 => Ok([batch, seq, heads, head_dim]),
        _ => Err(Error::Shape {
            op,
            operand,
            expected: "[B,T,H,D] with D even".to_string(),
            got: shape.clone(),
        }),
    }
}

fn rope_typed<T: Real>(
    x: &TensorView<'_>,
    positions: Indices<'_>,
    bias: Option<&TensorView<'_>>,
    theta: f32,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rope";
    let [batch, seq, heads, head_dim] = bthd(OP, "x", x.shape())?;
    let x = x.slice::<T>(OP, "x")?;
    let bias = match bias {
        Some(view) => Some(view.slice::<T>(OP, "bias")?),
        None => None,
    };
    let out = out.slice_mut::<T>(OP, "out")?;
    if x.is_empty() {
        return Ok(());
    }
    let half = head_dim / 2;
    for b in 0..batch {
        for t in 0..seq {
            let token = b * seq + t;
            let position = positions.get(token);
            for i in 0..half {
                let (cos, sin) = rotation::<T>(theta, position, i, head_dim);
                for h in 0..heads {
                    let src = (token * heads + h) * head_dim;
                    let dst = ((b * heads + h) * seq + t) * head_dim;
                    let (mut lo, mut hi) = (x[src + i], x[src + i + half]);
                    if let Some(bias) = bias {
                        lo += bias[h * head_dim + i];
                        hi += bias[h * head_dim + i + half];
                    }
                    out[dst + i] = lo * cos - hi * sin;
                    out[dst + i + half] = hi * cos + lo * sin;
                }
            }
        }
    }
    Ok(())
}

/// Split-half RoPE of `x + bias` with the layout change: `x` `[B,T,H,D]`, `positions` `[B,T]`
/// (i32 or i64, >= 0), `bias` `[H*D]`, `out` `[B,H,T,D]`.
pub fn rope(
    x: &TensorView<'_>,
    positions: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    theta: f64,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rope";
    let theta = check_theta(OP, theta)?;
    let [batch, seq, heads, head_dim] = bthd(OP, "x", x.shape())?;
    expect_shape(OP, "positions", positions.shape(), &[batch, seq])?;
    if let Some(bias) = bias {
        // With B or T zero, x may claim an H·D no data could hold; say so instead of overflowing.
        let bias_len = heads.checked_mul(head_dim).ok_or_else(|| Error::Shape {
            op: OP,
            operand: "bias",
            expected: format!("[{heads}*{head_dim}] (overflows)"),
            got: bias.shape().clone(),
        })?;
        expect_shape(OP, "bias", bias.shape(), &[bias_len])?;
    }
    expect_shape(OP, "out", out.shape(), &[batch, heads, seq, head_dim])?;
    let positions = positions_of(OP, positions)?;
    dispatch_real!(OP, x.dtype(), rope_typed(x, positions, bias, theta, out))
}

fn rope_backward_typed<T: Real>(
    grad_out: &TensorView<'_>,
    positions: Indices<'_>,
    theta: f32,
    grad_x: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rope_backward";
    let [batch, seq, heads, head_dim] = bthd(OP, "grad_x", grad_x.shape())?;
    let grad_out = grad_out.slice::<T>(OP, "grad_out")?;
    let grad_x = grad_x.slice_mut::<T>(OP, "grad_x")?;
    if grad_out.is_empty() {
        return Ok(());
    }
    let half = head_dim / 2;
    for b in 0..batch {
        for t in 0..seq {
            let token = b * seq + t;
            let position = positions.get(token);
            for i in 0..half {
                let (cos, sin) = rotation::<T>(theta, position, i, head_dim);
                for h in 0..heads {
                    let src = ((b * heads + h) * seq + t) * head_dim;
                    let dst = (token * heads + h) * head_dim;
                    let (lo, hi) = (grad_out[src + i], grad_out[src + i + half]);
                    grad_x[dst + i] = lo * cos + hi * sin;
                    grad_x[dst + i + half] = hi * cos - lo * sin;
                }
            }
        }
    }
    Ok(())
}

/// Gradient of [`rope`] w.r.t. `x` (and, summed over `B` and `T` by the caller, the bias):
/// `grad_out` `[B,H,T,D]`, `positions` `[B,T]`, `grad_x` `[B,T,H,D]`.
pub fn rope_backward(
    grad_out: &TensorView<'_>,
    positions: &TensorView<'_>,
    theta: f64,
    grad_x: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rope_backward";
    let theta = check_theta(OP, theta)?;
    let [batch, heads, seq, head_dim] = match *grad_out.shape().dims() {
        [b, h, t, d] if d % 2 == 0 => [b, h, t, d],
        _ => {
            return Err(Error::Shape {
                op: OP,
                operand: "grad_out",
                expected: "[B,H,T,D] with D even".to_string(),
                got: grad_out.shape().clone(),
            })
        }
    };
    expect_shape(OP, "positions", positions.shape(), &[batch, seq])?;
    expect_shape(OP, "grad_x", grad_x.shape(), &[batch, seq, heads, head_dim])?;
    let positions = positions_of(OP, positions)?;
    dispatch_real!(
        OP,
        grad_out.dtype(),
        rope_backward_typed(grad_out, positions, theta, grad_x)
    )
}

#[cfg(test)]
#[path = "rope_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "rope_rejection_tests.rs"]
mod rejection_tests;
