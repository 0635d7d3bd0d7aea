//! Builder of `linear.cu` and `linear_mma.cu`: a fused skinny linear layer for decode,
//! `y_g = x · w_gᵀ (+ bias_g)` for `m ≤ 32` rows and up to three bf16 weight groups sharing `x`
//! (q/k/v in one pass), or `out = silu(x · gateᵀ) · (x · upᵀ)` (SwiGLU). A candidate beside
//! cuBLASLt: [`SkinnyLinear::fits`] says whether it takes a shape, so the caller can fall back.
//! One row runs on CUDA cores (`linear_r1`), 2 to 32 rows on tensor cores (`linear_mma_r8`
//! .. `linear_mma_r32`, `m` padded to a multiple of 8); both share the column tiles, the split
//! rule, the workspace layout and the reduce kernel (`linear_reduce`).
//!
//! Cost. With `N = Σ n_g` output columns, the launches move `2·N·K` weight bytes (each read
//! from memory once for all rows), `M·K·(2|4)` bytes of x per 128-column tile (L2 hits after the
//! first), `4·M·N` output bytes and, with `s > 1` k splits, `2·4·s·M·N` bytes of partial sums
//! (written once, read once; a decode layer's partials fit in L2). They do `2·M·N·K` FLOPs: `M`
//! FLOPs per weight byte, 1 at `M = 1` (lm_head of Qwen2.5-0.5B: 272 MB of weights, ~63 µs at
//! 4.3 TB/s) and 32 at `M = 32`. f32 FMAs on CUDA cores (~67 TFLOP/s on an H200, ~15.6 per byte
//! of its bandwidth) turn compute-bound from ~8 rows, hence the tensor cores from 2 rows: ~990
//! TFLOP/s of dense bf16 is ~230 FLOPs per byte, so 32 rows stay bound by memory.
//!
//! Split rule ([`linear_plan`], a function of the shape alone): a block covers 128 columns;
//! too few tiles to fill the GPU also split k: on CUDA cores into as many ranges as keep the
//! launch within one wave of the blocks an H200 holds at once ([`CUDA_CORE_RESIDENT`]; a
//! second wave of a few blocks costs a whole block's latency at the end), on tensor cores into
//! enough for ~4 blocks per SM (measured: one wave loses there), in either case ranges of a
//! multiple of 64 elements, no shorter than 128 (each lane of the CUDA-core kernel then still
//! has two vectors per column; a warp of the tensor-core kernels one step of 4 chunks) and no
//! more than `k / (16·m)` of them on CUDA cores (partial sums written and read at most a quarter
//! of the weight bytes), `k / (8·m)` on tensor cores (half: a quarter would leave q/k/v of
//! Qwen2.5-0.5B, k = 896, unsplit at 32 rows, 9 blocks for 132 SMs; this bound is a choice
//! without a measurement yet).

use super::cache::CacheRows;
use super::launch::{
    all_aligned, grid_dim, grid_stride, size_arg, MAX_CLUSTER_BLOCKS, MAX_GRID_X, MAX_GRID_YZ, SMS,
};
use super::{Addr, Arg, GemmDType, Kernel, Launch, Stored};
use crate::{Error, Result};

/// The most rows of `x` the kernels take.
pub const LINEAR_MAX_ROWS: u64 = kiln_ir::LINEAR_MAX_ROWS as u64;
/// The fewest rows that run on tensor cores (`linear_mma.cu`); fewer run on CUDA cores.
pub const LINEAR_MMA_MIN_ROWS: u64 = 2;
/// The most weight groups of one launch.
pub const LINEAR_MAX_GROUPS: usize = 3;

const MODULE: &str = "linear";
const MMA_MODULE: &str = "linear_mma";
const OP: &str = "skinny_linear";
const THREADS: u32 = 256;
/// Virtual columns per block: 32 teams of 8 lanes, 4 columns each (`KILN_LINEAR_COLS`).
const TILE_COLUMNS: u64 = 128;
/// k ranges are multiples of this (8 lanes × one 8-element vector) ...
const SPLIT_ALIGN: u64 = 64;
/// ... and no shorter than this.
const MIN_SPLIT_K: u64 = 128;
/// f32 elements of x staged in shared memory at a time, over all rows: 32 KB (CUDA cores).
const STAGE_FLOATS: u64 = 8192;
/// bf16 elements of x staged at a time over all rows on tensor cores: 32 KB, plus ...
const STAGE_BF16: u64 = 16_384;
/// ... this many bf16 elements after each row (`KILN_MMA_PAD`: conflict-free fragment reads).
const MMA_PAD: u64 = 32;
/// Rows of x per mma n8 tile: the tensor-core kernels pad m to a multiple of this.
const MMA_TILE_ROWS: u64 = 8;
const F32_BYTES: u64 = 4;
const BF16_BYTES: u64 = 2;

/// One weight group: `w [n, k]` bf16 row-major (leading dim `k`: Hugging Face's `[out, in]`),
/// optional `bias [n]` bf16, output `out [m, n]` f32 row-major with `ldo` elements between rows.
#[derive(Clone, Copy, Debug)]
pub struct LinearGroup {
    pub w: Addr,
    pub bias: Option<Addr>,
    pub out: Addr,
    pub n: u64,
    pub ldo: u64,
}

/// A fused linear layer over `x [m, k]` (row-major, `ldx` elements between rows; f32 is rounded
/// to bf16 on load, as the IR's Cast, bf16 is used as is) and 1 to 3 groups. With `swiglu`,
/// `groups` holds gate then up (equal `n`) and the one output, `silu(gate) · up`, is written to
/// `groups[0].out` with `groups[0].ldo`; `groups[1].out` and `ldo` are ignored.
#[derive(Clone, Debug)]
pub struct SkinnyLinear {
    pub x: Addr,
    pub x_dtype: GemmDType,
    pub m: u64,
    pub k: u64,
    pub ldx: u64,
    pub groups: Vec<LinearGroup>,
    pub swiglu: bool,
}

/// How a shape is cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinearPlan {
    /// Whether the tensor-core kernels run (`m ≥ 2`), not the CUDA-core one.
    pub tensor_cores: bool,
    /// The kernel's row bucket: 1 on CUDA cores; on tensor cores `m` rounded up to a multiple
    /// of 8 (8, 16, 24 or 32: the mma n8 tiles).
    pub rows: u64,
    /// Blocks along the columns (grid x), [`TILE_COLUMNS`] virtual columns each.
    pub column_tiles: u64,
    /// Blocks along k (grid y), each over `split_k` elements (the last one's range may be
    /// shorter); 1 means no partial sums.
    pub splits: u64,
    pub split_k: u64,
    /// Elements of each x row staged in shared memory at a time.
    pub stage_k: u64,
}

impl LinearPlan {
    /// Whether a launch of this plan finishes its splits inside clusters (given a device with
    /// thread block clusters): on CUDA cores, with k split into at most
    /// [`MAX_CLUSTER_BLOCKS`] ranges, so that a column tile's splits form one cluster.
    /// Measured on the H200 (BENCHMARKS.md): decode at 1 row, 0.5B 0.94 → 0.91 ms (q/k/v and
    /// gate/up without their reduce launches), 1.5B 1.743 → 1.717 ms (q/k/v and o); at 8
    /// rows, on tensor cores, 0.5B 1.145 → 1.156 ms, so those keep the reduce launch.
    pub fn cluster_finish(&self, clusters: bool) -> bool {
        clusters && !self.tensor_cores && (2..=MAX_CLUSTER_BLOCKS).contains(&self.splits)
    }

    /// Dynamic shared memory of the main kernel, bytes: x staged as f32 on CUDA cores, as bf16
    /// with padded rows on tensor cores. At most 34 KB.
    pub fn shared_bytes(&self) -> u64 {
        match self.tensor_cores {
            true => self.rows * (self.stage_k + MMA_PAD) * BF16_BYTES,
            false => self.rows * self.stage_k * F32_BYTES,
        }
    }
}

/// Blocks of `linear_r1` an H200 holds at once: 132 SMs × the 2 blocks per SM that its 117
/// registers a thread allow (ptxas via NVRTC 13.0, sm_90, 256 threads;
/// tools/kernel_resources.py; shared memory, 32 KB a block, would allow 6).
pub const CUDA_CORE_RESIDENT: u64 = 2 * SMS;

/// Blocks the split rule aims at on tensor cores: 4 per SM. Measured on the H200
/// (BENCHMARKS.md): one wave of resident blocks (3 per SM at 8 rows) made 0.5B decode at 8 rows
/// slower, 1.256 → 1.324 ms, while it made one row faster, 1.147 → 1.047 ms.
const TENSOR_CORE_TARGET: u64 = 4 * SMS;

/// The plan of an `m × k` input against `virtual_columns` (Σ n, or 2n with SwiGLU): a pure
/// function of the shape (see the module doc), at least one tile and one split for any input.
pub fn linear_plan(m: u64, k: u64, virtual_columns: u64) -> LinearPlan {
    let tensor_cores = m >= LINEAR_MMA_MIN_ROWS;
    let (rows, stage_elements, partials_divisor) = match tensor_cores {
        true => {
            let rows = m.min(LINEAR_MAX_ROWS).next_multiple_of(MMA_TILE_ROWS);
            (rows, STAGE_BF16, 8)
        }
        false => (1, STAGE_FLOATS, 16),
    };
    let column_tiles = virtual_columns.div_ceil(TILE_COLUMNS).max(1);
    let wanted = match tensor_cores {
        true => TENSOR_CORE_TARGET.div_ceil(column_tiles),
        false => CUDA_CORE_RESIDENT / column_tiles,
    };
    let by_k = k / MIN_SPLIT_K;
    let by_partials = k / (partials_divisor * m.max(1));
    let splits = wanted.min(by_k).min(by_partials).clamp(1, MAX_GRID_YZ);
    let split_k = k
        .div_ceil(splits)
        .next_multiple_of(SPLIT_ALIGN)
        .max(SPLIT_ALIGN);
    let stage_k = (stage_elements / rows / SPLIT_ALIGN * SPLIT_ALIGN).min(split_k);
    LinearPlan {
        tensor_cores,
        rows,
        column_tiles,
        // Rounding split_k up may leave the last ranges empty: drop them.
        splits: k.div_ceil(split_k).max(1),
        split_k,
        stage_k,
    }
}

fn refuse(argument: &'static str, reason: String) -> Result<()> {
    Err(Error::Argument {
        op: OP,
        argument,
        reason,
    })
}

impl SkinnyLinear {
    /// Output columns the main kernel computes: the groups' columns one after the other, or
    /// gate's and up's with SwiGLU.
    fn virtual_columns(&self) -> u64 {
        self.groups.iter().map(|g| g.n).sum()
    }

    /// The cut of this shape (meaningful when it [`fits`](Self::fits)).
    pub fn plan(&self) -> LinearPlan {
        linear_plan(self.m, self.k, self.virtual_columns())
    }

    /// Whether the kernels take this layer; [`check`](Self::check) says why not.
    pub fn fits(&self) -> bool {
        self.check().is_ok()
    }

    /// Ok, or the first rule the layer breaks, naming the argument: 1 to 3 groups (exactly 2
    /// of equal `n` with SwiGLU), `1 ≤ m ≤ 32`, `k` a positive multiple of 8, `ldx ≥ k` a
    /// multiple of 8, every `n ≥ 1` with `ldo ≥ n`, x and w 16-byte aligned, bias 2-byte and
    /// outputs 4-byte aligned.
    pub fn check(&self) -> Result<()> {
        let count = self.groups.len();
        if !(1..=LINEAR_MAX_GROUPS).contains(&count) {
            return refuse("groups", format!("{count} groups, expected 1 to 3"));
        }
        if self.swiglu && (count != 2 || self.groups[0].n != self.groups[1].n) {
            let sizes: Vec<u64> = self.groups.iter().map(|g| g.n).collect();
            return refuse(
                "swiglu",
                format!("needs 2 groups (gate, up) of equal n, got n = {sizes:?}"),
            );
        }
        if !(1..=LINEAR_MAX_ROWS).contains(&self.m) {
            let (m, max) = (self.m, LINEAR_MAX_ROWS);
            return refuse("m", format!("{m} rows, expected 1 to {max}"));
        }
        if self.k == 0 || !self.k.is_multiple_of(8) {
            return refuse("k", format!("{} is not a positive multiple of 8", self.k));
        }
        if self.ldx < self.k || !self.ldx.is_multiple_of(8) {
            return refuse(
                "ldx",
                format!(
                    "{} must be a multiple of 8 and at least k = {}",
                    self.ldx, self.k
                ),
            );
        }
        if !all_aligned(&[self.x], 16) {
            return refuse("x", format!("{:?} is not 16-byte aligned", self.x));
        }
        for (index, group) in self.groups.iter().enumerate() {
            if group.n == 0 {
                return refuse("n", format!("group {index} has no columns"));
            }
            // With SwiGLU only group 0's output is written.
            if (!self.swiglu || index == 0) && group.ldo < group.n {
                let (ldo, n) = (group.ldo, group.n);
                return refuse("ldo", format!("group {index}: {ldo} is less than n = {n}"));
            }
            if !all_aligned(&[group.w], 16) {
                let w = group.w;
                return refuse("w", format!("group {index}: {w:?} is not 16-byte aligned"));
            }
            if group.bias.is_some_and(|b| !all_aligned(&[b], 2)) {
                return refuse("bias", format!("group {index}: {:?} is odd", group.bias));
            }
            if !all_aligned(&[group.out], 4) {
                let out = group.out;
                return refuse(
                    "out",
                    format!("group {index}: {out:?} is not 4-byte aligned"),
                );
            }
        }
        let tiles = self.plan().column_tiles;
        grid_dim(OP, "columns", tiles, MAX_GRID_X).map(|_| ())
    }

    /// Bytes of scratch the launches need: the partial sums `[splits][m][virtual columns]` f32
    /// when k is split, else 0. The caller supplies them (4-byte aligned).
    pub fn workspace_bytes(&self) -> u64 {
        match self.plan().splits > 1 {
            true => self.partial_bytes(),
            false => 0,
        }
    }

    /// Bytes of the partial sums `[splits][m][virtual columns]` f32.
    fn partial_bytes(&self) -> u64 {
        self.plan().splits * self.m * self.virtual_columns() * F32_BYTES
    }
}

/// The main kernel of a plan: (module, function).
fn main_function(plan: &LinearPlan) -> (&'static str, &'static str) {
    if !plan.tensor_cores {
        return (MODULE, "linear_r1");
    }
    let function = match plan.rows {
        8 => "linear_mma_r8",
        16 => "linear_mma_r16",
        24 => "linear_mma_r24",
        _ => "linear_mma_r32",
    };
    (MMA_MODULE, function)
}

/// The groups' arguments in the C order: outputs, then (after what `between` adds) weights,
/// biases, bias flags, sizes and leading dims. Missing groups repeat group 0's pointers with
/// `n = 0` and no bias.
fn group_args(spec: &SkinnyLinear, between: &[Arg], weights: bool) -> Vec<Arg> {
    let first = spec.groups[0];
    let padding = LinearGroup {
        bias: None,
        n: 0,
        ldo: 0,
        ..first
    };
    let groups: Vec<LinearGroup> = (0..LINEAR_MAX_GROUPS)
        .map(|i| spec.groups.get(i).copied().unwrap_or(padding))
        .collect();
    let mut args: Vec<Arg> = groups.iter().map(|g| Arg::Ptr(g.out)).collect();
    args.extend_from_slice(between);
    if weights {
        args.extend(groups.iter().map(|g| Arg::Ptr(g.w)));
    }
    // Without a bias the kernel never reads the pointer; pass a valid one all the same.
    args.extend(groups.iter().map(|g| Arg::Ptr(g.bias.unwrap_or(g.w))));
    args.extend(groups.iter().map(|g| Arg::I32(i32::from(g.bias.is_some()))));
    args.extend(groups.iter().map(|g| size_arg(g.n)));
    args.extend(groups.iter().map(|g| size_arg(g.ldo)));
    args
}

/// The launches computing `spec`: the main kernel, and `linear_reduce` when k is split and the
/// splits do not finish inside clusters ([`LinearPlan::cluster_finish`]; `clusters` says
/// whether the device has them). `workspace` must hold
/// [`workspace_bytes`](SkinnyLinear::workspace_bytes) (`None` is allowed when that is 0).
pub fn skinny_linear(
    spec: &SkinnyLinear,
    workspace: Option<Addr>,
    clusters: bool,
) -> Result<Vec<Launch>> {
    let (main, partial) = main_launch(spec, workspace, clusters)?;
    let mut launches = vec![main];
    launches.extend(partial.map(|partial| reduce_launch(spec, partial)));
    Ok(launches)
}

/// `linear_reduce` over the main kernel's `partial` sums: the splits summed, bias, SwiGLU.
fn reduce_launch(spec: &SkinnyLinear, partial: Addr) -> Launch {
    let outputs = if spec.swiglu {
        spec.groups[0].n
    } else {
        spec.virtual_columns()
    };
    let mut args = group_args(spec, &[Arg::Ptr(partial)], false);
    args.extend([
        size_arg(spec.m),
        size_arg(spec.plan().splits),
        Arg::I32(i32::from(spec.swiglu)),
    ]);
    grid_stride(MODULE, "linear_reduce", spec.m * outputs, args)
}

/// The residual add and RMSNorm after a one-group linear (`Linear` with `add_rmsnorm`):
/// `sum = y + residual` in the group's output, `normed = rmsnorm(sum) · weight`; `residual`
/// and `normed` `[m, n]` f32 row-major, `weight [n]` stored as `stored`.
#[derive(Clone, Copy, Debug)]
pub struct NormEpilogue {
    pub residual: Addr,
    pub weight: Addr,
    pub stored: Stored,
    pub normed: Addr,
    pub eps: f32,
}

/// Most threads of the norm epilogue's block (one block per row).
const NORM_THREADS: u64 = 1024;

/// `spec` (one group, no SwiGLU, `ldo = n`) with the norm epilogue: the main kernel, then with
/// split k and at most [`NORM_THREADS`] columns one reduce that also adds the residual and
/// normalizes, else (after `linear_reduce` when k is split and the splits do not finish in
/// clusters) the add + RMSNorm kernel over the output in place.
pub fn skinny_linear_add_rmsnorm(
    spec: &SkinnyLinear,
    workspace: Option<Addr>,
    norm: NormEpilogue,
    clusters: bool,
) -> Result<Vec<Launch>> {
    let group = spec.groups[0];
    if spec.groups.len() != 1 || spec.swiglu || group.ldo != group.n {
        let reason = "takes one group without swiglu, with rows of n".to_string();
        refuse("add_rmsnorm", reason)?;
    }
    if !all_aligned(&[norm.residual, norm.normed], 4) || !all_aligned(&[norm.weight], 2) {
        refuse("add_rmsnorm", format!("{norm:?} is not aligned"))?;
    }
    let (m, n) = (spec.m, group.n);
    // One column per thread, or the reduce and the norm as two launches (measured: 0.5B's 896
    // columns gain, 1.5B's 1536, two columns a thread, lose).
    let (main, partial) = main_launch(spec, workspace, clusters && n > NORM_THREADS)?;
    let mut launches = vec![main];
    let partial = match partial {
        Some(partial) if n > NORM_THREADS => {
            launches.push(reduce_launch(spec, partial));
            None
        }
        partial => partial,
    };
    let epilogue = match partial {
        None => super::norm::add_rmsnorm_f32(
            group.out,
            (norm.normed, Stored::F32),
            group.out,
            norm.residual,
            (norm.weight, norm.stored),
            m,
            n,
            norm.eps,
        )?,
        Some(partial) => {
            let args = vec![
                Arg::Ptr(group.out),
                Arg::Ptr(norm.normed),
                Arg::Ptr(partial),
                Arg::Ptr(group.bias.unwrap_or(group.w)),
                Arg::I32(i32::from(group.bias.is_some())),
                Arg::Ptr(norm.residual),
                Arg::Ptr(norm.weight),
                size_arg(n),
                size_arg(m),
                size_arg(spec.plan().splits),
                Arg::F32(norm.eps),
            ];
            let function = norm.stored.pick(
                "linear_reduce_add_rmsnorm",
                "linear_reduce_add_rmsnorm_bf16",
            );
            let rows = grid_dim(function, "rows", m, MAX_GRID_X)?;
            let threads = n.next_multiple_of(32).min(NORM_THREADS) as u32;
            Kernel::launch(MODULE, function, (rows, 1, 1), (threads, 1, 1), 0, args)
        }
    };
    launches.push(epilogue);
    Ok(launches)
}

/// The main kernel's launch (as clusters of a tile's splits when
/// [`LinearPlan::cluster_finish`] says so), and the partial sums it leaves for a reduce
/// launch: `None` unsplit or finished in clusters.
fn main_launch(
    spec: &SkinnyLinear,
    workspace: Option<Addr>,
    clusters: bool,
) -> Result<(Launch, Option<Addr>)> {
    spec.check()?;
    let plan = spec.plan();
    let split = plan.splits > 1;
    let partial = match (split, workspace) {
        (false, _) => spec.groups[0].out, // never written
        (true, Some(at)) if all_aligned(&[at], 4) => at,
        (true, at) => return Err(workspace_error(at, spec.workspace_bytes())),
    };
    let finish = plan.cluster_finish(clusters);
    let mut tail = vec![Arg::I32(i32::from(spec.swiglu))];
    if !plan.tensor_cores {
        tail.push(Arg::I32(i32::from(finish)));
    }
    let main = main_kernel(spec, &plan, partial, (main_function(&plan), finish), tail)?;
    Ok((Launch::Kernel(main), (split && !finish).then_some(partial)))
}

fn workspace_error(at: Option<Addr>, bytes: u64) -> Error {
    Error::Argument {
        op: OP,
        argument: "workspace",
        reason: format!("{at:?}: {bytes} bytes, 4-byte aligned, are needed"),
    }
}

/// The main kernel `function` of `plan` (in clusters of a tile's splits with `cluster`): the
/// groups' arguments, x's, the plan's, then `tail`.
fn main_kernel(
    spec: &SkinnyLinear,
    plan: &LinearPlan,
    partial: Addr,
    ((module, function), cluster): ((&'static str, &'static str), bool),
    tail: Vec<Arg>,
) -> Result<Kernel> {
    let grid = (
        grid_dim(function, "columns", plan.column_tiles, MAX_GRID_X)?,
        grid_dim(function, "splits", plan.splits, MAX_GRID_YZ)?,
        1,
    );
    let mut args = group_args(spec, &[Arg::Ptr(partial)], true);
    args.extend([
        Arg::Ptr(spec.x),
        Arg::I32(i32::from(spec.x_dtype == GemmDType::F32)),
        size_arg(spec.m),
        size_arg(spec.k),
        size_arg(spec.ldx),
        size_arg(plan.split_k),
        size_arg(plan.stage_k),
    ]);
    args.extend(tail);
    Ok(Kernel {
        module,
        function,
        grid,
        block: (THREADS, 1, 1),
        shared_bytes: plan.shared_bytes() as u32, // at most 34 KB
        cluster: (1, if cluster { grid.1 } else { 1 }, 1),
        args,
    })
}

/// The RoPE and cache epilogue of a q/k/v linear (a `Linear` with `rope_kv`): `q_rot
/// [B,Hq,T,D]` f32, the bf16 caches `[S,Hkv,Smax,D]` written in place at `positions [B]` (and
/// `rows`), the rotation at `rope_positions [B,T]` (`m = B·T` rows), `theta` as the CPU rounds
/// it.
#[derive(Clone, Copy, Debug)]
pub struct RopeEpilogue {
    pub q_rot: Addr,
    pub k_cache: Addr,
    pub v_cache: Addr,
    pub rope_positions: Addr,
    pub positions: Addr,
    pub rows: CacheRows,
    pub seq: u64,
    pub capacity: u64,
    pub head_dim: u64,
    pub theta: f32,
}

impl RopeEpilogue {
    /// The same rotation and cache writes as `RopeKvWrite`'s kernel takes them, from `spec`'s
    /// results `[q, k, v]` written apart (f32, `[m, n_g]` each), no biases (the linear added
    /// them): where the skinny kernels do not finish the epilogue themselves.
    pub fn unfused(
        &self,
        spec: &SkinnyLinear,
        [q, k, v]: [Addr; 3],
    ) -> (super::cache::RopeKvWrite, super::cache::RopeKvDims) {
        let heads = |g: usize| {
            spec.groups
                .get(g)
                .map_or(0, |group| group.n / self.head_dim.max(1))
        };
        let addresses = super::cache::RopeKvWrite {
            q_rot: self.q_rot,
            k_cache: self.k_cache,
            v_cache: self.v_cache,
            q,
            k,
            v,
            rope_positions: self.rope_positions,
            positions: self.positions,
            rows: self.rows,
            biases: None,
            staged: None,
        };
        let dims = super::cache::RopeKvDims {
            batch: spec.m / self.seq.max(1),
            seq: self.seq,
            q_heads: heads(0),
            kv_heads: heads(1),
            capacity: self.capacity,
            head_dim: self.head_dim,
        };
        (addresses, dims)
    }

    /// The kernels' RoPE and cache arguments (`q_rot` to `fault`) for `m` rows.
    fn args(&self, m: u64, fault: Addr) -> Vec<Arg> {
        let [rows, slots] = self.rows.args(m / self.seq.max(1));
        vec![
            Arg::Ptr(self.q_rot),
            Arg::Ptr(self.k_cache),
            Arg::Ptr(self.v_cache),
            Arg::Ptr(self.rope_positions),
            Arg::Ptr(self.positions),
            rows,
            slots,
            size_arg(self.seq),
            size_arg(self.capacity),
            size_arg(self.head_dim),
            Arg::F32(self.theta),
            Arg::Ptr(fault),
        ]
    }
}

impl SkinnyLinear {
    /// Bytes of scratch [`skinny_linear_rope`] needs: the partial sums, one split's too.
    pub fn rope_workspace_bytes(&self) -> u64 {
        self.partial_bytes()
    }
}

/// `spec` (q, k and v: three groups without SwiGLU, each `n` a multiple of the head size; the
/// groups' `out` and `ldo` are not used) with the RoPE and cache epilogue: the main kernel,
/// finished in its clusters (`linear_r1_rope`: one row, k split into 2 to
/// [`MAX_CLUSTER_BLOCKS`] ranges, a head size dividing the 128-column tile, a device with
/// clusters) or by `linear_reduce_rope`. One split's sums are y itself, written into the
/// workspace without bias. `workspace` holds
/// [`rope_workspace_bytes`](SkinnyLinear::rope_workspace_bytes).
pub fn skinny_linear_rope(
    spec: &SkinnyLinear,
    workspace: Addr,
    rope: RopeEpilogue,
    clusters: bool,
    fault: Addr,
) -> Result<Vec<Launch>> {
    spec.check()?;
    let d = rope.head_dim;
    if spec.groups.len() != 3 || spec.swiglu {
        refuse(
            "rope",
            "takes three groups (q, k, v) without swiglu".to_string(),
        )?;
    }
    if d == 0 || !d.is_multiple_of(2) || spec.groups.iter().any(|g| !g.n.is_multiple_of(d)) {
        let widths: Vec<u64> = spec.groups.iter().map(|g| g.n).collect();
        refuse(
            "rope",
            format!("head size {d} must be even and divide n = {widths:?}"),
        )?;
    }
    if rope.seq == 0 || !spec.m.is_multiple_of(rope.seq) {
        refuse(
            "rope",
            format!("{} rows are not batches of {} tokens", spec.m, rope.seq),
        )?;
    }
    if !all_aligned(&[workspace], 4) {
        return Err(workspace_error(
            Some(workspace),
            spec.rope_workspace_bytes(),
        ));
    }
    let plan = spec.plan();
    let columns = spec.virtual_columns();
    let mut main_spec = spec.clone();
    let mut offset = 0;
    for group in &mut main_spec.groups {
        // One split writes y into the workspace as the partial sums, unbiased; more write
        // partials there (and never y).
        (group.out, group.ldo, group.bias) = match plan.splits {
            1 => (workspace.add(offset * F32_BYTES), columns, None),
            _ => (workspace, group.n, group.bias),
        };
        offset += group.n;
    }
    let rope_args = rope.args(spec.m, fault);
    if plan.cluster_finish(clusters) && TILE_COLUMNS.is_multiple_of(d) {
        let function = (MODULE, "linear_r1_rope");
        let main = main_kernel(&main_spec, &plan, workspace, (function, true), rope_args)?;
        return Ok(vec![Launch::Kernel(main)]);
    }
    let (main, _) = main_launch(&main_spec, Some(workspace), false)?;
    let mut args = vec![Arg::Ptr(workspace)];
    args.extend(group_args(spec, &[], false).into_iter().skip(3).take(9));
    args.extend([size_arg(spec.m), size_arg(plan.splits)]);
    args.extend(rope_args);
    let reduce = grid_stride(MODULE, "linear_reduce_rope", spec.m * columns, args);
    Ok(vec![main, reduce])
}

#[cfg(test)]
#[path = "linear_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "linear_emulation.rs"]
mod emulation;

#[cfg(test)]
#[path = "linear_mma_tests.rs"]
mod mma_tests;
