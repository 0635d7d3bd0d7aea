//! Builders of `embedding.cu`: the gather, and the deterministic scatter-add backward (zero
//! the table, or copy a base onto which it adds, then the first token of each id writes that
//! id's row, summed in token order).

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

/// `out[0..n] = 0` (bf16; `n > 0`).
pub fn zero_bf16(out: Addr, n: u64) -> Launch {
    let args = vec![Arg::Ptr(out), size_arg(n)];
    grid_stride(MODULE, "zero_bf16", n, args)
}

/// `out[0..n] = 0 + base[0..n]` (`out` f32, `base` f32 or bf16 widened; `n > 0`): the table
/// before [`embedding_backward_f32`] onto a base.
pub fn embedding_base_f32(out: Addr, (base, stored): (Addr, Stored), n: u64) -> Launch {
    let args = vec![Arg::Ptr(out), Arg::Ptr(base), size_arg(n)];
    let function = stored.pick("embedding_base_f32", "embedding_base_bf16");
    grid_stride(MODULE, function, n, args)
}

/// The rows named by `ids` of `grad_weight [V,H]` (`tokens > 0`), after [`zero_f32`], or after
/// [`embedding_base_f32`] onto `base` (`[V,H]`, f32 or bf16), whose row each sum then has
/// added; an id outside `0..V` raises the `fault` word.
pub fn embedding_backward_f32(
    grad_weight: Addr,
    ids: Addr,
    grad_out: Addr,
    base: Option<(Addr, Stored)>,
    [tokens, hidden, vocab]: [u64; 3],
    fault: Addr,
) -> Result<Launch> {
    // Without a base the kernel never reads its pointer; pass a valid one all the same.
    let (base_addr, stored) = base.unwrap_or((grad_out, Stored::F32));
    let args = vec![
        Arg::Ptr(grad_weight),
        Arg::Ptr(ids),
        Arg::Ptr(grad_out),
        Arg::Ptr(base_addr),
        Arg::I32(i32::from(base.is_some())),
        size_arg(tokens),
        size_arg(hidden),
        size_arg(vocab),
        Arg::Ptr(fault),
    ];
    let function = stored.pick("embedding_backward_f32", "embedding_backward_f32_bf16_base");
    block_per(MODULE, function, "tokens", tokens, args)
}
