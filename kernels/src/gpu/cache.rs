//! Builder of `cache.cu`: writing new K/V rows into a cache at device-held positions.

use super::launch::{grid_stride, size_arg};
use super::{Addr, Arg, Launch, Stored};

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
