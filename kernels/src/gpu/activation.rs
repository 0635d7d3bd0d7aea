//! Builders of `activation.cu`: softmax over the last dim and its backward, one block per row.

use super::launch::{block_per, size_arg};
use super::{Addr, Arg, Launch};
use crate::Result;

const MODULE: &str = "activation";

/// `out = softmax(x)` over rows of `cols` elements (`rows > 0`).
pub fn softmax_f32(out: Addr, x: Addr, rows: u64, cols: u64) -> Result<Launch> {
    let args = vec![Arg::Ptr(out), Arg::Ptr(x), size_arg(rows), size_arg(cols)];
    block_per(MODULE, "softmax_f32", "rows", rows, args)
}

/// `out[r]` (i64) = the index of the largest `x[r, :]`, ties to the lowest, -1 for a row with
/// a NaN or no element (`rows > 0`).
pub fn argmax_f32(out: Addr, x: Addr, rows: u64, cols: u64) -> Result<Launch> {
    let args = vec![Arg::Ptr(out), Arg::Ptr(x), size_arg(rows), size_arg(cols)];
    block_per(MODULE, "argmax_f32", "rows", rows, args)
}

/// `grad_x = y ⊙ (grad_out − rowsum(grad_out ⊙ y))` (`rows > 0`).
pub fn softmax_backward_f32(
    grad_x: Addr,
    y: Addr,
    grad_out: Addr,
    rows: u64,
    cols: u64,
) -> Result<Launch> {
    const FUNCTION: &str = "softmax_backward_f32";
    let args = vec![
        Arg::Ptr(grad_x),
        Arg::Ptr(y),
        Arg::Ptr(grad_out),
        size_arg(rows),
        size_arg(cols),
    ];
    block_per(MODULE, FUNCTION, "rows", rows, args)
}
