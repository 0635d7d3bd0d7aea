//! Builders of `decode.cu`: attention over a KV cache split over keys (one block per chunk of
//! [`key_chunk`] cache rows of one KV head and all its query heads, then one combine block per
//! query head and row).

use super::attention::AttentionDims;
use super::cache::CacheRows;
use super::launch::{grid_dim, size_arg, MAX_GRID_X, MAX_GRID_YZ};
use super::{Addr, Arg, Kernel, Launch, Stored, BLOCK_THREADS};
use crate::Result;

const MODULE: &str = "decode";

/// Cache rows per block of the split kernel: 64 for heads of up to 64 dims, fewer for wider
/// ones (the chunk's keys and values sit in shared memory), at least 16.
pub fn key_chunk(head_dim: u64) -> u64 {
    (4096 / head_dim.max(1)).clamp(16, 64)
}

/// Chunks of a cache of `capacity` rows.
pub fn splits(capacity: u64, head_dim: u64) -> u64 {
    capacity.div_ceil(key_chunk(head_dim)).max(1)
}

/// Dynamic shared memory of one split block, bytes (see `decode.cu`).
fn split_shared_bytes(dims: &AttentionDims) -> u64 {
    let group = dims.q_heads / dims.kv_heads.max(1);
    let (d, chunk) = (dims.head_dim, key_chunk(dims.head_dim));
    let key_stride = if d % 4 == 0 { d + 4 } else { d + 1 };
    (group * d + chunk * key_stride + chunk * d + group * chunk.next_multiple_of(4)) * 4
}

/// The dynamic shared memory a block may take without opting in to more.
const MAX_SHARED_BYTES: u64 = 48 * 1024;

/// Bytes of the partial results, `[B,Hq,T,splits,D+2]` f32.
pub fn partials_bytes(dims: &AttentionDims) -> u64 {
    dims.batch
        * dims.q_heads
        * dims.q_len
        * splits(dims.kv_len, dims.head_dim)
        * (dims.head_dim + 2)
        * 4
}

/// The split kernel's entry points: f32 caches, bf16 caches.
const SPLITS: [&str; 2] = [
    "cached_attention_split_f32",
    "cached_attention_split_f32_bf16",
];

/// The rows (B·T) of a cached attention's split launch from [`cached_attention_f32`] (its
/// grid's z); `None` for any other launch. The program forks its L2 prefetches beside the
/// splits of enough rows (`runtime/src/lower/prefetch.rs`).
pub fn split_rows(kernel: &Kernel) -> Option<u64> {
    (kernel.module == MODULE && SPLITS.contains(&kernel.function)).then_some(kernel.grid.2.into())
}

/// `out [B,T,Hq,D]` over the caches `[S,Hkv,Smax,D]` (`dims.kv_len` = Smax) at `positions [B]`
/// (i64) of each batch row's cache row, with `partials` scratch of [`partials_bytes`]: the
/// split launch, then the combine. A position outside `0..=Smax - T` or a slot outside the
/// pool raises the `fault` word.
pub fn cached_attention_f32(
    out: Addr,
    partials: Addr,
    [q, k_cache, v_cache, positions]: [Addr; 4],
    cache_rows: CacheRows,
    (dims, scale, stored): (AttentionDims, f32, Stored),
    fault: Addr,
) -> Result<Vec<Launch>> {
    let split_function = stored.pick(SPLITS[0], SPLITS[1]);
    const SPLIT: &str = SPLITS[0];
    const COMBINE: &str = "cached_attention_combine_f32";
    let shared = split_shared_bytes(&dims);
    if shared > MAX_SHARED_BYTES || dims.kv_heads == 0 {
        return Err(crate::Error::Argument {
            op: SPLIT,
            argument: "head_dim",
            reason: format!(
                "{} query heads per KV head of {} dims need {shared} bytes of shared memory, \
                 more than {MAX_SHARED_BYTES}",
                dims.q_heads / dims.kv_heads.max(1),
                dims.head_dim
            ),
        });
    }
    let splits = splits(dims.kv_len, dims.head_dim);
    let rows = grid_dim(SPLIT, "B·T", dims.batch * dims.q_len, MAX_GRID_YZ)?;
    let heads = grid_dim(SPLIT, "Hq", dims.q_heads, MAX_GRID_YZ)?;
    let kv_heads = grid_dim(SPLIT, "Hkv", dims.kv_heads, MAX_GRID_YZ)?;
    let [cache_rows, slots] = cache_rows.args(dims.batch);
    let split_args = vec![
        Arg::Ptr(partials),
        Arg::Ptr(q),
        Arg::Ptr(k_cache),
        Arg::Ptr(v_cache),
        Arg::Ptr(positions),
        cache_rows,
        slots,
        size_arg(dims.q_heads),
        size_arg(dims.kv_heads),
        size_arg(dims.q_len),
        size_arg(dims.kv_len),
        size_arg(dims.head_dim),
        size_arg(key_chunk(dims.head_dim)),
        Arg::F32(scale),
        Arg::Ptr(fault),
    ];
    let split = Kernel::launch(
        MODULE,
        split_function,
        (
            grid_dim(SPLIT, "splits", splits, MAX_GRID_X)?,
            kv_heads,
            rows,
        ),
        (BLOCK_THREADS, 1, 1),
        shared as u32,
        split_args,
    );
    let combine_args = vec![
        Arg::Ptr(out),
        Arg::Ptr(partials),
        size_arg(dims.q_heads),
        size_arg(dims.q_len),
        size_arg(dims.head_dim),
        size_arg(splits),
    ];
    // Each chunk's weight, the total and the empty flag (decode.cu).
    let combine_shared = (splits + 2) * 4;
    if combine_shared > MAX_SHARED_BYTES {
        return Err(crate::Error::Argument {
            op: COMBINE,
            argument: "kv_len",
            reason: format!(
                "{} cache rows make {splits} chunks, more than the combine's shared memory \
                 holds ({} chunks)",
                dims.kv_len,
                MAX_SHARED_BYTES / 4 - 2
            ),
        });
    }
    let combine = Kernel::launch(
        MODULE,
        COMBINE,
        (1, heads, rows),
        (dims.head_dim.next_multiple_of(32).max(32) as u32, 1, 1), // a thread per element
        combine_shared as u32,
        combine_args,
    );
    Ok(vec![split, combine])
}
