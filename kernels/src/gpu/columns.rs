//! Column sums of a `[rows, cols]` term split over chunks of rows (`columns.cuh`): the bias
//! gradients (`sum_to_shape_f32`) and the norms' weight gradients
//! (`rmsnorm_backward_weight_f32`).
//!
//! Why chunks. One block per 32 columns walks every row, each of its threads one load after
//! another: at 2048 rows and 896 columns that is 28 blocks for 132 SMs, each thread waiting
//! out 128 loads from memory. Chunks of rows multiply the blocks (each chunk's sums go to a
//! partial row in the workspace, then `column_sums_finish_f32` adds the partials in chunk
//! order: one launch more, a fixed order). A sum with one chunk (few rows: decode, the tiny
//! programs) writes the result directly, in the order of the single-block kernel.
//!
//! Split rule ([`column_split`], a function of the shape alone): enough chunks for one wave of
//! four 512-thread blocks per SM, none shorter than [`MIN_CHUNK_ROWS`] rows (eight per lane).

use super::launch::{grid_dim, grid_stride, size_arg, MAX_GRID_X, MAX_GRID_YZ, SMS};
use super::{Addr, Arg, Kernel, Launch};
use crate::Result;

/// Row residue classes of a block (the C header's `KILN_COLUMN_ROW_LANES`).
pub const ROW_LANES: u32 = 16;
/// Columns of a block (one warp).
const BLOCK_COLUMNS: u64 = 32;
/// The fewest rows of a chunk: eight for each lane.
pub const MIN_CHUNK_ROWS: u64 = 8 * ROW_LANES as u64;
/// Blocks the split aims at: four of 512 threads on each SM (2048 threads, an SM's most).
const TARGET_BLOCKS: u64 = 4 * SMS;

/// How a column sum of `rows` rows is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColumnSplit {
    /// Chunks of rows (grid y); 1 means no partials.
    pub chunks: u64,
    /// Rows of each chunk (the last may have fewer); at least 1.
    pub chunk_rows: u64,
}

/// The split of a `[rows, cols]` sum (see the module doc).
pub fn column_split(rows: u64, cols: u64) -> ColumnSplit {
    let tiles = cols.div_ceil(BLOCK_COLUMNS).max(1);
    let wanted = TARGET_BLOCKS.div_ceil(tiles);
    let chunks = wanted.min(rows / MIN_CHUNK_ROWS).clamp(1, MAX_GRID_YZ);
    let chunk_rows = rows.div_ceil(chunks).max(1);
    ColumnSplit {
        // Rounding chunk_rows up may leave the last chunks empty: drop them.
        chunks: rows.div_ceil(chunk_rows).max(1),
        chunk_rows,
    }
}

/// Workspace bytes of a `[rows, cols]` sum: the chunks' partials, none for one chunk.
pub fn partials_bytes(rows: u64, cols: u64) -> u64 {
    match column_split(rows, cols).chunks {
        1 => 0,
        chunks => chunks * cols * 4,
    }
}

/// `function` of `module` over `[rows, cols]` (`cols > 0`) into `out [cols]`, its arguments
/// `args` (the output first, its sizes and `chunk_rows` last, which this appends), then the
/// finish over the partials in `workspace` (of [`partials_bytes`]) where there are chunks.
pub fn column_sums(
    (module, function): (&'static str, &'static str),
    out: Addr,
    mut args: Vec<Arg>,
    [rows, cols]: [u64; 2],
    workspace: Addr,
) -> Result<Vec<Launch>> {
    let split = column_split(rows, cols);
    let target = match split.chunks {
        1 => out,
        _ => workspace,
    };
    args.insert(0, Arg::Ptr(target));
    args.extend([size_arg(rows), size_arg(cols), size_arg(split.chunk_rows)]);
    let grid = (
        grid_dim(function, "cols", cols.div_ceil(BLOCK_COLUMNS), MAX_GRID_X)?,
        grid_dim(function, "row chunks", split.chunks, MAX_GRID_YZ)?,
        1,
    );
    let block = (BLOCK_COLUMNS as u32, ROW_LANES, 1);
    let mut launches = vec![Kernel::launch(module, function, grid, block, 0, args)];
    if split.chunks > 1 {
        let args = vec![
            Arg::Ptr(out),
            Arg::Ptr(workspace),
            size_arg(split.chunks),
            size_arg(cols),
        ];
        launches.push(grid_stride(
            "elementwise",
            "column_sums_finish_f32",
            cols,
            args,
        ));
    }
    Ok(launches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_columns_split_into_chunks_of_at_least_the_minimum_rows() {
        // Few rows: one chunk, the result written directly.
        assert_eq!(
            column_split(1, 896),
            ColumnSplit {
                chunks: 1,
                chunk_rows: 1
            }
        );
        assert_eq!(column_split(200, 64).chunks, 1);
        assert_eq!(partials_bytes(200, 64), 0);
        // 2048 x 896: 28 column tiles want 19 chunks, 2048 rows allow 16 of 128.
        assert_eq!(
            column_split(2048, 896),
            ColumnSplit {
                chunks: 16,
                chunk_rows: 128
            }
        );
        assert_eq!(partials_bytes(2048, 896), 16 * 896 * 4);
        // 512 x 896: 4 chunks; 2048 x 128: 16.
        assert_eq!(column_split(512, 896).chunks, 4);
        assert_eq!(column_split(2048, 128).chunks, 16);
        // Wide: one tile per 32 columns already fills the GPU.
        assert_eq!(column_split(4096, 151_936).chunks, 1);
        // Every row is in exactly one chunk.
        for (rows, cols) in [(1000, 7), (129, 33), (4095, 896), (300, 1)] {
            let split = column_split(rows, cols);
            assert!(split.chunk_rows * split.chunks >= rows);
            assert!(split.chunk_rows * (split.chunks - 1) < rows);
            assert!(split.chunks == 1 || split.chunk_rows >= MIN_CHUNK_ROWS);
        }
    }

    #[test]
    fn a_split_sum_writes_partials_then_finishes_into_the_result() {
        let (out, src, workspace) = (
            Addr { slot: 0, offset: 0 },
            Addr { slot: 1, offset: 0 },
            Addr { slot: 2, offset: 0 },
        );
        let name = ("elementwise", "sum_to_shape_f32");
        let one = column_sums(name, out, vec![Arg::Ptr(src)], [100, 64], workspace).unwrap();
        let [Launch::Kernel(kernel)] = &one[..] else {
            panic!("{one:?}")
        };
        assert_eq!(kernel.grid, (2, 1, 1));
        assert!(matches!(kernel.args[0], Arg::Ptr(a) if a == out));
        let split = column_sums(name, out, vec![Arg::Ptr(src)], [2048, 896], workspace).unwrap();
        let [Launch::Kernel(partial), Launch::Kernel(finish)] = &split[..] else {
            panic!("{split:?}")
        };
        assert_eq!(partial.grid, (28, 16, 1));
        assert!(matches!(partial.args[0], Arg::Ptr(a) if a == workspace));
        assert_eq!(finish.function, "column_sums_finish_f32");
        assert!(
            matches!(finish.args[..2], [Arg::Ptr(o), Arg::Ptr(w)] if o == out && w == workspace)
        );
    }
}
