//! Elementwise and row-wise activations: SwiGLU and softmax, forward and backward.
//!
//! Math:
//!
//! ```text
//! swiglu(gate, up) = silu(gate) · up,         silu(x) = x / (1 + exp(−x)) = x · σ(x)
//! ∂/∂gate = grad_out · up · σ(gate) · (1 + gate · (1 − σ(gate))),   ∂/∂up = grad_out · silu(gate)
//!
//! softmax(x)_i = exp(x_i − max x) / Σ_j exp(x_j − max x)     over the last dimension
//! grad_x = y ⊙ (grad_out − Σ_j grad_out_j · y_j)              with y the softmax output
//! ```
//!
//! Every operand is contiguous, of one float dtype (f32 or f64) and of one shape; softmax works
//! on rows of the last dimension (a rank-0 tensor is one row of one element). Subtracting the
//! row max keeps `exp` from overflowing for large inputs and cancels in the ratio. Row sums run
//! serially from the first element, so results are reproducible bit for bit.

use crate::dispatch_real;
use crate::element::Real;
use crate::error::{expect_shape, Error, Result};
use crate::view::{TensorView, TensorViewMut};

/// The logistic function `1 / (1 + exp(−x))`; saturates to 0 or 1 without producing NaN.
fn sigmoid<T: Real>(x: T) -> T {
    T::one() / (T::one() + (-x).exp())
}

/// `out = silu(gate) · up`, elementwise over same-shaped `gate`, `up` and `out`.
pub fn swiglu(
    gate: &TensorView<'_>,
    up: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "swiglu";
    let shape = gate.shape().dims();
    expect_shape(OP, "up", up.shape(), shape)?;
    expect_shape(OP, "out", out.shape(), shape)?;
    dispatch_real!(OP, gate.dtype(), swiglu_typed(gate, up, out))
}

fn swiglu_typed<T: Real>(
    gate: &TensorView<'_>,
    up: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "swiglu";
    let gate = gate.slice::<T>(OP, "gate")?;
    let up = up.slice::<T>(OP, "up")?;
    let out = out.slice_mut::<T>(OP, "out")?;
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = g / (T::one() + (-g).exp()) * u;
    }
    Ok(())
}

/// Gradients of [`swiglu`]: overwrites `grad_gate` and `grad_up` from `gate`, `up` and
/// `grad_out` (all of one shape).
pub fn swiglu_backward(
    gate: &TensorView<'_>,
    up: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_gate: &mut TensorViewMut<'_>,
    grad_up: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "swiglu_backward";
    let shape = gate.shape().dims();
    expect_shape(OP, "up", up.shape(), shape)?;
    expect_shape(OP, "grad_out", grad_out.shape(), shape)?;
    expect_shape(OP, "grad_gate", grad_gate.shape(), shape)?;
    expect_shape(OP, "grad_up", grad_up.shape(), shape)?;
    dispatch_real!(
        OP,
        gate.dtype(),
        swiglu_backward_typed(gate, up, grad_out, grad_gate, grad_up)
    )
}

fn swiglu_backward_typed<T: Real>(
    gate: &TensorView<'_>,
    up: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_gate: &mut TensorViewMut<'_>,
    grad_up: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "swiglu_backward";
    let gate = gate.slice::<T>(OP, "gate")?;
    let up = up.slice::<T>(OP, "up")?;
    let grad_out = grad_out.slice::<T>(OP, "grad_out")?;
    let grad_gate = grad_gate.slice_mut::<T>(OP, "grad_gate")?;
    let grad_up = grad_up.slice_mut::<T>(OP, "grad_up")?;
    let inputs = gate.iter().zip(up).zip(grad_out);
    for ((dg, du), ((&g, &u), &dout)) in grad_gate.iter_mut().zip(grad_up.iter_mut()).zip(inputs) {
        let sig = sigmoid(g);
        // silu'(x) = σ(x) + x·σ(x)·(1 − σ(x)).
        let silu_grad = sig * (T::one() + g * (T::one() - sig));
        *dg = dout * u * silu_grad;
        *du = dout * (g / (T::one() + (-g).exp()));
    }
    Ok(())
}

/// Softmax over the last dimension of `x` into `out` (same shape), max-subtracted.
pub fn softmax(x: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    const OP: &str = "softmax";
    expect_shape(OP, "out", out.shape(), x.shape().dims())?;
    dispatch_real!(OP, x.dtype(), softmax_typed(x, out))
}

fn softmax_typed<T: Real>(x: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    const OP: &str = "softmax";
    let row_len = x.shape().last_dim();
    let x = x.slice::<T>(OP, "x")?;
    let out = out.slice_mut::<T>(OP, "out")?;
    if x.is_empty() {
        // Also covers a zero-length last dim, which chunks_exact would reject.
        return Ok(());
    }
    for (x_row, out_row) in x.chunks_exact(row_len).zip(out.chunks_exact_mut(row_len)) {
        let max = x_row.iter().fold(T::neg_infinity(), |m, &v| m.max(v));
        let mut sum = T::zero();
        for (o, &v) in out_row.iter_mut().zip(x_row) {
            *o = (v - max).exp();
            sum += *o;
        }
        for o in out_row.iter_mut() {
            *o /= sum;
        }
    }
    Ok(())
}

/// The index of each last-dim row's largest element of `x` into `out` (i64, `x`'s shape
/// without its last dim): ties go to the lowest index, and a row with no largest element — one
/// holding a NaN, all -inf, or empty — gives -1 (as the host's greedy sampler refuses it).
pub fn argmax(x: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    const OP: &str = "argmax";
    let dims = x.shape().dims();
    let Some((_, rows)) = dims.split_last() else {
        return Err(Error::Shape {
            op: OP,
            operand: "x",
            expected: "rank 1 or more".to_string(),
            got: x.shape().clone(),
        });
    };
    expect_shape(OP, "out", out.shape(), rows)?;
    dispatch_real!(OP, x.dtype(), argmax_typed(x, out))
}

fn argmax_typed<T: Real>(x: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    const OP: &str = "argmax";
    let row_len = x.shape().last_dim();
    let x = x.slice::<T>(OP, "x")?;
    let out = out.slice_mut::<i64>(OP, "out")?;
    if row_len == 0 {
        out.fill(-1);
        return Ok(());
    }
    for (row, best) in x.chunks_exact(row_len).zip(out.iter_mut()) {
        *best = if row.iter().any(|v| v.is_nan()) {
            -1
        } else {
            let mut at = 0;
            for (j, &v) in row.iter().enumerate() {
                if v > row[at] {
                    at = j;
                }
            }
            match row[at] == T::neg_infinity() {
                true => -1,
                false => at as i64,
            }
        };
    }
    Ok(())
}

/// Gradient of [`softmax`] from its output `y`: `grad_x = y ⊙ (grad_out − rowsum(grad_out ⊙ y))`
/// (all of one shape).
pub fn softmax_backward(
    y: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_x: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "softmax_backward";
    let shape = y.shape().dims();
    expect_shape(OP, "grad_out", grad_out.shape(), shape)?;
    expect_shape(OP, "grad_x", grad_x.shape(), shape)?;
    dispatch_real!(OP, y.dtype(), softmax_backward_typed(y, grad_out, grad_x))
}

fn softmax_backward_typed<T: Real>(
    y: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_x: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "softmax_backward";
    let row_len = y.shape().last_dim();
    let y = y.slice::<T>(OP, "y")?;
    let grad_out = grad_out.slice::<T>(OP, "grad_out")?;
    let grad_x = grad_x.slice_mut::<T>(OP, "grad_x")?;
    if y.is_empty() {
        return Ok(());
    }
    let rows = y.chunks_exact(row_len).zip(grad_out.chunks_exact(row_len));
    for (gx_row, (y_row, go_row)) in grad_x.chunks_exact_mut(row_len).zip(rows) {
        let mut y_dot_grad = T::zero();
        for (&yi, &gi) in y_row.iter().zip(go_row) {
            y_dot_grad += yi * gi;
        }
        for ((gx, &yi), &gi) in gx_row.iter_mut().zip(y_row).zip(go_row) {
            *gx = yi * (gi - y_dot_grad);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
