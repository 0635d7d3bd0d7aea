//! Builders of `flash.cu` and `flash_backward.cu`: FlashAttention forward (out and the per-row
//! log-sum-exp) and backward (Δ, dK/dV per key tile, dQ per query tile), under the contract of
//! `kiln_kernels::attention::flash`. Head dims up to 128: the tile kernels read bf16 rows of
//! the smallest padded head dim (16, 32, 64, 128) that holds them, and each is that dim's
//! instance. An operand is staged in the workspace as such rows unless it already is one: a
//! bf16 q, k or v (the rounding the kernels take) of a padded head dim is read where it is (it
//! must start 16-byte aligned, as every slot does: the workspace has no room to stage it, so
//! a misaligned one is refused); `grad_out` is always staged (it is re-laid head-major). The
//! forward that rounds to f16 instead stages its f32 q, k, v as f16 rows (the same bytes), and
//! reads f16 ones where they are as the bf16 forward does bf16 ones.

use super::attention::AttentionDims;
use super::embedding::zero_f32;
use super::launch::{
    all_aligned, grid_dim, grid_stride_blocks, size_arg, MAX_GRID_X, MAX_GRID_YZ, SMS,
};
use super::{Addr, Arg, Forms, Kernel, Launch, BLOCK_THREADS, SLOT_ALIGN};
use crate::{Error, Result};
use kiln_ir::DType;

const MODULE: &str = "flash";
/// Threads per block of the tile kernels (4 warps; the two-group forward has twice as many).
const TILE_THREADS: u32 = 128;
/// Query (or key) rows per block of the tile kernels.
const TILE_ROWS: u64 = 64;

/// The padded head dim of the kernels for `head_dim`, or an error past
/// [`MAX_HEAD_DIM`](crate::attention::flash::MAX_HEAD_DIM).
fn padded(function: &'static str, head_dim: u64) -> Result<u64> {
    match [16, 32, 64, 128].into_iter().find(|&d| head_dim <= d) {
        Some(d) => Ok(d),
        None => Err(Error::Argument {
            op: function,
            argument: "head_dim",
            reason: format!("{head_dim}: flash attention takes head dims up to 128"),
        }),
    }
}

/// The tile kernels of the `flash` module, one instance per padded head dim.
#[derive(Clone, Copy, Debug)]
enum TileKernel {
    /// The forward, rounding to f16 (or bf16), in two warp groups (or one).
    Forward {
        f16: bool,
        groups: bool,
    },
    KeysValues,
    Queries,
}

impl TileKernel {
    /// The forward for `dims`: in two warp groups where its blocks (`B·Hq·⌈T/64⌉`) are fewer
    /// than the SMs. Below one wave the idle SMs cannot help; two groups put twice the warps
    /// on each busy SM, each group down half the key tiles. At a wave or more the SMs are
    /// already full, and the groups' half-size tiles (both groups' buffers share the 48 KB)
    /// cost more barriers: slower at T = 2048 (BENCHMARKS.md, 2026-12-05).
    fn forward(dims: &AttentionDims, f16: bool) -> TileKernel {
        let blocks = dims.batch * dims.q_heads * dims.q_len.div_ceil(TILE_ROWS);
        TileKernel::Forward {
            f16,
            groups: blocks < SMS,
        }
    }

    /// Threads per block: 4 warps, 8 for the two-group forward.
    fn threads(self) -> u32 {
        match self {
            TileKernel::Forward { groups: true, .. } => 2 * TILE_THREADS,
            _ => TILE_THREADS,
        }
    }

    /// The name of the kernel's instance for the padded head dim `d` (16, 32, 64 or 128).
    fn instance(self, d: u64) -> &'static str {
        let names: [&'static str; 4] = match self {
            TileKernel::Forward {
                f16: false,
                groups: false,
            } => [
                "flash_attention_forward_d16",
                "flash_attention_forward_d32",
                "flash_attention_forward_d64",
                "flash_attention_forward_d128",
            ],
            TileKernel::Forward {
                f16: false,
                groups: true,
            } => [
                "flash_attention_forward_groups_d16",
                "flash_attention_forward_groups_d32",
                "flash_attention_forward_groups_d64",
                "flash_attention_forward_groups_d128",
            ],
            TileKernel::Forward {
                f16: true,
                groups: false,
            } => [
                "flash_attention_forward_f16_d16",
                "flash_attention_forward_f16_d32",
                "flash_attention_forward_f16_d64",
                "flash_attention_forward_f16_d128",
            ],
            TileKernel::Forward {
                f16: true,
                groups: true,
            } => [
                "flash_attention_forward_f16_groups_d16",
                "flash_attention_forward_f16_groups_d32",
                "flash_attention_forward_f16_groups_d64",
                "flash_attention_forward_f16_groups_d128",
            ],
            TileKernel::KeysValues => [
                "flash_attention_backward_kv_d16",
                "flash_attention_backward_kv_d32",
                "flash_attention_backward_kv_d64",
                "flash_attention_backward_kv_d128",
            ],
            TileKernel::Queries => [
                "flash_attention_backward_q_d16",
                "flash_attention_backward_q_d32",
                "flash_attention_backward_q_d64",
                "flash_attention_backward_q_d128",
            ],
        };
        names[d.trailing_zeros() as usize - 4]
    }
}

/// The attention rule (`Hkv` divides `Hq`, `T <= S`) and the padded head dim.
fn check(function: &'static str, dims: &AttentionDims) -> Result<u64> {
    dims.check(function)?;
    padded(function, dims.head_dim)
}

/// Each operand (q, k, v, then grad_out) `stored` f32 (rounded by the kernels' stagings) or in
/// the `rounding`'s dtype (already rounded).
fn check_stored(function: &'static str, stored: &[DType], rounding: DType) -> Result<()> {
    let names = ["q", "k", "v", "grad_out"];
    match (names.iter().zip(stored)).find(|(_, &s)| s != DType::F32 && s != rounding) {
        Some((name, other)) => Err(Error::Argument {
            op: function,
            argument: "stored",
            reason: format!(
                "{name} is {other} under the {rounding} rounding: each operand f32 or of the \
                 rounding's dtype"
            ),
        }),
        None => Ok(()),
    }
}

/// The size arguments every tile kernel takes after its pointers: `q_heads, kv_heads, q_len,
/// kv_len, hd, scale`.
fn size_args(dims: &AttentionDims, scale: f32) -> [Arg; 6] {
    [
        size_arg(dims.q_heads),
        size_arg(dims.kv_heads),
        size_arg(dims.q_len),
        size_arg(dims.kv_len),
        size_arg(dims.head_dim),
        Arg::F32(scale),
    ]
}

/// `kernel`'s instance for the padded head dim `d` over `(x, tiles of 64 rows)`.
fn tile_launch(
    kernel: TileKernel,
    d: u64,
    x: (u64, &'static str),
    rows: u64,
    args: Vec<Arg>,
) -> Result<Launch> {
    let function = kernel.instance(d);
    let grid = (
        grid_dim(function, x.1, x.0, MAX_GRID_X)?,
        grid_dim(function, "row tiles", rows.div_ceil(TILE_ROWS), MAX_GRID_YZ)?,
        1,
    );
    Ok(Kernel::launch(
        MODULE,
        function,
        grid,
        (kernel.threads(), 1, 1),
        0,
        args,
    ))
}

/// Bytes of `rows` staged rows of a padded head dim `d` (bf16), rounded up to [`SLOT_ALIGN`].
fn staged_bytes(rows: u64, d: u64) -> u64 {
    (rows * d * 2).next_multiple_of(SLOT_ALIGN)
}

/// Whether an operand stored in `stored` (f32, or its rounding's 16-bit dtype: already
/// rounded) is staged for the kernels of padded head dim `d`: f32 always (the rounding), a
/// rounded one where its rows are not yet of `d` elements.
fn staged(stored: DType, head_dim: u64, d: u64) -> bool {
    stored == DType::F32 || head_dim != d
}

/// `flash_attention_stage`: `rows` rows of `hd` elements at `src` (f32, bf16 or f16) as rows of
/// `d` at `dst` (bf16, or f16 with `f16`); `bthd` re-lays `[B,T,Hq,hd]` (q_heads, q_len of
/// `dims`) as `[B,Hq,T,d]`.
fn stage(
    dst: Addr,
    (src, stored): (Addr, DType),
    (rows, d): (u64, u64),
    dims: &AttentionDims,
    (bthd, f16): (bool, bool),
) -> Launch {
    let chunks = rows * (d / 8);
    let function = match (stored, f16) {
        (DType::F32, true) => "flash_attention_stage_f16",
        (DType::F32, false) => "flash_attention_stage",
        // bf16 widened and rounded again is every bf16 bit pattern but some NaN payloads (a NaN
        // stays a NaN), so the bf16 staging copies the rows of an f16 operand (already its
        // rounding) too: zeros past hd are zeros in either.
        (DType::BF16 | DType::F16, _) => "flash_attention_stage_bf16",
        (other, _) => unreachable!("flash_attention_f32 refuses {other} operands"),
    };
    Kernel::launch(
        MODULE,
        function,
        (grid_stride_blocks(chunks), 1, 1),
        (BLOCK_THREADS, 1, 1),
        0,
        vec![
            Arg::Ptr(dst),
            Arg::Ptr(src),
            size_arg(rows),
            size_arg(dims.head_dim),
            size_arg(d),
            size_arg(dims.q_heads),
            size_arg(dims.q_len),
            Arg::I32(i32::from(bthd)),
        ],
    )
}

/// Where the staged operands (and the backward's scratch) lie in a workspace, in this order;
/// an operand read where it is takes no bytes.
#[derive(Clone, Copy, Debug)]
struct Regions {
    q: Addr,
    k: Addr,
    v: Addr,
    /// `grad_out` staged as `[B,Hq,T,d]` (backward).
    grad_out: Addr,
    /// Δ, `[B,Hq,T]` f32 (backward).
    delta: Addr,
    /// Per query head dK, dV `[B,Hq,S,hd]` f32 (backward, GQA groups of more than one head).
    partial_k: Addr,
    partial_v: Addr,
    end: u64,
}

impl Regions {
    /// `stored`: the storage of q, k and v.
    fn new(base: Addr, dims: &AttentionDims, d: u64, stored: [DType; 3]) -> Regions {
        let q_rows = dims.batch * dims.q_heads * dims.q_len;
        let kv_rows = dims.batch * dims.kv_heads * dims.kv_len;
        let partial = match dims.q_heads > dims.kv_heads {
            true => (dims.batch * dims.q_heads * dims.kv_len * dims.head_dim * 4)
                .next_multiple_of(SLOT_ALIGN),
            false => 0,
        };
        let operand = |stored: DType, rows: u64| match staged(stored, dims.head_dim, d) {
            true => staged_bytes(rows, d),
            false => 0,
        };
        let sizes = [
            operand(stored[0], q_rows),
            operand(stored[1], kv_rows),
            operand(stored[2], kv_rows),
            staged_bytes(q_rows, d),
            (q_rows * 4).next_multiple_of(SLOT_ALIGN),
            partial,
            partial,
        ];
        let mut at = [base; 7];
        let mut end = 0;
        for (slot, size) in at.iter_mut().zip(sizes) {
            *slot = base.add(end);
            end += size;
        }
        let [q, k, v, grad_out, delta, partial_k, partial_v] = at;
        Regions {
            q,
            k,
            v,
            grad_out,
            delta,
            partial_k,
            partial_v,
            end,
        }
    }

    /// Where the kernels read q, k and v (at `src`, of storages `stored`): each staged into its
    /// region first (pushed onto `launches`; as f16 rows with `f16`) or read where it is
    /// ([`rows_of`]); none without rows (the region's address then, which no kernel reads).
    fn operands(
        &self,
        (src, stored): ([Addr; 3], [DType; 3]),
        dims: &AttentionDims,
        (d, f16, function): (u64, bool, &'static str),
        launches: &mut Vec<Launch>,
    ) -> Result<[Addr; 3]> {
        let q_rows = dims.batch * dims.q_heads * dims.q_len;
        let kv_rows = dims.batch * dims.kv_heads * dims.kv_len;
        let mut at = [self.q, self.k, self.v];
        let rows = [q_rows, kv_rows, kv_rows];
        for (i, name) in ["q", "k", "v"].into_iter().enumerate() {
            if rows[i] > 0 {
                let operand = (src[i], stored[i]);
                let to = (at[i], rows[i]);
                at[i] = rows_of(launches, to, operand, (d, f16), dims, (function, name))?;
            }
        }
        Ok(at)
    }

    /// The forward's part: the staged q, k, v.
    fn forward_bytes(&self) -> u64 {
        self.grad_out.offset - self.q.offset
    }
}

/// Workspace of [`flash_attention_f32`] with q, k, v of storages `stored`: those staged as
/// bf16 (or f16) rows of the padded head dim.
pub fn forward_workspace_bytes(dims: &AttentionDims, stored: [DType; 3]) -> u64 {
    padded("flash_attention_f32", dims.head_dim).map_or(0, |d| {
        Regions::new(Addr { slot: 0, offset: 0 }, dims, d, stored).forward_bytes()
    })
}

/// Workspace of [`flash_attention_backward_f32`] with q, k, v of storages `stored`: those
/// staged, grad_out staged, Δ, and the per-query-head dK, dV of GQA groups.
pub fn backward_workspace_bytes(dims: &AttentionDims, stored: [DType; 3]) -> u64 {
    padded("flash_attention_backward_f32", dims.head_dim).map_or(0, |d| {
        Regions::new(Addr { slot: 0, offset: 0 }, dims, d, stored).end
    })
}

/// Where the kernels read an operand of `rows` rows: staged into `region` first (pushed onto
/// `launches`; an f32 one as f16 rows with `f16`), or where it is (a bf16 or f16 operand of
/// `d`-element rows, 16-byte aligned for the tiles' copies).
fn rows_of(
    launches: &mut Vec<Launch>,
    (region, rows): (Addr, u64),
    (src, stored): (Addr, DType),
    (d, f16): (u64, bool),
    dims: &AttentionDims,
    (function, name): (&'static str, &'static str),
) -> Result<Addr> {
    if staged(stored, dims.head_dim, d) {
        launches.push(stage(region, (src, stored), (rows, d), dims, (false, f16)));
        return Ok(region);
    }
    if !all_aligned(&[src], 16) {
        return Err(Error::Argument {
            op: function,
            argument: name,
            reason: format!(
                "a 16-bit operand at byte offset {} is not 16-byte aligned",
                src.offset
            ),
        });
    }
    Ok(src)
}

/// The forward's operands, results and workspace: `q [B,Hq,T,D]`, `k`, `v [B,Hkv,S,D]`
/// (f32, or the rounding's dtype: `stored`), `out [B,T,Hq,D]` (f32, rounded to bf16, or
/// both), `lse [B,Hq,T]` (f32), `workspace` of [`forward_workspace_bytes`], and the dtype the
/// products' operands are rounded to (bf16 or f16).
#[derive(Clone, Copy, Debug)]
pub struct FlashForward {
    pub q: Addr,
    pub k: Addr,
    pub v: Addr,
    pub out: Forms,
    pub lse: Addr,
    pub workspace: Addr,
    /// The storage of q, k and v.
    pub stored: [DType; 3],
    pub rounding: DType,
}

/// q, k, v staged where they are not rows the kernels read, then one launch: a block per
/// (b·Hq + h, tile of 64 query rows), of two warp groups below one wave
/// ([`TileKernel::forward`]). Nothing when there is no query row.
pub fn flash_attention_f32(
    at: FlashForward,
    dims: AttentionDims,
    scale: f32,
) -> Result<Vec<Launch>> {
    const FUNCTION: &str = "flash_attention_f32";
    let d = check(FUNCTION, &dims)?;
    let f16 = match at.rounding {
        DType::BF16 | DType::F16 => at.rounding == DType::F16,
        rounding => {
            return Err(Error::Argument {
                op: FUNCTION,
                argument: "rounding",
                reason: format!("{rounding}: the products round to bf16 or f16"),
            })
        }
    };
    check_stored(FUNCTION, &at.stored, at.rounding)?;
    let q_rows = dims.batch * dims.q_heads * dims.q_len;
    if q_rows == 0 {
        return Ok(vec![]);
    }
    let regions = Regions::new(at.workspace, &dims, d, at.stored);
    let mut launches = Vec::new();
    let operands = ([at.q, at.k, at.v], at.stored);
    let [q, k, v] = regions.operands(operands, &dims, (d, f16, FUNCTION), &mut launches)?;
    let mut args = at.out.args().to_vec();
    args.extend([at.lse, q, k, v].map(Arg::Ptr));
    args.extend(size_args(&dims, scale));
    let heads = (dims.batch * dims.q_heads, "B·Hq");
    let forward = TileKernel::forward(&dims, f16);
    launches.push(tile_launch(forward, d, heads, dims.q_len, args)?);
    Ok(launches)
}

/// The backward's operands, results and workspace (of [`backward_workspace_bytes`]).
#[derive(Clone, Copy, Debug)]
pub struct FlashBackward {
    pub q: Addr,
    pub k: Addr,
    pub v: Addr,
    pub out: Addr,
    pub lse: Addr,
    pub grad_out: Addr,
    pub grad_q: Addr,
    pub grad_k: Addr,
    pub grad_v: Addr,
    pub workspace: Addr,
    /// The storage of q, k, v and grad_out (f32, or bf16: already rounded).
    pub stored: [DType; 4],
}

/// q, k, v staged where they are not rows the kernels read, grad_out staged, Δ (a warp per
/// query row), dK and dV (a block per (b·Hq + h,
/// tile of 64 keys), every key written, zeros where no query sees it; per query head and then
/// summed over each GQA group in head order), dQ (a block per query tile).
pub fn flash_attention_backward_f32(
    at: FlashBackward,
    dims: AttentionDims,
    scale: f32,
) -> Result<Vec<Launch>> {
    const FUNCTION: &str = "flash_attention_backward_f32";
    const REDUCE: &str = "flash_attention_backward_reduce";
    let d = check(FUNCTION, &dims)?;
    check_stored(FUNCTION, &at.stored, DType::BF16)?;
    let [q_stored, k_stored, v_stored, grad_out_stored] = at.stored;
    let stored = [q_stored, k_stored, v_stored];
    let regions = Regions::new(at.workspace, &dims, d, stored);
    let q_rows = dims.batch * dims.q_heads * dims.q_len;
    let kv_rows = dims.batch * dims.kv_heads * dims.kv_len;
    let mut launches = Vec::new();
    if kv_rows == 0 {
        // No key: T = 0 too, nothing to write.
        return Ok(launches);
    }
    if dims.q_heads == 0 {
        // No query head: the keys' gradients are zeros.
        let n = kv_rows * dims.head_dim;
        return Ok(match n {
            0 => launches,
            _ => vec![zero_f32(at.grad_k, n), zero_f32(at.grad_v, n)],
        });
    }
    let operands = ([at.q, at.k, at.v], stored);
    let [q, k, v] = regions.operands(operands, &dims, (d, false, FUNCTION), &mut launches)?;
    if q_rows > 0 {
        let grad_out = (at.grad_out, grad_out_stored);
        let rows = (q_rows, d);
        launches.push(stage(
            regions.grad_out,
            grad_out,
            rows,
            &dims,
            (true, false),
        ));
        let warps = u64::from(BLOCK_THREADS) / 32;
        let delta = match grad_out_stored {
            DType::BF16 => "flash_attention_backward_delta_bf16",
            _ => "flash_attention_backward_delta",
        };
        let blocks = grid_dim(
            delta,
            "B·Hq·T rows / warps",
            q_rows.div_ceil(warps),
            MAX_GRID_X,
        )?;
        launches.push(Kernel::launch(
            MODULE,
            delta,
            (blocks, 1, 1),
            (BLOCK_THREADS, 1, 1),
            0,
            vec![
                Arg::Ptr(regions.delta),
                Arg::Ptr(at.grad_out),
                Arg::Ptr(at.out),
                size_arg(dims.q_heads),
                size_arg(dims.q_len),
                size_arg(dims.head_dim),
                size_arg(q_rows),
            ],
        ));
    }
    let staged = [q, k, v, regions.grad_out].map(Arg::Ptr);
    let saved = [at.lse, regions.delta].map(Arg::Ptr);
    // One query head per block: a group's heads write partials, summed after.
    let grouped = dims.q_heads > dims.kv_heads;
    let (dk, dv) = match grouped {
        true => (regions.partial_k, regions.partial_v),
        false => (at.grad_k, at.grad_v),
    };
    let mut args = vec![Arg::Ptr(dk), Arg::Ptr(dv)];
    args.extend(staged);
    args.extend(saved);
    args.extend(size_args(&dims, scale));
    let heads = (dims.batch * dims.q_heads, "B·Hq");
    launches.push(tile_launch(
        TileKernel::KeysValues,
        d,
        heads,
        dims.kv_len,
        args,
    )?);
    let per_head = dims.kv_len * dims.head_dim;
    if grouped && per_head > 0 {
        let n = dims.batch * dims.kv_heads * per_head;
        launches.push(Kernel::launch(
            MODULE,
            REDUCE,
            (grid_stride_blocks(n), 1, 1),
            (BLOCK_THREADS, 1, 1),
            0,
            vec![
                Arg::Ptr(at.grad_k),
                Arg::Ptr(at.grad_v),
                Arg::Ptr(regions.partial_k),
                Arg::Ptr(regions.partial_v),
                size_arg(dims.q_heads / dims.kv_heads),
                size_arg(per_head),
                size_arg(n),
            ],
        ));
    }
    if q_rows > 0 {
        let mut args = vec![Arg::Ptr(at.grad_q)];
        args.extend(staged);
        args.extend(saved);
        args.extend(size_args(&dims, scale));
        launches.push(tile_launch(
            TileKernel::Queries,
            d,
            heads,
            dims.q_len,
            args,
        )?);
    }
    Ok(launches)
}

#[cfg(test)]
pub(super) mod tests;
