//! Launch descriptors: what a backend must do, with symbolic addresses.

use kiln_ir::DType;

/// A symbolic device address: byte `offset` into slot `slot`. Slots are the backend's
/// allocations (the arena, each parameter, each state, each I/O slot); the program that
/// holds the launches says which is which. Addresses are resolved once, when memory is bound,
/// so a captured graph sees fixed addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr {
    pub slot: u32,
    pub offset: u64,
}

impl Addr {
    /// The address `bytes` further on in the same slot.
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, bytes: u64) -> Addr {
        Addr {
            slot: self.slot,
            offset: self.offset + bytes,
        }
    }
}

/// One kernel argument, as the kernel's C signature takes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A pointer (`T*`).
    Ptr(Addr),
    /// A null pointer (`T*`): an optional operand that is absent.
    Null,
    /// `long long`.
    I64(i64),
    /// `int`.
    I32(i32),
    /// `float`.
    F32(f32),
    /// `double`.
    F64(f64),
}

/// One kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    /// Module (a name in [`SOURCES`](super::SOURCES)) and `extern "C"` function name.
    pub module: &'static str,
    pub function: &'static str,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory, bytes.
    pub shared_bytes: u32,
    /// Blocks per thread block cluster along each grid dim (each divides the grid's); (1, 1, 1)
    /// is a plain launch. A backend without clusters must refuse any other shape: the kernels
    /// launched as clusters synchronize within them.
    pub cluster: (u32, u32, u32),
    pub args: Vec<Arg>,
}

/// The most blocks of a cluster that every device with clusters runs (CUDA's portable size).
pub const MAX_PORTABLE_CLUSTER_BLOCKS: u64 = 8;
/// The most blocks of a cluster kiln launches: Hopper's limit, where the function allows
/// non-portable sizes (the CUDA executable sets that for a launch past the portable size).
pub const MAX_CLUSTER_BLOCKS: u64 = 16;

/// Element types of a GEMM's A and B operands (C is always f32, accumulation is f32).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmDType {
    F32,
    BF16,
}

impl GemmDType {
    pub fn of(dtype: DType) -> Option<GemmDType> {
        match dtype {
            DType::F32 => Some(GemmDType::F32),
            DType::BF16 => Some(GemmDType::BF16),
            _ => None,
        }
    }

    pub fn size_bytes(self) -> u64 {
        match self {
            GemmDType::F32 => 4,
            GemmDType::BF16 => 2,
        }
    }
}

/// The dtype of a kernel's stored operand (a weight, bias or cache) where the kernel computes
/// in f32: f32, or bf16 widened where read and rounded where written (`kiln_ir::stores`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    F32,
    BF16,
}

impl Stored {
    pub fn of(dtype: DType) -> Option<Stored> {
        match dtype {
            DType::F32 => Some(Stored::F32),
            DType::BF16 => Some(Stored::BF16),
            _ => None,
        }
    }

    /// The dtype this storage is.
    pub fn dtype(self) -> DType {
        match self {
            Stored::F32 => DType::F32,
            Stored::BF16 => DType::BF16,
        }
    }

    /// The bytes of four elements, a `_vec4` kernel's access.
    pub fn vector_bytes(self) -> u64 {
        match self {
            Stored::F32 => 16,
            Stored::BF16 => 8,
        }
    }

    /// 0 for f32, 1 for bf16: a digit of an index into a table of entry points.
    pub fn bit(self) -> usize {
        match self {
            Stored::F32 => 0,
            Stored::BF16 => 1,
        }
    }

    /// The kernel of this stored dtype: `f32` or its bf16 instantiation `bf16`.
    pub fn pick(self, f32: &'static str, bf16: &'static str) -> &'static str {
        match self {
            Stored::F32 => f32,
            Stored::BF16 => bf16,
        }
    }
}

/// Where a kernel writes a result it can give in f32, rounded to bf16, or both (mixed
/// precision's `Rounded` and `AlsoRounded` ops): at least one is given; an absent one is a
/// null pointer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Forms {
    pub f32: Option<Addr>,
    pub rounded: Option<Addr>,
}

impl Forms {
    /// The f32 result alone.
    pub fn f32(at: Addr) -> Forms {
        Forms {
            f32: Some(at),
            rounded: None,
        }
    }

    /// The two pointer arguments, f32 first.
    pub fn args(&self) -> [Arg; 2] {
        [self.f32, self.rounded].map(|at| at.map_or(Arg::Null, Arg::Ptr))
    }
}

/// A (strided-batched) matrix product in row-major terms, for the vendor GEMM (or, on a backend
/// without one, the tiled kernel [`gemm::tiled`](super::gemm::tiled) launches):
/// for each batch `b < batch`, `C_b [m,n] = op(A_b) · op(B_b)` where `op(A_b)` is `[m,k]` and
/// `op(B_b)` is `[k,n]`. `A_b` is stored row-major with leading dimension `lda` (elements
/// between rows) as `[m,k]`, or as `[k,m]` when `transpose_a`; likewise `B_b` as `[k,n]` or
/// `[n,k]` when `transpose_b`; `C_b` row-major `[m,n]` with `ldc`. Batch strides are in
/// elements. A and B are of `dtype`; C is of `out`, overwritten (beta = 0) or added to when
/// `accumulate` (beta = 1: `C = op(A)·op(B) + C`): f32, or bf16 (bf16 A and B: the f32 sum
/// rounded to nearest even as it is written; added to a bf16 C, the sum may be rounded to bf16
/// before C is added, as cuBLASLt's algorithms may do, while the tiled kernel adds C widened
/// and rounds once). Accumulation is f32 (no TF32).
#[derive(Clone, Debug, PartialEq)]
pub struct Gemm {
    pub dtype: GemmDType,
    pub out: GemmDType,
    pub a: Addr,
    pub b: Addr,
    pub c: Addr,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub transpose_a: bool,
    pub transpose_b: bool,
    pub lda: u64,
    pub ldb: u64,
    pub ldc: u64,
    pub stride_a: u64,
    pub stride_b: u64,
    pub stride_c: u64,
    pub accumulate: bool,
}

impl Gemm {
    /// The bytes A, B and C reach from their addresses: through the last batch's last row.
    pub fn spans(&self) -> [u64; 3] {
        let span = |rows: u64, ld: u64, cols: u64, stride: u64, elem: u64| {
            if rows == 0 || self.batch == 0 {
                return 0;
            }
            ((self.batch - 1) * stride + (rows - 1) * ld + cols) * elem
        };
        let (size, out) = (self.dtype.size_bytes(), self.out.size_bytes());
        let (a_rows, a_cols) = match self.transpose_a {
            true => (self.k, self.m),
            false => (self.m, self.k),
        };
        let (b_rows, b_cols) = match self.transpose_b {
            true => (self.n, self.k),
            false => (self.k, self.n),
        };
        [
            span(a_rows, self.lda, a_cols, self.stride_a, size),
            span(b_rows, self.ldb, b_cols, self.stride_b, size),
            span(self.m, self.ldc, self.n, self.stride_c, out),
        ]
    }
}

/// One unit of device work.
#[derive(Clone, Debug, PartialEq)]
pub enum Launch {
    Kernel(Kernel),
    Gemm(Gemm),
    /// Copy `bytes` bytes from `src` to `dst` (device to device; the ranges do not overlap).
    Copy {
        dst: Addr,
        src: Addr,
        bytes: u64,
    },
    /// Each `(src, dst, count)` f32 buffer summed over every rank of the executable's
    /// communicator into `dst` (`ncclAllReduce`, `ncclSum`; `dst == src` sums in place), all
    /// in one NCCL group.
    AllReduce {
        buffers: Vec<(Addr, Addr, u64)>,
    },
}

impl Launch {
    /// Every address the launch passes, in argument order.
    pub fn addresses(&self) -> Vec<Addr> {
        match self {
            Launch::Kernel(k) => k
                .args
                .iter()
                .filter_map(|a| match a {
                    Arg::Ptr(addr) => Some(*addr),
                    _ => None,
                })
                .collect(),
            Launch::Gemm(g) => vec![g.a, g.b, g.c],
            Launch::Copy { dst, src, .. } => vec![*dst, *src],
            Launch::AllReduce { buffers } => (buffers.iter())
                .flat_map(|&(src, dst, _)| [src, dst])
                .collect(),
        }
    }
}

/// Alignment, in bytes, of every slot's base address: backends allocate slots at least this
/// aligned (cudaMalloc gives 256), so builders may choose vector (16-byte) access from an
/// [`Addr`]'s offset alone.
pub const SLOT_ALIGN: u64 = 256;

/// Threads per block of the kernels that loop over items or rows.
pub const BLOCK_THREADS: u32 = 256;

/// Streaming multiprocessors of an H200 (and an H100 SXM): what the split rules fill.
pub const SMS: u64 = 132;

/// Blocks of a grid-stride launch over `items` (at least 1): one item per thread up to a cap,
/// past which threads loop. Depends on the size alone, never on data.
pub fn grid_stride_blocks(items: u64) -> u32 {
    const MAX_BLOCKS: u64 = 65_535;
    items
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, MAX_BLOCKS) as u32
}

/// Whether every address is a multiple of `bytes` (given [`SLOT_ALIGN`]-aligned slots).
pub fn all_aligned(addresses: &[Addr], bytes: u64) -> bool {
    addresses.iter().all(|a| a.offset % bytes == 0)
}

impl Kernel {
    /// A launch of `module::function` with `args` in the order of its C signature, without
    /// clusters.
    pub fn launch(
        module: &'static str,
        function: &'static str,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared_bytes: u32,
        args: Vec<Arg>,
    ) -> Launch {
        Launch::Kernel(Kernel {
            module,
            function,
            grid,
            block,
            shared_bytes,
            cluster: (1, 1, 1),
            args,
        })
    }
}

/// A launch of one block of [`BLOCK_THREADS`] threads per each of `count` items (rows, tokens;
/// `what` names them in errors), no dynamic shared memory.
pub fn block_per(
    module: &'static str,
    function: &'static str,
    what: &'static str,
    count: u64,
    args: Vec<Arg>,
) -> crate::Result<Launch> {
    let grid = (grid_dim(function, what, count, MAX_GRID_X)?, 1, 1);
    Ok(Kernel::launch(
        module,
        function,
        grid,
        (BLOCK_THREADS, 1, 1),
        0,
        args,
    ))
}

/// A grid-stride launch over `items` ([`grid_stride_blocks`] blocks of [`BLOCK_THREADS`]).
pub fn grid_stride(
    module: &'static str,
    function: &'static str,
    items: u64,
    args: Vec<Arg>,
) -> Launch {
    let grid = (grid_stride_blocks(items), 1, 1);
    Kernel::launch(module, function, grid, (BLOCK_THREADS, 1, 1), 0, args)
}

/// `value` as a grid dimension of at most `max`, or an error naming the kernel and the size.
pub fn grid_dim(
    function: &'static str,
    what: &'static str,
    value: u64,
    max: u64,
) -> crate::Result<u32> {
    if (1..=max).contains(&value) {
        Ok(value as u32)
    } else {
        Err(crate::Error::Argument {
            op: function,
            argument: what,
            reason: format!("{value} does not fit a grid dimension of 1..={max}"),
        })
    }
}

/// The largest grid x dimension.
pub const MAX_GRID_X: u64 = (1 << 31) - 1;
/// The largest grid y and z dimensions.
pub const MAX_GRID_YZ: u64 = 65_535;

/// A signed 64-bit kernel argument from a size.
pub fn size_arg(value: u64) -> Arg {
    Arg::I64(value as i64)
}
