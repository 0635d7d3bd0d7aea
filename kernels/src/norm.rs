//! RMSNorm and its fused residual-add form, computed as Hugging Face Qwen2/Llama compute them.
//!
//! Every dimension but the last indexes a row; each row `x` of length `H` is normalized alone:
//!
//! ```text
//! rstd  = 1 / sqrt(mean(x²) + eps)            (mean = Σ x_k² / H, summed in index order)
//! out_j = (x_j · rstd) · w_j                   (this multiplication order, as HF does)
//! ```
//!
//! Backward, with `g` the cotangent of `out` and `s = Σ_k g_k · w_k · x_k`:
//!
//! ```text
//! ∂L/∂x_j = rstd · w_j · g_j − x_j · rstd³ · s / H
//! ∂L/∂w_j = Σ_rows g_j · (x_j · rstd)          (rows summed in row order)
//! ```
//!
//! `add_rmsnorm` returns `sum = x + residual` and `out = rmsnorm(sum)` in one call. `sum` is
//! linear in both `x` and `residual` with unit coefficients, so one gradient, `grad_input`
//! (the gradient through the norm plus the cotangent of `sum`, if any), serves both.
//!
//! Layouts and invariants: every operand is contiguous and row-major; `x`, `residual`, `sum`,
//! `out` and all their gradients have the same shape `[..., H]` (rank >= 1); `weight` and
//! `grad_weight` are `[H]`. All operands share `x`'s dtype (f32 or f64). `H = 0` and zero rows
//! are valid (there is nothing to normalize; `grad_weight` becomes zeros). `eps` must be finite
//! and >= 0; it is rounded to the tensors' dtype before it is added, as PyTorch does.

use crate::dispatch_real;
use crate::element::Real;
use crate::error::{expect_shape, Error, Result};
use crate::view::{TensorView, TensorViewMut};

/// Rejects an `eps` that is negative, NaN or infinite.
fn check_eps(op: &'static str, eps: f64) -> Result<()> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(Error::Argument {
            op,
            argument: "eps",
            reason: format!("must be finite and >= 0, got {eps}"),
        })
    }
}

/// The row length `H` of `operand`, which must have rank >= 1 (a scalar has no rows to normalize).
fn hidden_size(op: &'static str, operand: &'static str, view: &TensorView<'_>) -> Result<usize> {
    match view.shape().dims().last() {
        Some(&hidden) => Ok(hidden),
        None => Err(Error::Shape {
            op,
            operand,
            expected: "[...,H] (rank >= 1)".to_string(),
            got: view.shape().clone(),
        }),
    }
}

/// `1 / sqrt(mean(row²) + eps)` with the squares summed in index order. `row` is not empty.
fn inverse_rms<T: Real>(row: &[T], eps: T) -> T {
    let mut sum_of_squares = T::zero();
    for &v in row {
        sum_of_squares += v * v;
    }
    let mean = sum_of_squares / T::of(row.len() as f64);
    T::one() / (mean + eps).sqrt()
}

/// `out = rmsnorm(x)` row by row; lengths were validated by the caller.
fn normalize_rows<T: Real>(x: &[T], weight: &[T], eps: T, out: &mut [T]) {
    let hidden = weight.len();
    if hidden == 0 {
        return;
    }
    for (x_row, out_row) in x.chunks_exact(hidden).zip(out.chunks_exact_mut(hidden)) {
        let rstd = inverse_rms(x_row, eps);
        for ((o, &v), &w) in out_row.iter_mut().zip(x_row).zip(weight) {
            *o = (v * rstd) * w;
        }
    }
}

/// Gradients of `rmsnorm(x)` for cotangent `grad_out`: overwrites `grad_x` and `grad_weight`.
fn backward_rows<T: Real>(
    x: &[T],
    weight: &[T],
    grad_out: &[T],
    eps: T,
    grad_x: &mut [T],
    grad_weight: &mut [T],
) {
    grad_weight.fill(T::zero());
    let hidden = weight.len();
    if hidden == 0 {
        return;
    }
    let hidden_t = T::of(hidden as f64);
    let rows = x
        .chunks_exact(hidden)
        .zip(grad_out.chunks_exact(hidden))
        .zip(grad_x.chunks_exact_mut(hidden));
    for ((x_row, g_row), gx_row) in rows {
        let rstd = inverse_rms(x_row, eps);
        let mut projection = T::zero();
        for ((&g, &w), &v) in g_row.iter().zip(weight).zip(x_row) {
            projection += g * w * v;
        }
        // rstd depends on every x_k, so each input also feels the whole row through rstd³.
        let through_rstd = rstd * rstd * rstd * projection / hidden_t;
        for (((gx, &g), &w), &v) in gx_row.iter_mut().zip(g_row).zip(weight).zip(x_row) {
            *gx = rstd * w * g - v * through_rstd;
        }
        for ((gw, &g), &v) in grad_weight.iter_mut().zip(g_row).zip(x_row) {
            *gw += g * (v * rstd);
        }
    }
}

fn rmsnorm_typed<T: Real>(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    eps: f64,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rmsnorm";
    let x = x.slice::<T>(OP, "x")?;
    let weight = weight.slice::<T>(OP, "weight")?;
    let out = out.slice_mut::<T>(OP, "out")?;
    normalize_rows(x, weight, T::of(eps), out);
    Ok(())
}

/// `out = (x · rstd) · weight` with `rstd = 1/sqrt(mean(x²) + eps)` over the last dim.
///
/// `x`, `out`: `[..., H]`; `weight`: `[H]`.
pub fn rmsnorm(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    eps: f64,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rmsnorm";
    check_eps(OP, eps)?;
    let hidden = hidden_size(OP, "x", x)?;
    expect_shape(OP, "weight", weight.shape(), &[hidden])?;
    expect_shape(OP, "out", out.shape(), x.shape().dims())?;
    dispatch_real!(OP, x.dtype(), rmsnorm_typed(x, weight, eps, out))
}

fn rmsnorm_backward_typed<T: Real>(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    eps: f64,
    grad_x: &mut TensorViewMut<'_>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rmsnorm_backward";
    let x = x.slice::<T>(OP, "x")?;
    let weight = weight.slice::<T>(OP, "weight")?;
    let grad_out = grad_out.slice::<T>(OP, "grad_out")?;
    let grad_x = grad_x.slice_mut::<T>(OP, "grad_x")?;
    let grad_weight = grad_weight.slice_mut::<T>(OP, "grad_weight")?;
    backward_rows(x, weight, grad_out, T::of(eps), grad_x, grad_weight);
    Ok(())
}

/// Gradients of [`rmsnorm`] for the cotangent `grad_out`: `grad_x` (`[..., H]`) and
/// `grad_weight` (`[H]`, overwritten with the sum over rows in row order).
pub fn rmsnorm_backward(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    eps: f64,
    grad_x: &mut TensorViewMut<'_>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "rmsnorm_backward";
    check_eps(OP, eps)?;
    let hidden = hidden_size(OP, "x", x)?;
    expect_shape(OP, "weight", weight.shape(), &[hidden])?;
    expect_shape(OP, "grad_out", grad_out.shape(), x.shape().dims())?;
    expect_shape(OP, "grad_x", grad_x.shape(), x.shape().dims())?;
    expect_shape(OP, "grad_weight", grad_weight.shape(), &[hidden])?;
    dispatch_real!(
        OP,
        x.dtype(),
        rmsnorm_backward_typed(x, weight, grad_out, eps, grad_x, grad_weight)
    )
}

fn add_rmsnorm_typed<T: Real>(
    x: &TensorView<'_>,
    residual: &TensorView<'_>,
    weight: &TensorView<'_>,
    eps: f64,
    sum: &mut TensorViewMut<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "add_rmsnorm";
    let x = x.slice::<T>(OP, "x")?;
    let residual = residual.slice::<T>(OP, "residual")?;
    let weight = weight.slice::<T>(OP, "weight")?;
    let sum = sum.slice_mut::<T>(OP, "sum")?;
    let out = out.slice_mut::<T>(OP, "out")?;
    for ((s, &a), &r) in sum.iter_mut().zip(x).zip(residual) {
        *s = a + r;
    }
    normalize_rows(sum, weight, T::of(eps), out);
    Ok(())
}

/// Fused residual add and RMSNorm: `sum = x + residual`, `out = rmsnorm(sum, weight, eps)`.
///
/// `x`, `residual`, `sum`, `out`: `[..., H]`; `weight`: `[H]`.
pub fn add_rmsnorm(
    x: &TensorView<'_>,
    residual: &TensorView<'_>,
    weight: &TensorView<'_>,
    eps: f64,
    sum: &mut TensorViewMut<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "add_rmsnorm";
    check_eps(OP, eps)?;
    let hidden = hidden_size(OP, "x", x)?;
    let dims = x.shape().dims();
    expect_shape(OP, "residual", residual.shape(), dims)?;
    expect_shape(OP, "weight", weight.shape(), &[hidden])?;
    expect_shape(OP, "sum", sum.shape(), dims)?;
    expect_shape(OP, "out", out.shape(), dims)?;
    dispatch_real!(
        OP,
        x.dtype(),
        add_rmsnorm_typed(x, residual, weight, eps, sum, out)
    )
}

fn add_rmsnorm_backward_typed<T: Real>(
    sum: &TensorView<'_>,
    weight: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_sum: Option<&TensorView<'_>>,
    eps: f64,
    grad_input: &mut TensorViewMut<'_>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "add_rmsnorm_backward";
    let sum = sum.slice::<T>(OP, "sum")?;
    let weight = weight.slice::<T>(OP, "weight")?;
    let grad_out = grad_out.slice::<T>(OP, "grad_out")?;
    let grad_sum = match grad_sum {
        Some(view) => Some(view.slice::<T>(OP, "grad_sum")?),
        None => None,
    };
    let grad_input = grad_input.slice_mut::<T>(OP, "grad_input")?;
    let grad_weight = grad_weight.slice_mut::<T>(OP, "grad_weight")?;
    backward_rows(sum, weight, grad_out, T::of(eps), grad_input, grad_weight);
    if let Some(grad_sum) = grad_sum {
        for (gi, &gs) in grad_input.iter_mut().zip(grad_sum) {
            *gi += gs;
        }
    }
    Ok(())
}

/// Gradients of [`add_rmsnorm`] from the saved `sum`: `grad_input` (`[..., H]`) is the gradient
/// of both `x` and `residual` (through the norm, plus `grad_sum` if given); `grad_weight`
/// (`[H]`) is overwritten with the sum over rows in row order.
pub fn add_rmsnorm_backward(
    sum: &TensorView<'_>,
    weight: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_sum: Option<&TensorView<'_>>,
    eps: f64,
    grad_input: &mut TensorViewMut<'_>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "add_rmsnorm_backward";
    check_eps(OP, eps)?;
    let hidden = hidden_size(OP, "sum", sum)?;
    let dims = sum.shape().dims();
    expect_shape(OP, "weight", weight.shape(), &[hidden])?;
    expect_shape(OP, "grad_out", grad_out.shape(), dims)?;
    if let Some(grad_sum) = grad_sum {
        expect_shape(OP, "grad_sum", grad_sum.shape(), dims)?;
    }
    expect_shape(OP, "grad_input", grad_input.shape(), dims)?;
    expect_shape(OP, "grad_weight", grad_weight.shape(), &[hidden])?;
    dispatch_real!(
        OP,
        sum.dtype(),
        add_rmsnorm_backward_typed(
            sum,
            weight,
            grad_out,
            grad_sum,
            eps,
            grad_input,
            grad_weight
        )
    )
}

#[cfg(test)]
#[path = "norm_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "norm_rejection_tests.rs"]
mod rejection_tests;
