//! MatMul on the vendor GEMM: the IR's batched
//! `op(a)·op(b)` as one strided-batched row-major GEMM description.
//!
//! Operands may be strided: a matrix whose columns are dense is row-major with `ld` = its row
//! stride; one whose rows are dense is the transpose of a row-major matrix, so its transpose
//! flag flips and `ld` = its column stride. Leading (batch) dims must merge into one dim with a
//! uniform stride.

use kiln_ir::DType;
use kiln_kernels::gpu::{self, Gemm, GemmDType, Launch};

use super::{collapse, size, Lowering, F32};
use crate::error::Result;
use crate::lower::DeviceTensor;

/// One operand as the GEMM stores it.
struct Stored {
    /// Whether op(·) transposes the stored row-major matrix.
    transpose: bool,
    ld: u64,
    /// Batch count and stride (elements).
    batch: u64,
    batch_stride: u64,
}

/// How `tensor` (logical `[..., rows, cols]`, op transposing it when `transpose`) is stored.
fn stored(at: &Lowering<'_>, tensor: &DeviceTensor, name: &str, transpose: bool) -> Result<Stored> {
    let dims = tensor.dims();
    let strides = tensor.strides();
    let rank = dims.len();
    let (rows, cols) = (dims[rank - 2], dims[rank - 1]);
    let (row_stride, col_stride) = (strides[rank - 2], strides[rank - 1]);
    let not_gemm = || {
        at.unsupported(format!(
            "`{name}` (shape {}, strides {strides:?}) is neither row- nor column-major in its \
             last two dims, or its batch dims do not merge; make it contiguous first",
            tensor.shape()
        ))
    };
    let (transpose, ld) = if (col_stride == 1 || cols == 1) && (rows == 1 || row_stride >= cols) {
        (transpose, if rows == 1 { cols } else { row_stride })
    } else if (row_stride == 1 || rows == 1) && (cols == 1 || col_stride >= rows) {
        (!transpose, if cols == 1 { rows } else { col_stride })
    } else {
        return Err(not_gemm());
    };
    let (batch_dims, batch_strides) = collapse(&dims[..rank - 2], &strides[..rank - 2]);
    let (batch, batch_stride) = match (batch_dims.as_slice(), batch_strides.as_slice()) {
        ([], []) => (1, 0),
        ([count], [stride]) => (size(*count), size(*stride)),
        _ => return Err(not_gemm()),
    };
    Ok(Stored {
        transpose,
        ld: size(ld.max(1)),
        batch,
        batch_stride,
    })
}

/// `MatMul`: `out` f32, or bf16 when rounded (of bf16 operands).
pub(super) fn lower_matmul(
    at: &Lowering<'_>,
    [transpose_a, transpose_b]: [bool; 2],
) -> Result<Vec<Launch>> {
    let a = at.port(at.i, "operand", 0, "a")?;
    let b = at.port(at.i, "operand", 1, "b")?;
    let inputs: &[DType] = match at.rounded {
        false => &[DType::F32, DType::BF16],
        true => &[DType::BF16],
    };
    at.expect_dtype(a, "a", inputs)?;
    at.expect_dtype(b, "b", &[a.dtype])?;
    let (c, _) = at.rounded_result(0, "out")?;
    let out = c.dtype;
    let rank = a.dims().len();
    if rank < 2 || b.dims().len() != rank || c.dims().len() != rank {
        return Err(at.unsupported(format!(
            "operands {} and {} are not matrices of one rank",
            a.shape(),
            b.shape()
        )));
    }
    let k = size(if transpose_a {
        a.dims()[rank - 2]
    } else {
        a.dims()[rank - 1]
    });
    let (m, n) = (size(c.dims()[rank - 2]), size(c.dims()[rank - 1]));
    if c.numel() == 0 {
        return Ok(vec![]);
    }
    if k == 0 {
        // An empty sum: C is zero.
        return match out {
            F32 => Ok(vec![gpu::embedding::zero_f32(c.addr(), size(c.numel()))]),
            _ => Ok(vec![gpu::embedding::zero_bf16(c.addr(), size(c.numel()))]),
        };
    }
    let stored_a = stored(at, a, "a", transpose_a)?;
    let stored_b = stored(at, b, "b", transpose_b)?;
    let batch = size(c.numel()) / (m * n);
    let dtype = GemmDType::of(a.dtype).expect("dtype checked above");
    let gemm = Gemm {
        dtype,
        out: GemmDType::of(out).expect("dtype checked above"),
        a: a.addr(),
        b: b.addr(),
        c: c.addr(),
        m,
        n,
        k,
        batch,
        transpose_a: stored_a.transpose,
        transpose_b: stored_b.transpose,
        lda: stored_a.ld,
        ldb: stored_b.ld,
        ldc: n,
        stride_a: if stored_a.batch > 1 {
            stored_a.batch_stride
        } else {
            0
        },
        stride_b: if stored_b.batch > 1 {
            stored_b.batch_stride
        } else {
            0
        },
        stride_c: m * n,
        accumulate: false,
    };
    Ok(vec![Launch::Gemm(gemm)])
}
