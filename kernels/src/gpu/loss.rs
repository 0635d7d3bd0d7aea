//! Builders of `loss.cu`: cross-entropy (a row pass into scratch, then one block for the mean)
//! and its backward (one block per row).

use super::launch::{block_per, size_arg};
use super::{Addr, Arg, Kernel, Launch, BLOCK_THREADS};
use crate::Result;

const MODULE: &str = "loss";

/// Per-row losses of `logits [N,V]` against `targets [N]` (i64) into `row_loss` (`N` f32
/// scratch; `rows > 0`). A target outside `0..V` (other than `ignore_index`) raises the
/// `fault` word.
pub fn cross_entropy_rows_f32(
    row_loss: Addr,
    logits: Addr,
    targets: Addr,
    ([rows, vocab], ignore_index): ([u64; 2], i64),
    fault: Addr,
) -> Result<Launch> {
    const FUNCTION: &str = "cross_entropy_rows_f32";
    let args = vec![
        Arg::Ptr(row_loss),
        Arg::Ptr(logits),
        Arg::Ptr(targets),
        size_arg(rows),
        size_arg(vocab),
        Arg::I64(ignore_index),
        Arg::Ptr(fault),
    ];
    block_per(MODULE, FUNCTION, "rows", rows, args)
}

/// `loss [] = Σ counted row losses / count`, one block (`rows` may be 0: NaN, as the CPU).
pub fn cross_entropy_mean_f32(
    loss: Addr,
    row_loss: Addr,
    targets: Addr,
    rows: u64,
    ignore_index: i64,
) -> Launch {
    let args = vec![
        Arg::Ptr(loss),
        Arg::Ptr(row_loss),
        Arg::Ptr(targets),
        size_arg(rows),
        Arg::I64(ignore_index),
    ];
    let block = (BLOCK_THREADS, 1, 1);
    Kernel::launch(MODULE, "cross_entropy_mean_f32", (1, 1, 1), block, 0, args)
}

/// `grad [N,V]` from the logits, targets and the scalar `grad_loss` (`rows > 0`); a target
/// outside `0..V` (other than `ignore_index`) raises the `fault` word.
pub fn cross_entropy_backward_f32(
    grad: Addr,
    [logits, targets, grad_loss]: [Addr; 3],
    ([rows, vocab], ignore_index): ([u64; 2], i64),
    fault: Addr,
) -> Result<Launch> {
    const FUNCTION: &str = "cross_entropy_backward_f32";
    let args = vec![
        Arg::Ptr(grad),
        Arg::Ptr(logits),
        Arg::Ptr(targets),
        Arg::Ptr(grad_loss),
        size_arg(rows),
        size_arg(vocab),
        Arg::I64(ignore_index),
        Arg::Ptr(fault),
    ];
    block_per(MODULE, FUNCTION, "rows", rows, args)
}
