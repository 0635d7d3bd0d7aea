//! Cross-entropy loss over logits, as `torch.nn.functional.cross_entropy(logits, targets,
//! ignore_index=ignore_index, reduction='mean')` computes it, forward and backward.
//!
//! Math, for rows `i` of `logits` `[N,V]` whose target `t_i` is not `ignore_index`
//! (the counted rows, `C` of them):
//!
//! ```text
//! m_i   = max_v logits[i,v]
//! loss  = (1/C) Σ_i ( ln Σ_v exp(logits[i,v] − m_i) − (logits[i,t_i] − m_i) )
//! grad_logits[i,v] = grad_loss · (softmax(logits[i])_v − [v == t_i]) / C     (0 for ignored rows)
//! ```
//!
//! Subtracting the row max keeps `exp` finite for logits of any size. With every row ignored,
//! `C = 0` and the loss is 0/0 = NaN, as torch gives; the gradient is then all zeros.
//!
//! Layouts: `logits` `[N,V]` and `grad_logits` `[N,V]` contiguous, f32 or f64; `targets` `[N]`
//! of i32 or i64; `loss` and `grad_loss` scalars (shape `[]`) of the logits' dtype. A target
//! outside `0..V` that is not `ignore_index` is an error, checked for every row before anything
//! is written. Rows are summed in order, so results are reproducible bit for bit.

use crate::dispatch_real;
use crate::element::Real;
use crate::error::{expect_rank, expect_shape, Result};
use crate::indices::Indices;
use crate::view::{TensorView, TensorViewMut};

/// The sizes of one call and the validated targets.
#[derive(Clone, Copy)]
struct Problem<'a> {
    rows: usize,
    vocab: usize,
    targets: Indices<'a>,
    ignore_index: i64,
    /// Number of rows whose target is not `ignore_index`.
    counted: usize,
}

impl Problem<'_> {
    /// The target class of `row`, or `None` if the row is ignored (targets already checked).
    fn class(&self, row: usize) -> Option<usize> {
        let target = self.targets.get(row);
        if target == self.ignore_index {
            None
        } else {
            usize::try_from(target).ok()
        }
    }
}

/// Checks shapes and every target, and counts the rows that are not ignored.
fn check<'a>(
    op: &'static str,
    logits: &TensorView<'_>,
    targets: &TensorView<'a>,
    ignore_index: i64,
) -> Result<Problem<'a>> {
    expect_rank(op, "logits", logits.shape(), 2)?;
    let (rows, vocab) = (logits.shape().rows(), logits.shape().last_dim());
    check_targets(op, (rows, vocab), targets, ignore_index)
}

/// Checks `targets [rows]` against a vocabulary of `vocab` and counts the rows not ignored.
fn check_targets<'a>(
    op: &'static str,
    (rows, vocab): (usize, usize),
    targets: &TensorView<'a>,
    ignore_index: i64,
) -> Result<Problem<'a>> {
    expect_shape(op, "targets", targets.shape(), &[rows])?;
    let targets = Indices::of(op, "targets", targets)?;
    targets.check_below(op, "targets", vocab, Some(ignore_index))?;
    let counted = (0..rows)
        .filter(|&row| targets.get(row) != ignore_index)
        .count();
    Ok(Problem {
        rows,
        vocab,
        targets,
        ignore_index,
        counted,
    })
}

/// The row max and `Σ exp(row − max)` of a non-empty row.
fn max_and_shifted_sum<T: Real>(row: &[T]) -> (T, T) {
    let max = row.iter().fold(T::neg_infinity(), |m, &v| m.max(v));
    let mut sum = T::zero();
    for &v in row {
        sum += (v - max).exp();
    }
    (max, sum)
}

/// Mean cross-entropy of `logits` `[N,V]` against `targets` `[N]` (i32 or i64), skipping rows
/// whose target is `ignore_index`; writes the scalar `loss` (shape `[]`).
pub fn cross_entropy(
    logits: &TensorView<'_>,
    targets: &TensorView<'_>,
    ignore_index: i64,
    loss: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "cross_entropy";
    expect_shape(OP, "loss", loss.shape(), &[])?;
    let problem = check(OP, logits, targets, ignore_index)?;
    dispatch_real!(
        OP,
        logits.dtype(),
        cross_entropy_typed(&problem, logits, loss)
    )
}

fn cross_entropy_typed<T: Real>(
    problem: &Problem<'_>,
    logits: &TensorView<'_>,
    loss: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "cross_entropy";
    let logits = logits.slice::<T>(OP, "logits")?;
    let loss = loss.slice_mut::<T>(OP, "loss")?;
    let vocab = problem.vocab;
    let mut total = T::zero();
    for row_index in 0..problem.rows {
        let Some(class) = problem.class(row_index) else {
            continue;
        };
        let row = &logits[row_index * vocab..(row_index + 1) * vocab];
        let (max, sum) = max_and_shifted_sum(row);
        // −log_softmax(row)[class], computed from the shifted logits as torch does.
        total += sum.ln() - (row[class] - max);
    }
    // With no counted row this is 0/0 = NaN, matching torch.
    loss[0] = total / T::of(problem.counted as f64);
    Ok(())
}

/// Gradient of [`cross_entropy`] with respect to `logits`: overwrites `grad_logits` `[N,V]`
/// from the scalar `grad_loss` (shape `[]`, the logits' dtype).
pub fn cross_entropy_backward(
    logits: &TensorView<'_>,
    targets: &TensorView<'_>,
    ignore_index: i64,
    grad_loss: &TensorView<'_>,
    grad_logits: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "cross_entropy_backward";
    expect_shape(OP, "grad_loss", grad_loss.shape(), &[])?;
    expect_shape(
        OP,
        "grad_logits",
        grad_logits.shape(),
        logits.shape().dims(),
    )?;
    let problem = check(OP, logits, targets, ignore_index)?;
    dispatch_real!(
        OP,
        logits.dtype(),
        cross_entropy_backward_typed(&problem, logits, grad_loss, grad_logits)
    )
}

fn cross_entropy_backward_typed<T: Real>(
    problem: &Problem<'_>,
    logits: &TensorView<'_>,
    grad_loss: &TensorView<'_>,
    grad_logits: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = "cross_entropy_backward";
    let logits = logits.slice::<T>(OP, "logits")?;
    let grad_loss = grad_loss.slice::<T>(OP, "grad_loss")?[0];
    let grad_logits = grad_logits.slice_mut::<T>(OP, "grad_logits")?;
    let vocab = problem.vocab;
    // Only used for counted rows, so C >= 1 wherever it matters.
    let per_row = grad_loss / T::of(problem.counted as f64);
    for row_index in 0..problem.rows {
        let span = row_index * vocab..(row_index + 1) * vocab;
        let grad_row = &mut grad_logits[span.clone()];
        let Some(class) = problem.class(row_index) else {
            grad_row.fill(T::zero());
            continue;
        };
        let row = &logits[span];
        let (max, sum) = max_and_shifted_sum(row);
        for (v, (g, &x)) in grad_row.iter_mut().zip(row).enumerate() {
            let one_hot = if v == class { T::one() } else { T::zero() };
            *g = ((x - max).exp() / sum - one_hot) * per_row;
        }
    }
    Ok(())
}

pub mod chunked;

#[cfg(test)]
mod tests;
