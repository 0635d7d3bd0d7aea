//! Builders of `decode.cu`: attention over a KV cache split over keys (one block per chunk of
//! [`key_chunk`] cache rows of one KV head and all its query heads), then the chunks combined:
//! inside the launch where a row's chunks fit one thread block cluster, else by one combine
//! block per query head and row.

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

/// Bytes of the partial results, `[B,Hq,T,splits,D+2]` f32.
pub fn partials_bytes(dims: &AttentionDims) -> u64 {
    dims.batch
        * dims.q_heads
        * dims.q_len
        * splits(dims.kv_len, dims.head_dim)
        * (dims.head_dim + 2)
        * 4
}

/// Whether the split launch combines its chunks itself, each row's chunks of one KV head
/// launched as one thread block cluster (given a device with clusters, `clusters`): where
/// there are 2 to [`MAX_CLUSTER_BLOCKS`] chunks and a split block's threads cover a head's
/// dims (the combine's thread per element).
pub fn cluster_combine(dims: &AttentionDims, clusters: bool) -> bool {
    let splits = splits(dims.kv_len, dims.head_dim);
    clusters
        && (2..=MAX_CLUSTER_BLOCKS).contains(&splits)
        && dims.head_dim <= u64::from(BLOCK_THREADS)
}

/// `out [B,T,Hq,D]` over the caches `[S,Hkv,Smax,D]` (`dims.kv_len` = Smax) at `positions [B]`
/// (i64) of each batch row's cache row, with `partials` scratch of [`partials_bytes`]: the
/// split launch, combining its chunks in clusters where [`cluster_combine`] says so, else
/// followed by the combine launch. A position outside `0..=Smax - T` or a slot outside the
/// pool raises the `fault` word.
pub fn cached_attention_f32(
    out: Addr,
    partials: Addr,
    [q, k_cache, v_cache, positions]: [Addr; 4],
    cache_rows: CacheRows,
    (dims, scale, stored): (AttentionDims, f32, Stored),
    fault: Addr,
    clusters: bool,
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
    let combined = cluster_combine(&dims, clusters);
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
        Arg::I32(i32::from(combined)),
    ];
    // Each chunk's weight, the total and the empty flag (decode.cu).
    let combine_shared = (splits + 2) * 4;
    let grid_x = grid_dim(SPLIT, "splits", splits, MAX_GRID_X)?;
    let split = Launch::Kernel(Kernel {
        module: MODULE,
        function: split_function,
        grid: (grid_x, kv_heads, rows),
        block: (BLOCK_THREADS, 1, 1),
        // The combine reuses the chunk's shared memory.
        shared_bytes: shared.max(combine_shared) as u32,
        cluster: (if combined { grid_x } else { 1 }, 1, 1),
        args: split_args,
    });
    if combined {
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

    fn launches(kv_len: u64, head_dim: u64, clusters: bool) -> Vec<Launch> {
        let dims = AttentionDims {
            batch: 3,
            q_heads: 14,
            kv_heads: 2,
            q_len: 1,
            kv_len,
            head_dim,
        };
        let at = |slot| Addr { slot, offset: 0 };
        let inputs = [at(2), at(3), at(4), at(5)];
        let stored = (dims, 0.125, Stored::BF16);
        cached_attention_f32(
            at(0),
            at(1),
            inputs,
            CacheRows::Own,
            stored,
            at(6),
            clusters,
        )
        .unwrap()
    }

    fn kernel(launch: &Launch) -> &Kernel {
        match launch {
            Launch::Kernel(kernel) => kernel,
            other => panic!("not a kernel: {other:?}"),
        }
    }

    /// 2 to 16 chunks (up to 1024 rows of 64 dims) combine inside the split launch, a row's
    /// chunks of one KV head one cluster; one chunk, 17 or more, or no clusters take the
    /// combine launch.
    #[test]
    fn chunks_combine_in_clusters_where_they_fit_one() {
        for (kv_len, head_dim, clusters, combined) in [
            (1024, 64, true, true),
            (65, 64, true, true),
            (1024, 64, false, false),
            (64, 64, true, false),
            (1025, 64, true, false),
            (1024, 128, true, false), // 32 chunks of 32 rows
            (512, 128, true, true),
        ] {
            let launches = launches(kv_len, head_dim, clusters);
            let split = kernel(&launches[0]);
            let chunks = splits(kv_len, head_dim) as u32;
            assert_eq!(split.grid.0, chunks);
            let what = format!("{kv_len} rows of {head_dim} dims, clusters {clusters}");
            assert_eq!(
                split.args.last(),
                Some(&Arg::I32(i32::from(combined))),
                "{what}"
            );
            match combined {
                true => {
                    assert_eq!(launches.len(), 1, "{what}");
                    assert_eq!(split.cluster, (chunks, 1, 1), "{what}");
                }
                false => {
                    assert_eq!(launches.len(), 2, "{what}");
                    assert_eq!(split.cluster, (1, 1, 1), "{what}");
                    assert_eq!(
                        kernel(&launches[1]).function,
                        "cached_attention_combine_f32"
                    );
                }
            }
        }
    }
}
