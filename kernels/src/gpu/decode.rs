//! Builders of `decode.cu`: attention over a KV cache split over keys (one block per chunk of
//! [`key_chunk`] cache rows of one KV head and all its query heads), then combined: inside the
//! split launch where its chunks form one thread block cluster ([`finishes_in_clusters`]), else
//! by one combine block per query head and row.

use super::attention::AttentionDims;
use super::cache::CacheRows;
use super::launch::{grid_dim, size_arg, MAX_CLUSTER_BLOCKS, MAX_GRID_X, MAX_GRID_YZ};
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
    (group * d + chunk * (d + 1) + chunk * d + group * chunk) * 4
}

/// The dynamic shared memory a block may take without opting in to more.
const MAX_SHARED_BYTES: u64 = 48 * 1024;

/// Whether the split launch combines its chunks itself, as one cluster of its `splits` blocks
/// per KV head and row (given a device with thread block clusters): 2 to [`MAX_CLUSTER_BLOCKS`]
/// chunks, and heads the block's threads cover a thread per element.
pub fn finishes_in_clusters(dims: &AttentionDims, clusters: bool) -> bool {
    let splits = splits(dims.kv_len, dims.head_dim);
    clusters
        && (2..=MAX_CLUSTER_BLOCKS).contains(&splits)
        && dims.head_dim <= u64::from(BLOCK_THREADS)
}

/// Bytes of the partial results, `[B,Hq,T,splits,D+2]` f32.
pub fn partials_bytes(dims: &AttentionDims) -> u64 {
    dims.batch
        * dims.q_heads
        * dims.q_len
        * splits(dims.kv_len, dims.head_dim)
        * (dims.head_dim + 2)
        * 4
}

/// `out [B,T,Hq,D]` over the caches `[S,Hkv,Smax,D]` (`dims.kv_len` = Smax) at `positions [B]`
/// (i64) of each batch row's cache row, with `partials` scratch of [`partials_bytes`]: the
/// split launch, finished in clusters where [`finishes_in_clusters`] (`clusters`: the device
/// has them), else followed by the combine. A position outside `0..=Smax - T` or a slot
/// outside the pool raises the `fault` word.
pub fn cached_attention_f32(
    out: Addr,
    partials: Addr,
    [q, k_cache, v_cache, positions]: [Addr; 4],
    cache_rows: CacheRows,
    (dims, scale, stored): (AttentionDims, f32, Stored),
    (fault, clusters): (Addr, bool),
) -> Result<Vec<Launch>> {
    let split_function = stored.pick(
        "cached_attention_split_f32",
        "cached_attention_split_f32_bf16",
    );
    const SPLIT: &str = "cached_attention_split_f32";
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
    let finish = finishes_in_clusters(&dims, clusters);
    let split_args = vec![
        Arg::Ptr(out),
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
        Arg::I32(i32::from(finish)),
    ];
    let grid = (
        grid_dim(SPLIT, "splits", splits, MAX_GRID_X)?,
        kv_heads,
        rows,
    );
    let split = Launch::Kernel(Kernel {
        module: MODULE,
        function: split_function,
        grid,
        block: (BLOCK_THREADS, 1, 1),
        shared_bytes: shared as u32,
        cluster: (if finish { grid.0 } else { 1 }, 1, 1),
        args: split_args,
    });
    if finish {
        return Ok(vec![split]);
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(kv_len: u64, head_dim: u64) -> AttentionDims {
        AttentionDims {
            batch: 3,
            q_heads: 14,
            kv_heads: 2,
            q_len: 1,
            kv_len,
            head_dim,
        }
    }

    fn launches(dims: AttentionDims, clusters: bool) -> Vec<Launch> {
        let at = |slot| Addr { slot, offset: 0 };
        let inputs = [at(2), at(3), at(4), at(5)];
        let how = (dims, 0.125, Stored::BF16);
        cached_attention_f32(at(0), at(1), inputs, CacheRows::Own, how, (at(6), clusters)).unwrap()
    }

    fn cluster(launch: &Launch) -> (u32, u32, u32) {
        match launch {
            Launch::Kernel(kernel) => kernel.cluster,
            other => panic!("not a kernel: {other:?}"),
        }
    }

    #[test]
    fn the_split_launch_combines_its_chunks_in_clusters_of_2_to_16() {
        // 1024 rows of 64 dims: 16 chunks, one cluster of 16 per KV head and row.
        let finished = launches(dims(1024, 64), true);
        assert_eq!(finished.len(), 1);
        assert_eq!(cluster(&finished[0]), (16, 1, 1));
        // The same without clusters: the split, then the combine.
        let combined = launches(dims(1024, 64), false);
        assert_eq!(combined.len(), 2);
        assert_eq!(cluster(&combined[0]), (1, 1, 1));
        // 1024 rows of 128 dims are 32 chunks of 32, more than a cluster holds; one chunk
        // needs no combine of chunks but takes the combine launch.
        for (kv_len, head_dim) in [(1024, 128), (40, 64)] {
            let launches = launches(dims(kv_len, head_dim), true);
            assert_eq!(launches.len(), 2, "{kv_len} rows of {head_dim}");
            assert_eq!(cluster(&launches[0]), (1, 1, 1));
        }
    }
}
