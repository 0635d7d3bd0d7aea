//! Builder of `gemm.cu`: the portable tiled GEMM, which computes what a [`Gemm`] descriptor
//! says on a backend without a vendor GEMM (the HIP backend has no cuBLASLt).
//!
//! Every element of C is one f32 fused multiply-add chain over `p = 0..k` in order, whatever
//! the tiling (`gemm.cu` says why), so the result depends on the operands alone.

use super::launch::{grid_dim, size_arg, MAX_GRID_X, MAX_GRID_YZ};
use super::{Addr, Arg, Gemm, GemmDType, Kernel, Launch};
use crate::{Error, Result};

const MODULE: &str = "gemm";
/// The op errors name before an instance is chosen.
const OP: &str = "gemm";
/// Rows and columns of C per block (`KILN_GEMM_TILE`).
const TILE: u64 = 64;
/// Threads per block (`KILN_GEMM_THREADS`).
const THREADS: u32 = 256;

/// The launch of `gemm.cu` computing `gemm`: one block of 256 threads per 64 x 64 tile of C
/// (grid x: column tiles, y: row tiles, z: batch), no dynamic shared memory.
///
/// Refused, with an [`Error::Argument`] naming the field: an empty size (m, n, k or batch
/// 0); a combination `Gemm`'s doc does not define (a bf16 C from f32 A and B, or added to); a
/// size, leading dimension or stride past `i64::MAX`; a leading dimension shorter than its
/// stored rows; an operand that spans more elements than a signed 64-bit index reaches, or
/// whose address is not aligned to its element; more tiles than a grid dimension holds (m
/// past 64 · 65,535 rows, or batch past 65,535).
pub fn tiled(gemm: &Gemm) -> Result<Launch> {
    let function = instance(gemm)?;
    check_sizes(function, gemm)?;
    let (a_rows, a_cols) = swap_if(gemm.transpose_a, (gemm.m, gemm.k));
    let (b_rows, b_cols) = swap_if(gemm.transpose_b, (gemm.k, gemm.n));
    let operands = [
        Operand {
            name: ("a", "lda"),
            at: gemm.a,
            dtype: gemm.dtype,
            stored: [a_rows, a_cols, gemm.lda, gemm.stride_a],
        },
        Operand {
            name: ("b", "ldb"),
            at: gemm.b,
            dtype: gemm.dtype,
            stored: [b_rows, b_cols, gemm.ldb, gemm.stride_b],
        },
        Operand {
            name: ("c", "ldc"),
            at: gemm.c,
            dtype: gemm.out,
            stored: [gemm.m, gemm.n, gemm.ldc, gemm.stride_c],
        },
    ];
    for operand in &operands {
        operand.check(function, gemm.batch)?;
    }
    let grid = (
        grid_dim(
            function,
            "n / 64 (column tiles)",
            gemm.n.div_ceil(TILE),
            MAX_GRID_X,
        )?,
        grid_dim(
            function,
            "m / 64 (row tiles)",
            gemm.m.div_ceil(TILE),
            MAX_GRID_YZ,
        )?,
        grid_dim(function, "batch", gemm.batch, MAX_GRID_YZ)?,
    );
    Ok(Kernel::launch(
        MODULE,
        function,
        grid,
        (THREADS, 1, 1),
        0,
        arguments(gemm),
    ))
}

/// Every size is at least 1, and every size, leading dimension and stride is an i64.
fn check_sizes(function: &'static str, gemm: &Gemm) -> Result<()> {
    let sizes = [
        ("m", gemm.m),
        ("n", gemm.n),
        ("k", gemm.k),
        ("batch", gemm.batch),
    ];
    // Edges are masked, but an empty product has no tile to launch.
    if let Some((argument, _)) = sizes.iter().find(|(_, size)| *size == 0) {
        let reason = "0: every size of the tiled GEMM is at least 1".to_string();
        return Err(argument_error(function, argument, reason));
    }
    let layout = [
        ("lda", gemm.lda),
        ("ldb", gemm.ldb),
        ("ldc", gemm.ldc),
        ("stride_a", gemm.stride_a),
        ("stride_b", gemm.stride_b),
        ("stride_c", gemm.stride_c),
    ];
    let passed = sizes.iter().chain(&layout);
    if let Some((argument, value)) = passed.into_iter().find(|(_, v)| *v > i64::MAX as u64) {
        let reason = format!("{value} does not fit the kernel's signed 64-bit argument");
        return Err(argument_error(function, argument, reason));
    }
    Ok(())
}

/// One operand as stored: its names (operand, leading dimension), address, element type, and
/// [rows, columns, leading dimension, batch stride] in elements.
struct Operand {
    name: (&'static str, &'static str),
    at: Addr,
    dtype: GemmDType,
    stored: [u64; 4],
}

impl Operand {
    /// Rows do not overlap, every index the kernel forms is an i64, and the address is
    /// aligned to the element. Sizes are at least 1 (`check_sizes`).
    fn check(&self, function: &'static str, batch: u64) -> Result<()> {
        let ((operand, ld_name), [rows, cols, ld, stride]) = (self.name, self.stored);
        if ld < cols {
            let reason =
                format!("{ld} is shorter than a stored row of `{operand}` ({rows} x {cols})");
            return Err(argument_error(function, ld_name, reason));
        }
        // The largest index, (batch - 1) * stride + (rows - 1) * ld + cols - 1; the kernel
        // forms no other index past it.
        let last = (batch - 1)
            .checked_mul(stride)
            .and_then(|x| x.checked_add((rows - 1).checked_mul(ld)?))
            .and_then(|x| x.checked_add(cols - 1))
            .filter(|&last| last <= i64::MAX as u64);
        if last.is_none() {
            let reason = format!(
                "{rows} x {cols} with leading dimension {ld}, {batch} batches {stride} apart, \
                 spans more elements than a signed 64-bit index reaches"
            );
            return Err(argument_error(function, operand, reason));
        }
        let bytes = self.dtype.size_bytes();
        if !self.at.offset.is_multiple_of(bytes) {
            let reason = format!(
                "byte offset {} is not a multiple of its {bytes}-byte elements",
                self.at.offset
            );
            return Err(argument_error(function, operand, reason));
        }
        Ok(())
    }
}

/// The kernel of `gemm`'s dtypes, or the error for a combination `Gemm` does not define.
fn instance(gemm: &Gemm) -> Result<&'static str> {
    match (gemm.dtype, gemm.out, gemm.accumulate) {
        (GemmDType::F32, GemmDType::F32, _) => Ok("gemm_f32"),
        (GemmDType::BF16, GemmDType::F32, _) => Ok("gemm_bf16"),
        (GemmDType::BF16, GemmDType::BF16, _) => Ok("gemm_bf16_to_bf16"),
        (GemmDType::F32, GemmDType::BF16, _) => Err(argument_error(
            OP,
            "out",
            "a bf16 C takes bf16 A and B, not f32".into(),
        )),
    }
}

/// The arguments of `gemm.cu`'s instances, in their C signature's order (each size, leading
/// dimension and stride checked to fit i64).
fn arguments(gemm: &Gemm) -> Vec<Arg> {
    let flag = |value: bool| Arg::I32(i32::from(value));
    vec![
        Arg::Ptr(gemm.c),
        Arg::Ptr(gemm.a),
        Arg::Ptr(gemm.b),
        size_arg(gemm.m),
        size_arg(gemm.n),
        size_arg(gemm.k),
        size_arg(gemm.lda),
        size_arg(gemm.ldb),
        size_arg(gemm.ldc),
        size_arg(gemm.stride_a),
        size_arg(gemm.stride_b),
        size_arg(gemm.stride_c),
        flag(gemm.transpose_a),
        flag(gemm.transpose_b),
        flag(gemm.accumulate),
    ]
}

/// `(x, y)`, or `(y, x)` when `swap`: an operand's stored (rows, columns).
fn swap_if(swap: bool, (x, y): (u64, u64)) -> (u64, u64) {
    if swap {
        (y, x)
    } else {
        (x, y)
    }
}

fn argument_error(op: &'static str, argument: &'static str, reason: String) -> Error {
    Error::Argument {
        op,
        argument,
        reason,
    }
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "gemm_emulation.rs"]
mod emulation;

#[cfg(test)]
#[path = "gemm_emulated_tests.rs"]
mod emulated_tests;
