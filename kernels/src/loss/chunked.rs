//! The LM head and its cross-entropy in one, over vocabulary chunks: the logits `x · wᵀ [N,V]`
//! and their gradient never exist whole, only one chunk of [`chunk_columns`] columns at a
//! time (the device kernels, kernels/src/gpu/loss.rs, take the same chunks).
//!
//! `x [N,H]` and `w [V,H]` are f32, or bf16 (mixed precision: the GEMM dtype), with products
//! accumulated in f32. Forward, per chunk `c` of columns, each row's maximum and sum of
//! exponentials merged online as the device does:
//!
//! ```text
//! L = x · w[c]ᵀ (f32)        (m_c, s_c) = max of the row, Σ exp(L − m_c)
//! m' = max(m, m_c)           s = s·exp(m − m') + s_c·exp(m_c − m')        (from m = −∞, s = 0)
//! lse = m + ln s             loss = (1/C) Σ_counted ( ln s − (L[t] − m) )
//! ```
//!
//! Backward, the chunk's logits rebuilt from `x` and `w` and their probabilities from `lse`:
//!
//! ```text
//! dL = r((exp(L − lse) − [j == t]) · grad_loss / C)      (0 on ignored rows)
//! grad_w[c] = r(dLᵀ · x)        acc = dL · w[c] + acc        grad_x = r(acc)
//! ```
//!
//! `r` rounds to the GEMM dtype where the device's GEMMs take or give it (the identity in f32).
//! With one chunk and f32 operands this is `cross_entropy` of `matmul(x, wᵀ)` and its
//! backward up to f32 rounding. Targets are checked as [`super::cross_entropy`] checks them;
//! `C` counts the rows not ignored (0/0 = NaN with none, as torch). Every sum runs in a fixed
//! order: bit-for-bit reproducible.

use half::bf16;
use kiln_ir::DType;

use super::{check_targets, Problem};
use crate::error::{expect_rank, expect_shape, Error, Result};
use crate::matmul::{matmul, Transpose};
use crate::view::{TensorView, TensorViewMut};

/// The most bytes one chunk's f32 logits `[N, columns]`, or its f32 weight gradient
/// `[columns, H]`, take (the device's workspace holds the logits, and in bf16 the weight
/// gradient before its rounding).
pub const CHUNK_BYTES: usize = 64 << 20;

/// Vocabulary columns per chunk for `rows` rows of `hidden` features: as many as keep a
/// chunk's logits and its weight gradient within [`CHUNK_BYTES`] of f32, a multiple of 128
/// (at least 128), at most `vocab`.
pub fn chunk_columns(rows: usize, hidden: usize, vocab: usize) -> usize {
    let fit = CHUNK_BYTES / 4 / rows.max(hidden).max(1);
    (fit / 128 * 128).max(128).min(vocab)
}

/// The shapes of one call: `x [N,H]`, `w [V,H]` of one dtype (f32 or bf16), and the targets.
struct Shapes<'a> {
    problem: Problem<'a>,
    hidden: usize,
    dtype: DType,
}

fn shapes<'a>(
    op: &'static str,
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    targets: &TensorView<'a>,
    ignore_index: i64,
) -> Result<Shapes<'a>> {
    let dtype = x.dtype();
    for (name, view) in [("x", x), ("weight", weight)] {
        if !matches!(view.dtype(), DType::F32 | DType::BF16) || view.dtype() != dtype {
            return Err(Error::DType {
                op,
                operand: name,
                expected: if dtype == DType::BF16 {
                    dtype
                } else {
                    DType::F32
                },
                got: view.dtype(),
            });
        }
    }
    expect_rank(op, "x", x.shape(), 2)?;
    let &[rows, hidden] = x.shape().dims() else {
        unreachable!("rank checked")
    };
    let vocab = weight.shape().dims().first().copied().unwrap_or(0);
    expect_shape(op, "weight", weight.shape(), &[vocab, hidden])?;
    let problem = check_targets(op, (rows, vocab), targets, ignore_index)?;
    Ok(Shapes {
        problem,
        hidden,
        dtype,
    })
}

/// Rows `rows` of `view` (`[_, H]`, f32 or bf16) widened to f32.
fn widened(
    op: &'static str,
    name: &'static str,
    view: &TensorView<'_>,
    rows: std::ops::Range<usize>,
    hidden: usize,
) -> Result<Vec<f32>> {
    let span = rows.start * hidden..rows.end * hidden;
    Ok(match view.dtype() {
        DType::BF16 => view.slice::<bf16>(op, name)?[span]
            .iter()
            .map(|x| x.to_f32())
            .collect(),
        _ => view.slice::<f32>(op, name)?[span].to_vec(),
    })
}

/// `x · w[columns]ᵀ` (`[N, width]` f32).
fn chunk_logits(x: &[f32], w: &[f32], [rows, width, hidden]: [usize; 3]) -> Result<Vec<f32>> {
    let mut logits = vec![0f32; rows * width];
    let a = TensorView::contiguous(x, [rows, hidden])?;
    let b = TensorView::contiguous(w, [width, hidden])?;
    let mut out = TensorViewMut::contiguous(logits.as_mut_slice(), [rows, width])?;
    let transpose = Transpose { a: false, b: true };
    matmul(&a, &b, &mut out, transpose, &mut [])?;
    Ok(logits)
}

fn vocab_of(weight: &TensorView<'_>) -> usize {
    weight.shape().dims().first().copied().unwrap_or(0)
}

/// `max(a, b)`, NaN when either is (kernels/cuda/common.cuh's `kiln_max`): a NaN logit makes
/// its row's lse NaN on the device and here alike.
fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// A chunk row's maximum and `Σ exp(x − max)`; (−∞, 0) for a row of −∞ only (as the device's
/// online merge gives, which never subtracts −∞ from −∞).
fn max_and_sum(row: &[f32]) -> (f32, f32) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| nan_max(m, v));
    if max == f32::NEG_INFINITY {
        return (max, 0.0);
    }
    (max, row.iter().map(|&v| (v - max).exp()).sum())
}

/// Online merge of two (max, Σ exp(· − max)) pairs, as kernels/cuda/loss.cu's `kiln_merge`.
fn merge((m_a, s_a): (f32, f32), (m_b, s_b): (f32, f32)) -> (f32, f32) {
    let m = nan_max(m_a, m_b);
    if m == f32::NEG_INFINITY {
        return (m, 0.0);
    }
    (m, s_a * (m_a - m).exp() + s_b * (m_b - m).exp())
}

/// The rounding to `dtype` the GEMMs take (the identity for f32).
fn round_to(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// Writes the mean `loss []` and each row's `lse [N]` (both f32) of `x [N,H] · weightᵀ`
/// against `targets [N]`.
pub fn linear_cross_entropy(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    targets: &TensorView<'_>,
    ignore_index: i64,
    loss: &mut TensorViewMut<'_>,
    lse: &mut TensorViewMut<'_>,
) -> Result<()> {
    let columns = chunk_columns(x.shape().rows(), x.shape().last_dim(), vocab_of(weight));
    forward_in_chunks(x, weight, targets, ignore_index, (loss, lse), columns)
}

fn forward_in_chunks(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    targets: &TensorView<'_>,
    ignore_index: i64,
    (loss, lse): (&mut TensorViewMut<'_>, &mut TensorViewMut<'_>),
    columns: usize,
) -> Result<()> {
    const OP: &str = "linear_cross_entropy";
    let s = shapes(OP, x, weight, targets, ignore_index)?;
    let (rows, vocab, hidden) = (s.problem.rows, s.problem.vocab, s.hidden);
    expect_shape(OP, "loss", loss.shape(), &[])?;
    expect_shape(OP, "lse", lse.shape(), &[rows])?;
    let xs = widened(OP, "x", x, 0..rows, hidden)?;
    let mut stats = vec![(f32::NEG_INFINITY, 0f32); rows];
    let mut target_logit = vec![0f32; rows];
    for start in (0..vocab).step_by(columns.max(1)) {
        let end = (start + columns).min(vocab);
        let w = widened(OP, "weight", weight, start..end, hidden)?;
        let logits = chunk_logits(&xs, &w, [rows, end - start, hidden])?;
        for (row, chunk) in logits.chunks_exact(end - start).enumerate() {
            stats[row] = merge(stats[row], max_and_sum(chunk));
            if let Some(class) = s.problem.class(row).filter(|c| (start..end).contains(c)) {
                target_logit[row] = chunk[class - start];
            }
        }
    }
    let lse = lse.slice_mut::<f32>(OP, "lse")?;
    let mut total = 0f32;
    for row in 0..rows {
        let (max, sum) = stats[row];
        lse[row] = max + sum.ln();
        if s.problem.class(row).is_some() {
            total += sum.ln() - (target_logit[row] - max);
        }
    }
    loss.slice_mut::<f32>(OP, "loss")?[0] = total / s.problem.counted as f32;
    Ok(())
}

/// Gradients of [`linear_cross_entropy`]: overwrites `grad_x [N,H]` and `grad_weight [V,H]`
/// (the dtype of `x` and `weight`) from `lse [N]` and the scalar `grad_loss` (f32).
#[allow(clippy::too_many_arguments)]
pub fn linear_cross_entropy_backward(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    targets: &TensorView<'_>,
    lse: &TensorView<'_>,
    grad_loss: &TensorView<'_>,
    ignore_index: i64,
    grad_x: &mut TensorViewMut<'_>,
    grad_weight: &mut TensorViewMut<'_>,
) -> Result<()> {
    let columns = chunk_columns(x.shape().rows(), x.shape().last_dim(), vocab_of(weight));
    let saved = [targets, lse, grad_loss];
    backward_in_chunks(
        x,
        weight,
        saved,
        ignore_index,
        (grad_x, grad_weight),
        columns,
    )
}

fn backward_in_chunks(
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    [targets, lse, grad_loss]: [&TensorView<'_>; 3],
    ignore_index: i64,
    (grad_x, grad_weight): (&mut TensorViewMut<'_>, &mut TensorViewMut<'_>),
    columns: usize,
) -> Result<()> {
    const OP: &str = "linear_cross_entropy_backward";
    let s = shapes(OP, x, weight, targets, ignore_index)?;
    let (rows, vocab, hidden, dtype) = (s.problem.rows, s.problem.vocab, s.hidden, s.dtype);
    expect_shape(OP, "lse", lse.shape(), &[rows])?;
    expect_shape(OP, "grad_loss", grad_loss.shape(), &[])?;
    expect_shape(OP, "grad_x", grad_x.shape(), &[rows, hidden])?;
    expect_shape(OP, "grad_weight", grad_weight.shape(), &[vocab, hidden])?;
    for (name, got) in [
        ("grad_x", grad_x.dtype()),
        ("grad_weight", grad_weight.dtype()),
    ] {
        if got != dtype {
            return Err(Error::DType {
                op: OP,
                operand: name,
                expected: dtype,
                got,
            });
        }
    }
    let lse = lse.slice::<f32>(OP, "lse")?;
    // Used only on counted rows, so C >= 1 wherever it matters.
    let scale = grad_loss.slice::<f32>(OP, "grad_loss")?[0] / s.problem.counted as f32;
    let xs = widened(OP, "x", x, 0..rows, hidden)?;
    let mut acc = vec![0f32; rows * hidden];
    let mut grad_w = vec![0f32; vocab * hidden];
    for start in (0..vocab).step_by(columns.max(1)) {
        let (end, first) = ((start + columns).min(vocab), start == 0);
        let width = end - start;
        let w = widened(OP, "weight", weight, start..end, hidden)?;
        let mut dl = chunk_logits(&xs, &w, [rows, width, hidden])?;
        for (row, chunk) in dl.chunks_exact_mut(width).enumerate() {
            let Some(class) = s.problem.class(row) else {
                chunk.fill(0.0);
                continue;
            };
            for (j, value) in chunk.iter_mut().enumerate() {
                let one_hot = if start + j == class { 1.0 } else { 0.0 };
                *value = round_to(dtype, ((*value - lse[row]).exp() - one_hot) * scale);
            }
        }
        let dl_view = TensorView::contiguous(dl.as_slice(), [rows, width])?;
        let x_view = TensorView::contiguous(xs.as_slice(), [rows, hidden])?;
        let rows_of_w = &mut grad_w[start * hidden..end * hidden];
        let mut out = TensorViewMut::contiguous(rows_of_w, [width, hidden])?;
        matmul(
            &dl_view,
            &x_view,
            &mut out,
            Transpose { a: true, b: false },
            &mut [],
        )?;
        let w_view = TensorView::contiguous(w.as_slice(), [width, hidden])?;
        let mut partial = vec![0f32; rows * hidden];
        let mut out = TensorViewMut::contiguous(partial.as_mut_slice(), [rows, hidden])?;
        matmul(&dl_view, &w_view, &mut out, Transpose::default(), &mut [])?;
        for (a, p) in acc.iter_mut().zip(&partial) {
            *a = if first { *p } else { *p + *a };
        }
    }
    write_rounded(OP, "grad_x", grad_x, &acc)?;
    write_rounded(OP, "grad_weight", grad_weight, &grad_w)
}

/// `values` into `out` (f32, or rounded to bf16).
fn write_rounded(
    op: &'static str,
    name: &'static str,
    out: &mut TensorViewMut<'_>,
    values: &[f32],
) -> Result<()> {
    match out.dtype() {
        DType::BF16 => {
            let out = out.slice_mut::<bf16>(op, name)?;
            for (o, &v) in out.iter_mut().zip(values) {
                *o = bf16::from_f32(v);
            }
        }
        _ => out.slice_mut::<f32>(op, name)?.copy_from_slice(values),
    }
    Ok(())
}

#[cfg(test)]
mod tests;
