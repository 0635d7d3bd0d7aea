//! Builders of `attention.cu`: causal GQA forward (probs saved), forward over a KV cache, and
//! the two-pass backward. Row kernels run one block per query row (grid `(T, Hq, B)`); the
//! backward's second pass one block per key row (grid `(S, Hkv, B)`).

use super::launch::{grid_dim, size_arg, MAX_GRID_X, MAX_GRID_YZ};
use super::{Addr, Arg, Kernel, Launch, BLOCK_THREADS};
use crate::Result;

const MODULE: &str = "attention";

/// The sizes of one attention call: `q [B,Hq,T,D]`, keys `[B,Hkv,S,D]` (`S` = the cache
/// capacity for cached attention). `Hkv` divides `Hq`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionDims {
    pub batch: u64,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub q_len: u64,
    pub kv_len: u64,
    pub head_dim: u64,
}

impl AttentionDims {
    /// `q_heads, kv_heads, q_len, kv_len, head_dim`, as every kernel takes them.
    fn args(&self) -> [Arg; 5] {
        [
            size_arg(self.q_heads),
            size_arg(self.kv_heads),
            size_arg(self.q_len),
            size_arg(self.kv_len),
            size_arg(self.head_dim),
        ]
    }

    /// One block per query row.
    fn query_grid(&self, function: &'static str) -> Result<(u32, u32, u32)> {
        Ok((
            grid_dim(function, "T", self.q_len, MAX_GRID_X)?,
            grid_dim(function, "Hq", self.q_heads, MAX_GRID_YZ)?,
            grid_dim(function, "B", self.batch, MAX_GRID_YZ)?,
        ))
    }

    /// Dynamic shared memory of the row kernels: a row of D plus one float per thread.
    fn row_shared_bytes(&self) -> u32 {
        ((self.head_dim + u64::from(BLOCK_THREADS)) * 4) as u32
    }
}

/// `out [B,T,Hq,D]` and `probs [B,Hq,T,S]` (0 past the causal limit).
pub fn attention_f32(
    out: Addr,
    probs: Addr,
    [q, k, v]: [Addr; 3],
    dims: AttentionDims,
    scale: f32,
) -> Result<Launch> {
    const FUNCTION: &str = "attention_f32";
    let mut args = vec![
        Arg::Ptr(out),
        Arg::Ptr(probs),
        Arg::Ptr(q),
        Arg::Ptr(k),
        Arg::Ptr(v),
    ];
    args.extend(dims.args());
    args.push(Arg::F32(scale));
    let grid = dims.query_grid(FUNCTION)?;
    let block = (BLOCK_THREADS, 1, 1);
    Ok(Kernel::launch(
        MODULE,
        FUNCTION,
        grid,
        block,
        dims.row_shared_bytes(),
        args,
    ))
}

/// `out [B,T,Hq,D]` over the caches `[B,Hkv,Smax,D]` (`dims.kv_len` = Smax) at `positions [B]`
/// (i64); `probs` is scratch `[B,Hq,T,Smax]` f32.
pub fn cached_attention_f32(
    out: Addr,
    probs: Addr,
    [q, k_cache, v_cache, positions]: [Addr; 4],
    dims: AttentionDims,
    scale: f32,
) -> Result<Launch> {
    const FUNCTION: &str = "cached_attention_f32";
    let mut args = vec![
        Arg::Ptr(out),
        Arg::Ptr(probs),
        Arg::Ptr(q),
        Arg::Ptr(k_cache),
        Arg::Ptr(v_cache),
        Arg::Ptr(positions),
    ];
    args.extend(dims.args());
    args.push(Arg::F32(scale));
    let grid = dims.query_grid(FUNCTION)?;
    let block = (BLOCK_THREADS, 1, 1);
    Ok(Kernel::launch(
        MODULE,
        FUNCTION,
        grid,
        block,
        dims.row_shared_bytes(),
        args,
    ))
}

/// The operands of the backward.
#[derive(Clone, Copy, Debug)]
pub struct AttentionBackward {
    pub q: Addr,
    pub k: Addr,
    pub v: Addr,
    pub probs: Addr,
    pub grad_out: Addr,
    pub grad_q: Addr,
    pub grad_k: Addr,
    pub grad_v: Addr,
    /// `[B,Hq,T,S]` f32 scratch for dS.
    pub ds: Addr,
}

/// Pass 1: dS into the scratch and `grad_q` (needs `T > 0`).
pub fn attention_backward_dq_f32(
    at: AttentionBackward,
    dims: AttentionDims,
    scale: f32,
) -> Result<Launch> {
    const FUNCTION: &str = "attention_backward_dq_f32";
    let mut args = vec![
        Arg::Ptr(at.grad_q),
        Arg::Ptr(at.ds),
        Arg::Ptr(at.k),
        Arg::Ptr(at.v),
        Arg::Ptr(at.probs),
        Arg::Ptr(at.grad_out),
    ];
    args.extend(dims.args());
    args.push(Arg::F32(scale));
    let grid = dims.query_grid(FUNCTION)?;
    let block = (BLOCK_THREADS, 1, 1);
    Ok(Kernel::launch(
        MODULE,
        FUNCTION,
        grid,
        block,
        dims.row_shared_bytes(),
        args,
    ))
}

/// Pass 2: `grad_k` and `grad_v` from dS, P, q and dO (needs `S > 0`; `T` may be 0).
pub fn attention_backward_dkv_f32(at: AttentionBackward, dims: AttentionDims) -> Result<Launch> {
    const FUNCTION: &str = "attention_backward_dkv_f32";
    let mut args = vec![
        Arg::Ptr(at.grad_k),
        Arg::Ptr(at.grad_v),
        Arg::Ptr(at.q),
        Arg::Ptr(at.probs),
        Arg::Ptr(at.grad_out),
        Arg::Ptr(at.ds),
    ];
    args.extend(dims.args());
    let grid = (
        grid_dim(FUNCTION, "S", dims.kv_len, MAX_GRID_X)?,
        grid_dim(FUNCTION, "Hkv", dims.kv_heads, MAX_GRID_YZ)?,
        grid_dim(FUNCTION, "B", dims.batch, MAX_GRID_YZ)?,
    );
    let shared = 2 * BLOCK_THREADS * 4;
    Ok(Kernel::launch(
        MODULE,
        FUNCTION,
        grid,
        (BLOCK_THREADS, 1, 1),
        shared,
        args,
    ))
}
