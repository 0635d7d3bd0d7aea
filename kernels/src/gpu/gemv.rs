//! Builder of `gemv.cu`: `c [m,n] = a [m,k] · w [n,k]ᵀ` for `m ≤ 8` rows (decode's linear
//! layers), one warp per output column. A candidate behind `LowerOptions::gemv`, not yet the
//! default (DESIGN.md's evidence rule).

use super::launch::{all_aligned, grid_dim, size_arg, MAX_GRID_X};
use super::{Addr, Arg, GemmDType, Kernel, Launch, BLOCK_THREADS};
use crate::Result;

/// The most rows of `a` the kernel takes (the C kernel's `KILN_GEMV_MAX_ROWS`).
pub const GEMV_MAX_ROWS: u64 = 8;

/// One skinny product: row-major `a [m,k]` (`lda`), `w [n,k]` (`ldw`), `c [m,n]` f32 (`ldc`).
#[derive(Clone, Copy, Debug)]
pub struct Gemv {
    pub dtype: GemmDType,
    pub c: Addr,
    pub a: Addr,
    pub w: Addr,
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub lda: u64,
    pub ldw: u64,
    pub ldc: u64,
}

impl Gemv {
    /// Elements per 16-byte load.
    fn vector(&self) -> u64 {
        16 / self.dtype.size_bytes()
    }

    /// Whether the kernel takes this product: `1 ≤ m ≤ 8`, `n ≥ 1`, and `k`, `lda`, `ldw` whole
    /// 16-byte vectors with 16-byte aligned `a` and `w`.
    pub fn fits(&self) -> bool {
        let vector = self.vector();
        (1..=GEMV_MAX_ROWS).contains(&self.m)
            && self.n >= 1
            && [self.k, self.lda, self.ldw].iter().all(|x| x % vector == 0)
            && all_aligned(&[self.a, self.w], 16)
    }
}

/// The launch of `gemv` (which must [`fit`](Gemv::fits)).
pub fn gemv(gemv: Gemv) -> Result<Launch> {
    let function = match gemv.dtype {
        GemmDType::F32 => "gemv_f32",
        GemmDType::BF16 => "gemv_bf16",
    };
    if !gemv.fits() {
        return Err(crate::Error::Argument {
            op: function,
            argument: "gemv",
            reason: format!("{gemv:?} does not fit the kernel (m <= 8, 16-byte vectors)"),
        });
    }
    let columns_per_block = u64::from(BLOCK_THREADS / 32);
    let blocks = gemv.n.div_ceil(columns_per_block);
    let grid = (grid_dim(function, "n", blocks, MAX_GRID_X)?, 1, 1);
    let args = vec![
        Arg::Ptr(gemv.c),
        Arg::Ptr(gemv.a),
        Arg::Ptr(gemv.w),
        size_arg(gemv.m),
        size_arg(gemv.n),
        size_arg(gemv.k),
        size_arg(gemv.lda),
        size_arg(gemv.ldw),
        size_arg(gemv.ldc),
    ];
    Ok(Kernel::launch(
        "gemv",
        function,
        grid,
        (BLOCK_THREADS, 1, 1),
        0,
        args,
    ))
}
