//! Builders of `cache.cu`: writing new K/V rows into a cache at device-held positions, alone
//! and with the RoPE of the queries and keys.

use super::launch::{grid_stride, size_arg, MAX_GRID_X};
use super::{Addr, Arg, Kernel, Launch, Stored, BLOCK_THREADS};

/// Which cache row each batch row reads and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheRows {
    /// Batch row `b` owns cache row `b` (a cache of one row per batch row).
    Own,
    /// Batch row `b` takes slot `rows[b]` (i64 `[B]`, device memory) of a pool of `slots`.
    Pool { rows: Addr, slots: u64 },
}

impl CacheRows {
    /// The kernels' `rows, slots` arguments for a batch of `batch` rows.
    pub(super) fn args(self, batch: u64) -> [Arg; 2] {
        match self {
            CacheRows::Own => [Arg::Null, size_arg(batch)],
            CacheRows::Pool { rows, slots } => [Arg::Ptr(rows), size_arg(slots)],
        }
    }
}

/// Positions `positions[b]..+T` of batch row `b`'s cache row of `cache [S,H,Smax,D]` ←
/// `fresh [B,H,T,D]` (positions i64 `[B]`); `fresh` must hold some element. A position that
/// leaves no room for `T` rows, a slot outside the pool and a slot two rows take raise the
/// `fault` word.
pub fn kv_cache_write_f32(
    (cache, stored): (Addr, Stored),
    fresh: Addr,
    (positions, cache_rows): (Addr, CacheRows),
    [batch, heads, capacity, block, head_dim]: [u64; 5],
    fault: Addr,
) -> Launch {
    let [rows, slots] = cache_rows.args(batch);
    let args = vec![
        Arg::Ptr(cache),
        Arg::Ptr(fresh),
        Arg::Ptr(positions),
        rows,
        slots,
        size_arg(batch),
        size_arg(heads),
        size_arg(capacity),
        size_arg(block),
        size_arg(head_dim),
        Arg::Ptr(fault),
    ];
    let items = batch * heads * block * head_dim;
    let function = stored.pick("kv_cache_write_f32", "kv_cache_write_f32_bf16");
    grid_stride("cache", function, items, args)
}

/// The addresses of one fused RoPE + KV-cache write (`RopeKvWrite`): `q [B,T,Hq,D]`,
/// `k [B,T,Hkv,D]` and `v [B,Hkv,T,D]` f32, `rope_positions [B,T]` and `positions [B]` i64,
/// the result `q_rot [B,Hq,T,D]` f32 and the caches `[S,Hkv,Smax,D]`, written in place. The
/// staged form (`staged`) takes `v [B,T,Hkv,D]` token-major and writes `q_rot` as f16, and
/// the rotated keys and v head-major, `[B,Hkv,T,D]` f16, at the two addresses it gives.
#[derive(Clone, Copy, Debug)]
pub struct RopeKvWrite {
    pub q_rot: Addr,
    pub k_cache: Addr,
    pub v_cache: Addr,
    pub q: Addr,
    pub k: Addr,
    pub v: Addr,
    pub rope_positions: Addr,
    pub positions: Addr,
    pub rows: CacheRows,
    /// `q_bias [Hq·D]` and `k_bias [Hkv·D]`, when the rotations add biases.
    pub biases: Option<[Addr; 2]>,
    /// The staged form's `k_rows` and `v_rows`.
    pub staged: Option<[Addr; 2]>,
}

/// The sizes of one `RopeKvWrite`, `head_dim` even.
#[derive(Clone, Copy, Debug)]
pub struct RopeKvDims {
    pub batch: u64,
    pub seq: u64,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub capacity: u64,
    pub head_dim: u64,
}

/// `q_rot = rope(q + q_bias)`, `rope(k + k_bias)` and `v` written at positions
/// `positions[b]..+T` of batch row `b`'s cache rows, in one launch: exactly `rope_f32` and
/// `kv_cache_write_f32` (the same device functions; the staged form the same angle function
/// and arithmetic, a block per token), `theta` rounded to f32 as the CPU; the staged form also
/// rounds q_rot, the rotated keys and v to f16 rows. The caches and the biases are each stored
/// as `stored` says (caches, biases). Faults as those two kernels raise them.
pub fn rope_kv_write_f32(
    at: RopeKvWrite,
    (dims, theta): (RopeKvDims, f32),
    (cache, bias): (Stored, Stored),
    fault: Addr,
) -> Launch {
    let [rows, slots] = at.rows.args(dims.batch);
    // Without biases the kernel never reads their pointers; pass valid ones all the same.
    let [q_bias, k_bias] = at.biases.unwrap_or([at.q, at.q]);
    let mut args = vec![Arg::Ptr(at.q_rot)];
    args.extend(at.staged.into_iter().flatten().map(Arg::Ptr));
    args.extend([
        Arg::Ptr(at.k_cache),
        Arg::Ptr(at.v_cache),
        Arg::Ptr(at.q),
        Arg::Ptr(at.k),
        Arg::Ptr(at.v),
        Arg::Ptr(at.rope_positions),
        Arg::Ptr(at.positions),
        rows,
        slots,
        Arg::Ptr(q_bias),
        Arg::Ptr(k_bias),
        Arg::I32(i32::from(at.biases.is_some())),
        size_arg(dims.batch),
        size_arg(dims.seq),
        size_arg(dims.q_heads),
        size_arg(dims.kv_heads),
        size_arg(dims.capacity),
        size_arg(dims.head_dim),
        Arg::F32(theta),
        Arg::Ptr(fault),
    ]);
    let function = match (at.staged.is_some(), cache, bias) {
        (false, Stored::F32, Stored::F32) => "rope_kv_write_f32",
        (false, Stored::F32, Stored::BF16) => "rope_kv_write_f32_bf16",
        (false, Stored::BF16, Stored::BF16) => "rope_kv_write_bf16",
        (false, Stored::BF16, Stored::F32) => "rope_kv_write_bf16_f32",
        (true, Stored::F32, Stored::F32) => "rope_kv_stage_f32",
        (true, Stored::F32, Stored::BF16) => "rope_kv_stage_f32_bf16",
        (true, Stored::BF16, Stored::BF16) => "rope_kv_stage_bf16",
        (true, Stored::BF16, Stored::F32) => "rope_kv_stage_bf16_f32",
    };
    if at.staged.is_some() {
        // A block per token at a time, its angles in shared memory (cache.cu).
        let blocks = (dims.batch * dims.seq).clamp(1, MAX_GRID_X) as u32;
        let shared = (dims.head_dim * 4) as u32;
        return Kernel::launch(
            "cache",
            function,
            (blocks, 1, 1),
            (BLOCK_THREADS, 1, 1),
            shared,
            args,
        );
    }
    let pairs = dims.batch * dims.seq * (dims.q_heads + dims.kv_heads) * (dims.head_dim / 2);
    let values = dims.batch * dims.kv_heads * dims.seq * dims.head_dim;
    grid_stride("cache", function, pairs + values, args)
}
