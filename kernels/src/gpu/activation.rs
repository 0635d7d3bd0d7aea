//! Builders of `activation.cu`: softmax over the last dim and its backward, one block per row.

use super::launch::{grid_dim, size_arg, MAX_GRID_X};
use super::{Addr, Arg, Kernel, Launch, BLOCK_THREADS};
use crate::Result;

const MODULE: &str = "activation";

/// `out = softmax(x)` over rows of `cols` elements (`rows > 0`).
pub fn softmax_f32(out: Addr, x: Addr, rows: u64, cols: u64) -> Result<Launch> {
    let grid = (grid_dim("softmax_f32", "rows", rows, MAX_GRID_X)?, 1, 1);
    let args = vec![Arg::Ptr(out), Arg::Ptr(x), size_arg(rows), size_arg(cols)];
    Ok(Kernel::launch(
        MODULE,
        "softmax_f32",
        grid,
        (BLOCK_THREADS, 1, 1),
        0,
        args,
    ))
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
    let grid = (grid_dim(FUNCTION, "rows", rows, MAX_GRID_X)?, 1, 1);
    let args = vec![
        Arg::Ptr(grad_x),
        Arg::Ptr(y),
        Arg::Ptr(grad_out),
        size_arg(rows),
        size_arg(cols),
    ];
    Ok(Kernel::launch(
        MODULE,
        FUNCTION,
        grid,
        (BLOCK_THREADS, 1, 1),
        0,
        args,
    ))
}
