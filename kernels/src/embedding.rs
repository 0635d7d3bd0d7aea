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
//! real dtype (f32 or f64); `ids` is i32 or i64.
//!
//! Invariants:
//! - Every id is checked against `0..V` before anything is written, so a bad id returns
//!   [`Error::IndexOutOfRange`] and leaves the output untouched.
//! - The backward overwrites `grad_weight` (zero, then add) and adds rows in token order, so
//!   repeated ids sum in a fixed order and give the same bits on every run.

use kiln_ir::{DType, Shape};

use crate::dispatch_real;
use crate::element::Real;
use crate::error::{expect_rank, Error, Result};
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

/// Checks every id against `0..vocab` before anything is written, failing on the first bad one.
fn check_ids<I: Copy + Into<i64>>(op: &'static str, ids: &[I], vocab: usize) -> Result<()> {
    for (at, &id) in ids.iter().enumerate() {
        row_of(op, at, id, vocab)?;
    }
    Ok(())
}

/// The table row of `id` (token `at`), or [`Error::IndexOutOfRange`] naming `ids`.
fn row_of<I: Copy + Into<i64>>(op: &'static str, at: usize, id: I, vocab: usize) -> Result<usize> {
    let value: i64 = id.into();
    usize::try_from(value)
        .ok()
        .filter(|&row| row < vocab)
        .ok_or(Error::IndexOutOfRange {
            op,
            operand: "ids",
            at,
            value,
            bound: vocab,
        })
}

fn unsupported_ids(op: &'static str, dtype: DType) -> Error {
    Error::UnsupportedDType {
        op,
        dtype,
        supported: "i32, i64 for `ids`",
    }
}

fn gather<T: Real, I: Copy + Into<i64>>(
    weight: &[T],
    ids: &[I],
    out: &mut [T],
    vocab: usize,
    hidden: usize,
) -> Result<()> {
    const OP: &str = "embedding";
    check_ids(OP, ids, vocab)?;
    for (n, &id) in ids.iter().enumerate() {
        let row = row_of(OP, n, id, vocab)?;
        // Ranges are in bounds: n < N with out.len() = N·H, row < V with weight.len() = V·H.
        out[n * hidden..(n + 1) * hidden]
            .copy_from_slice(&weight[row * hidden..(row + 1) * hidden]);
    }
    Ok(())
}

fn embedding_typed<T: Real>(
    weight: &TensorView<'_>,
    ids: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding";
    let (vocab, hidden) = (weight.shape().dims()[0], weight.shape().dims()[1]);
    let table = weight.slice::<T>(OP, "weight")?;
    let rows = out.slice_mut::<T>(OP, "out")?;
    match ids.dtype() {
        DType::I32 => gather(table, ids.slice::<i32>(OP, "ids")?, rows, vocab, hidden),
        DType::I64 => gather(table, ids.slice::<i64>(OP, "ids")?, rows, vocab, hidden),
        other => Err(unsupported_ids(OP, other)),
    }
}

/// `out[n, :] = weight[ids[n], :]` for every token `n` of `ids`.
///
/// `weight` is `[V, H]` (f32 or f64), `ids` has any shape `S` (i32 or i64), `out` is `S ++ [H]`
/// with `weight`'s dtype. An id outside `0..V` is [`Error::IndexOutOfRange`] on `ids`.
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
    dispatch_real!(OP, weight.dtype(), embedding_typed(weight, ids, out))
}

fn scatter_add<T: Real, I: Copy + Into<i64>>(
    ids: &[I],
    grad_out: &[T],
    grad_weight: &mut [T],
    vocab: usize,
    hidden: usize,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    check_ids(OP, ids, vocab)?;
    grad_weight.fill(T::zero());
    // Token order fixes the summation order of repeated ids.
    for (n, &id) in ids.iter().enumerate() {
        let row = row_of(OP, n, id, vocab)?;
        let src = &grad_out[n * hidden..(n + 1) * hidden];
        for (g, &s) in grad_weight[row * hidden..(row + 1) * hidden]
            .iter_mut()
            .zip(src)
        {
            *g += s;
        }
    }
    Ok(())
}

fn embedding_backward_typed<T: Real>(
    ids: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    let (vocab, hidden) = (grad_weight.shape().dims()[0], grad_weight.shape().dims()[1]);
    let rows = grad_out.slice::<T>(OP, "grad_out")?;
    let table = grad_weight.slice_mut::<T>(OP, "grad_weight")?;
    match ids.dtype() {
        DType::I32 => scatter_add(ids.slice::<i32>(OP, "ids")?, rows, table, vocab, hidden),
        DType::I64 => scatter_add(ids.slice::<i64>(OP, "ids")?, rows, table, vocab, hidden),
        other => Err(unsupported_ids(OP, other)),
    }
}

/// The VJP of [`embedding`] with respect to `weight`: `grad_weight` (`[V, H]`) is overwritten
/// with zeros, then `grad_out[n, :]` is added to row `ids[n]` for `n` in increasing order.
pub fn embedding_backward(
    ids: &TensorView<'_>,
    grad_out: &TensorView<'_>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "embedding_backward";
    expect_rank(OP, "grad_weight", grad_weight.shape(), 2)?;
    let hidden = grad_weight.shape().dims()[1];
    expect_token_rows(OP, "grad_out", grad_out.shape(), ids.shape(), hidden)?;
    dispatch_real!(
        OP,
        grad_weight.dtype(),
        embedding_backward_typed(ids, grad_out, grad_weight)
    )
}

#[cfg(test)]
mod tests;
