//! Builders of `embedding.cu`: the gather, and the deterministic scatter-add backward (zero
//! the table, then the first token of each id writes that id's row, summed in token order).

use super::launch::{block_per, grid_stride, size_arg};
use super::{Addr, Arg, Launch, Stored};
use crate::Result;

const MODULE: &str = "embedding";

/// `out [N,H] = weight [V,H] rows ids [N]` (i64), one block per token (`tokens > 0`); an id
/// outside `0..V` raises the `fault` word.
pub fn embedding_f32(
    out: Addr,
    (weight, stored): (Addr, Stored),
    ids: Addr,
    [tokens, hidden, vocab]: [u64; 3],
    fault: Addr,
) -> Result<Launch> {
    let args = vec![
        Arg::Ptr(out),
        Arg::Ptr(weight),
        Arg::Ptr(ids),
        size_arg(tokens),
        size_arg(hidden),
        size_arg(vocab),
        Arg::Ptr(fault),
    ];
    let function = stored.pick("embedding_f32", "embedding_bf16");
    block_per(MODULE, function, "tokens", tokens, args)
}

/// `out[0..n] = 0` (f32; `n > 0`).
pub fn zero_f32(out: Addr, n: u64) -> Launch {
    let args = vec![Arg::Ptr(out), size_arg(n)];
    grid_stride(MODULE, "zero_f32", n, args)
}

/// The rows named by `ids` of `grad_weight [V,H]`, after [`zero_f32`] (`tokens > 0`); an id
/// outside `0..V` raises the `fault` word.
pub fn embedding_backward_f32(
    grad_weight: Addr,
    ids: Addr,
    grad_out: Addr,
    [tokens, hidden, vocab]: [u64; 3],
    fault: Addr,
) -> Result<Launch> {
    const FUNCTION: &str = "embedding_backward_f32";
    let args = vec![
        Arg::Ptr(grad_weight),
        Arg::Ptr(ids),
        Arg::Ptr(grad_out),
        size_arg(tokens),
        size_arg(hidden),
        size_arg(vocab),
        Arg::Ptr(fault),
    ];
    block_per(MODULE, FUNCTION, "tokens", tokens, args)
}
