//! Builder of `cache.cu`: writing new K/V rows into a cache at device-held positions.

use super::launch::{grid_stride, size_arg};
use super::{Addr, Arg, Launch, Stored};

/// Rows `positions[b]..+T` of `cache [B,H,Smax,D]` ← `fresh [B,H,T,D]` (positions i64 `[B]`);
/// `fresh` must hold some element. A position that leaves no room for `T` rows raises the
/// `fault` word.
pub fn kv_cache_write_f32(
    (cache, stored): (Addr, Stored),
    fresh: Addr,
    positions: Addr,
    [batch, heads, capacity, block, head_dim]: [u64; 5],
    fault: Addr,
) -> Launch {
    let args = vec![
        Arg::Ptr(cache),
        Arg::Ptr(fresh),
        Arg::Ptr(positions),
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
