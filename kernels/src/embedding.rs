//! Token embedding: a row gather from a table, and its backward scatter-add.
//!
//! Math, with `weight` of shape `[V, H]`, `ids` of any shape `S` (flattened to `N` tokens) and
//! `out` of shape `S ++ [H]`:
//!
//! ```text
//! forward:   out[n, :] = weight[ids[n], :]
//! backward:  grad_weight[v, :] = Σ_{n : ids[n] = v} grad_out[n, :]   (n increasing)
//! ```
//!
//! Layouts: every operand is contiguous row-major. `weight`, `out` and the gradients share one
//! real dtype (f32 or f64), except that a bf16 table (inference) gives f32 rows; `ids` is i32
//! or i64.
//!
//! Invariants:
//! - Every id is checked against `0..V` before anything is written, so a bad id returns
//!   [`Error::IndexOutOfRange`] and leaves the output untouched.
//! - The backward overwrites `grad_weight` (zero, then add) and adds rows in token order, so
//!   repeated ids sum in a fixed order and give the same bits on every run.

use half::bf16;
use kiln_ir::{DType, Shape};

use crate::dispatch_real;
use crate::element::{Element, Real};
use crate::error::{expect_rank, expect_shape, Error, Result};
use crate::indices::Indices;
use crate::view::{TensorView, TensorViewMut};

/// Checks that `got` is `ids_shape ++ [hidden]`, or returns [`Error::Shape`] naming `operand`.
fn expect_token_rows(
    op: &'static str,
    operand: &'static str,
    got: &Shape,
    ids_shape: &Shape,
    hidden: usize,
) -> Result<()> {
    let fits = got
        .dims()
        .split_last()
        .is_some_and(|(&last, prefix)| last == hidden && prefix == ids_shape.dims());
    if fits {
        Ok(())
    } else {
        Err(Error::Shape {
            op,
            operand,
            expected: format!("ids shape {ids_shape} followed by H = {hidden}"),
            got: got.clone(),
        })
    }
}

/// `out[n, :] = widen(weight[ids[n], :])`, for ids already checked against `0..V`.
fn gather<W: Copy, O>(
    weight: &[W],
    ids: Indices<'_>,
    out: &mut [O],
    hidden: usize,
    widen: impl Fn(W) -> O,
) {
    for n in 0..ids.len() {
        let row = ids.get(n) as usize;
        // Ranges are in bounds: n < N with out.len() = N·H, row < V with weight.len() = V·H.
        let source = &weight[row * hidden..(row + 1) * hidden];
        for (o, &w) in out[n * hidden..(n + 1) * hidden].iter_mut().zip(source) {
            *o = widen(w);
        }
    }
}

/// The gather from a table of `W` into rows of `O` (the same real type, or f32 from bf16).
fn embedding_typed<W: Element, O: Element>(
    (weight, ids, out): (&TensorView<'_>, &TensorView<'_>, &mut TensorViewMut<'_>),
    widen: impl Fn(W) -> O,
) -> Result<()> {
    const OP: &str = "embedding";
    let (vocab, hidden) = (weight.shape().dims()[0], weight.shape().dims()[1]);
    let table = weight.slice::<W>(OP, "weight")?;
    let rows = out.slice_mut::<O>(OP, "out")?;
    let ids = Indices::of(OP, "ids", ids)?;
    ids.check_below(OP, "ids", vocab, None)?;
    gather(table, ids, rows, hidden, widen);
    Ok(())
}

/// `out[n, :] = weight[ids[n], :]` for every token `n` of `ids`.
///
/// `weight` is `[V, H]` (f32, f64 or bf16), `ids` has any shape `S` (i32 or i64), `out` is
/// `S ++ [H]` with `weight`'s dtype (f32 for a bf16 table: rows widened exactly). An id
/// outside `0..V` is [`Error::IndexOutOfRange`] on `ids`; ids of another dtype are
/// [`Error::DType`] on `ids`.
pub fn embedding(
    weight: &TensorView<'_>,
    ids: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding";
    expect_rank(OP, "weight", weight.shape(), 2)?;
    expect_token_rows(
        OP,
        "out",
        out.shape(),
        ids.shape(),
        weight.shape().dims()[1],
    )?;
    let operands = (weight, ids, out);
    match weight.dtype() {
        DType::F32 => embedding_typed::<f32, f32>(operands, |w| w),
        DType::F64 => embedding_typed::<f64, f64>(operands, |w| w),
        DType::BF16 => embedding_typed::<bf16, f32>(operands, |w| w.to_f32()),
        other => Err(Error::UnsupportedDType {
            op: OP,
            dtype: other,
            supported: "f32, f64, bf16",
        }),
    }
}

/// `grad_weight[ids[n], :] += grad_out[n, :]` in token order, for ids already checked against
/// `0..V`, after zeroing `grad_weight`.
fn scatter_add<T: Real>(ids: Indices<'_>, grad_out: &[T], grad_weight: &mut [T], hidden: usize) {
    grad_weight.fill(T::zero());
    // Token order fixes the summation order of repeated ids.
    for n in 0..ids.len() {
        let row = ids.get(n) as usize;
        let src = &grad_out[n * hidden..(n + 1) * hidden];
        for (g, &s) in grad_weight[row * hidden..(row + 1) * hidden]
            .iter_mut()
            .zip(src)
        {
            *g += s;
        }
    }
}

fn embedding_backward_typed<T: Real>(
    ids: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    base: Option<&TensorView<'_>>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    let (vocab, hidden) = (grad_weight.shape().dims()[0], grad_weight.shape().dims()[1]);
    let base = match base {
        Some(base) => {
            expect_shape(OP, "base", base.shape(), &[vocab, hidden])?;
            Some(base.slice::<T>(OP, "base")?)
        }
        None => None,
    };
    let rows = grad_out.slice::<T>(OP, "grad_out")?;
    let table = grad_weight.slice_mut::<T>(OP, "grad_weight")?;
    let ids = Indices::of(OP, "ids", ids)?;
    ids.check_below(OP, "ids", vocab, None)?;
    scatter_add(ids, rows, table, hidden);
    if let Some(base) = base {
        for (g, &b) in table.iter_mut().zip(base) {
            *g += b;
        }
    }
    Ok(())
}

/// The VJP of [`embedding`] with respect to `weight`: `grad_weight` (`[V, H]`) is overwritten
/// with zeros, then `grad_out[n, :]` is added to row `ids[n]` for `n` in increasing order;
/// with `base` (`[V, H]`, of `grad_weight`'s dtype), each element then has `base`'s added (a
/// tied embedding's gradient, the LM head's plus this one).
pub fn embedding_backward(
    ids: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    base: Option<&TensorView<'_>>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    expect_rank(OP, "grad_weight", grad_weight.shape(), 2)?;
    let hidden = grad_weight.shape().dims()[1];
    expect_token_rows(OP, "grad_out", grad_out.shape(), ids.shape(), hidden)?;
    dispatch_real!(
        OP,
        grad_weight.dtype(),
        embedding_backward_typed(ids, grad_out, base, grad_weight)
    )
}

#[cfg(test)]
mod tests;
