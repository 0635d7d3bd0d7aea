//! Matrix products and linear layers.
//!
//! VJPs, with `A = op(a)`, `B = op(b)`, `out = A·B` and `G` the output gradient:
//! `dA = G·Bᵀ`, `dB = Aᵀ·G`. Undoing the transpose flags gives
//! - `grad_a = G·op(b)ᵀ` (no flag on a) or `op(b)·Gᵀ` (a transposed),
//! - `grad_b = op(a)ᵀ·G` (no flag on b) or `Gᵀ·op(a)` (b transposed),
//!
//! each again one matmul with flags, never a materialized transpose.

use kiln_ir::DType;
use kiln_kernels::matmul::{self as k, Transpose};
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::{Error, Result};
use crate::launch::{empty, launch};
use crate::ops::elementwise::cast_tensor;

/// `op(a) · op(b)` on plain tensors, with the workspace the fast path needs.
fn product(a: &Tensor, b: &Tensor, transpose: Transpose) -> Result<Tensor> {
    let (a_dims, b_dims) = (a.dims(), b.dims());
    if a_dims.len() < 2 || a_dims.len() != b_dims.len() {
        return Err(Error::Operand {
            op: "matmul",
            reason: format!(
                "operands must have the same rank >= 2, got {} and {}",
                a.shape(),
                b.shape()
            ),
        });
    }
    let rank = a_dims.len();
    let m = if transpose.a {
        a_dims[rank - 1]
    } else {
        a_dims[rank - 2]
    };
    let n = if transpose.b {
        b_dims[rank - 2]
    } else {
        b_dims[rank - 1]
    };
    let mut dims = a_dims[..rank - 2].to_vec();
    dims.extend([m, n]);
    let out_dtype = if a.dtype() == DType::BF16 {
        DType::F32
    } else {
        a.dtype()
    };
    let out = empty(dims, out_dtype);
    let mut workspace =
        vec![0f32; k::matmul_workspace_len(a.dtype(), a.shape(), b.shape(), transpose)];
    launch(&[a, b], &[&out], |i, o| {
        k::matmul(&i[0], &i[1], &mut o[0], transpose, &mut workspace)
    })?;
    Ok(out)
}

/// `op(a) · op(b)` for operands of equal rank >= 2 (batched over leading dims). f32 and f64
/// operands give their own dtype; bf16 operands give f32 (f32 accumulation), and their
/// gradients are rounded back to bf16.
pub fn matmul(a: &Var, b: &Var, transpose: Transpose) -> Result<Var> {
    let out = product(a.value(), b.value(), transpose)?;
    let (a_value, b_value) = (a.value().clone(), b.value().clone());
    Ok(Var::record_one("matmul", &[a, b], out, move |g| {
        let input_dtype = a_value.dtype();
        let g = if g.dtype() == input_dtype {
            g.clone()
        } else {
            cast_tensor(g, input_dtype)?
        };
        let grad_a = if transpose.a {
            product(
                &b_value,
                &g,
                Transpose {
                    a: transpose.b,
                    b: true,
                },
            )?
        } else {
            product(
                &g,
                &b_value,
                Transpose {
                    a: false,
                    b: !transpose.b,
                },
            )?
        };
        let grad_b = if transpose.b {
            product(
                &g,
                &a_value,
                Transpose {
                    a: true,
                    b: transpose.a,
                },
            )?
        } else {
            product(
                &a_value,
                &g,
                Transpose {
                    a: !transpose.a,
                    b: false,
                },
            )?
        };
        let back = |t: Tensor| -> Result<Tensor> {
            if t.dtype() == input_dtype {
                Ok(t)
            } else {
                cast_tensor(&t, input_dtype)
            }
        };
        Ok(vec![Some(back(grad_a)?), Some(back(grad_b)?)])
    }))
}

/// A linear layer as Hugging Face stores it: `x [..., in] · weightᵀ [out, in] (+ bias [out])`
/// → `[..., out]`. `x` must be contiguous (it is viewed as a matrix). With a `gemm_dtype`
/// (bf16: mixed precision), both GEMM inputs are rounded to it and the product accumulates in
/// f32.
pub fn linear(x: &Var, weight: &Var, bias: Option<&Var>, gemm_dtype: Option<DType>) -> Result<Var> {
    let dims = x.dims();
    let (Some(&features), Some(&outputs)) = (dims.last(), weight.dims().first()) else {
        return Err(Error::Operand {
            op: "linear",
            reason: format!(
                "input {} and weight {} must have rank >= 1",
                x.shape(),
                weight.shape()
            ),
        });
    };
    let rows = x.shape().rows();
    let flat = super::reshape(x, [rows, features])?;
    let (flat, weight) = match gemm_dtype {
        Some(dtype) => (
            super::as_dtype(&flat, dtype)?,
            super::as_dtype(weight, dtype)?,
        ),
        None => (flat, weight.clone()),
    };
    let mut out = matmul(&flat, &weight, Transpose { a: false, b: true })?;
    if let Some(bias) = bias {
        out = super::add(&out, &super::as_dtype(bias, out.dtype())?)?;
    }
    let mut out_dims = dims[..dims.len() - 1].to_vec();
    out_dims.push(outputs);
    super::reshape(&out, out_dims)
}
