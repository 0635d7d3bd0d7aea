//! Elementwise arithmetic with suffix broadcasting, and the reduction that is its VJP.
//!
//! Broadcast rule: in `add(a, b)` and `mul(a, b)`, `b`'s shape equals `a`'s or is a suffix of
//! it (a bias `[O]` over activations `[N, O]`, a scalar `[]` over anything). With every operand
//! contiguous row-major, `a` is then `outer` rows of `inner = numel(b)` elements and
//!
//! ```text
//! add:           out[i, j] = a[i, j] + b[j]
//! mul:           out[i, j] = a[i, j] · b[j]
//! scale:         out = alpha · a               (alpha rounded to the dtype first)
//! sum_to_shape:  out[j] = Σ_i src[i, j]        (i increasing, starting from 0)
//! broadcast_to:  out[i, j] = src[j]            (the VJP of sum_to_shape)
//! accumulate:    dst += src                    (same shape)
//! ```
//!
//! `sum_to_shape` undoes a broadcast for gradients: for `out = a + b`, `grad_b =
//! sum_to_shape(grad_out)`; for `out = a · b`, `grad_a = grad_out · b` and `grad_b =
//! sum_to_shape(grad_out · a)`.
//!
//! All operands of one call share one real dtype (f32 or f64). Outputs are overwritten, except
//! `accumulate`'s `dst`, which is added to in place.

use kiln_ir::Shape;

use crate::dispatch_real;
use crate::element::Real;
use crate::error::{expect_shape, Error, Result};
use crate::view::{TensorView, TensorViewMut};

/// Checks that `got`'s dims are a trailing part of `of`'s (suffix broadcasting), or returns
/// [`Error::Shape`] naming `operand`.
fn expect_suffix(op: &'static str, operand: &'static str, got: &Shape, of: &Shape) -> Result<()> {
    if of.dims().ends_with(got.dims()) {
        Ok(())
    } else {
        Err(Error::Shape {
            op,
            operand,
            expected: format!("a suffix of {of}"),
            got: got.clone(),
        })
    }
}

/// `out[i, j] = combine(a[i, j], b[j])` over rows of length `numel(b)`.
fn broadcast_binary<T: Real>(
    op: &'static str,
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    combine: impl Fn(T, T) -> T,
) -> Result<()> {
    let a = a.slice::<T>(op, "a")?;
    let b = b.slice::<T>(op, "b")?;
    let out = out.slice_mut::<T>(op, "out")?;
    if b.is_empty() {
        // b's dims are a suffix of a's, so a has a zero dim too: nothing to write.
        return Ok(());
    }
    for (out_row, a_row) in out.chunks_exact_mut(b.len()).zip(a.chunks_exact(b.len())) {
        for ((o, &x), &y) in out_row.iter_mut().zip(a_row).zip(b) {
            *o = combine(x, y);
        }
    }
    Ok(())
}

fn check_binary(
    op: &'static str,
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &TensorViewMut<'_>,
) -> Result<()> {
    expect_suffix(op, "b", b.shape(), a.shape())?;
    expect_shape(op, "out", out.shape(), a.shape().dims())
}

fn add_typed<T: Real>(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    broadcast_binary::<T>("add", a, b, out, |x, y| x + y)
}

/// `out = a + b`, with `b`'s shape equal to `a`'s or a suffix of it; `out` has `a`'s shape.
pub fn add(a: &TensorView<'_>, b: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    check_binary("add", a, b, out)?;
    dispatch_real!("add", a.dtype(), add_typed(a, b, out))
}

fn mul_typed<T: Real>(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    broadcast_binary::<T>("mul", a, b, out, |x, y| x * y)
}

/// `out = a · b` elementwise, with the broadcast rule of [`add`].
pub fn mul(a: &TensorView<'_>, b: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    check_binary("mul", a, b, out)?;
    dispatch_real!("mul", a.dtype(), mul_typed(a, b, out))
}

fn scale_typed<T: Real>(a: &TensorView<'_>, alpha: f64, out: &mut TensorViewMut<'_>) -> Result<()> {
    let a = a.slice::<T>("scale", "a")?;
    let out = out.slice_mut::<T>("scale", "out")?;
    let alpha = T::of(alpha);
    for (o, &x) in out.iter_mut().zip(a) {
        *o = alpha * x;
    }
    Ok(())
}

/// `out = alpha · a`, with `alpha` first rounded to the dtype of `a`.
pub fn scale(a: &TensorView<'_>, alpha: f64, out: &mut TensorViewMut<'_>) -> Result<()> {
    expect_shape("scale", "out", out.shape(), a.shape().dims())?;
    dispatch_real!("scale", a.dtype(), scale_typed(a, alpha, out))
}

fn sum_to_shape_typed<T: Real>(src: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    let src = src.slice::<T>("sum_to_shape", "src")?;
    let out = out.slice_mut::<T>("sum_to_shape", "out")?;
    out.fill(T::zero());
    if out.is_empty() {
        return Ok(());
    }
    // Whole rows in increasing i: the summation order is fixed by the layout alone.
    for row in src.chunks_exact(out.len()) {
        for (o, &s) in out.iter_mut().zip(row) {
            *o += s;
        }
    }
    Ok(())
}

/// `out[j] = Σ_i src[i, j]` over the leading dims of `src` that `out` lacks (`out`'s shape is a
/// suffix of `src`'s), summed in increasing `i`. `out` is overwritten. This is the VJP of
/// broadcasting `out`'s shape up to `src`'s.
pub fn sum_to_shape(src: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    expect_suffix("sum_to_shape", "out", out.shape(), src.shape())?;
    dispatch_real!("sum_to_shape", src.dtype(), sum_to_shape_typed(src, out))
}

fn accumulate_typed<T: Real>(dst: &mut TensorViewMut<'_>, src: &TensorView<'_>) -> Result<()> {
    let src = src.slice::<T>("accumulate", "src")?;
    let dst = dst.slice_mut::<T>("accumulate", "dst")?;
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s;
    }
    Ok(())
}

/// `dst += src` for two tensors of the same shape: how gradient buffers accumulate in place.
pub fn accumulate(dst: &mut TensorViewMut<'_>, src: &TensorView<'_>) -> Result<()> {
    expect_shape("accumulate", "src", src.shape(), dst.shape().dims())?;
    dispatch_real!("accumulate", dst.dtype(), accumulate_typed(dst, src))
}

fn broadcast_to_typed<T: Real>(src: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    let src = src.slice::<T>("broadcast_to", "src")?;
    let out = out.slice_mut::<T>("broadcast_to", "out")?;
    if src.is_empty() {
        // src's dims are a suffix of out's, so out has a zero dim too: nothing to write.
        return Ok(());
    }
    for row in out.chunks_exact_mut(src.len()) {
        row.copy_from_slice(src);
    }
    Ok(())
}

/// `out[i, j] = src[j]`: `src` repeated over the leading dims of `out` that it lacks (`src`'s
/// shape is a suffix of `out`'s). `out` is overwritten. This is the VJP of [`sum_to_shape`].
pub fn broadcast_to(src: &TensorView<'_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    expect_suffix("broadcast_to", "src", src.shape(), out.shape())?;
    dispatch_real!("broadcast_to", src.dtype(), broadcast_to_typed(src, out))
}

#[cfg(test)]
mod broadcast_to_tests;
#[cfg(test)]
mod tests;
