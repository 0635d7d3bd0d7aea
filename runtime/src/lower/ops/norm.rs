//! RMSNorm (plain, fused with the residual add, backwards) and RoPE: row-shaped ops over the
//! hidden or head dim.

use kiln_ir::Op;
use kiln_kernels::gpu::norm::{self, RmsNormBackwardRows};
use kiln_kernels::gpu::rope::{self, RopeDims};
use kiln_kernels::gpu::{Launch, Stored};

use super::{size, Lowering, F32, I64};
use crate::error::Result;

/// `[rows, hidden]` of a `[..., H]` tensor.
fn rows_hidden(dims: &[usize], numel: usize) -> [u64; 2] {
    let hidden = dims.last().copied().unwrap_or(1);
    let rows = numel.checked_div(hidden).unwrap_or(0);
    [size(rows), size(hidden)]
}

pub(super) fn lower_norm(at: &Lowering<'_>) -> Result<Vec<Launch>> {
    match at.op {
        Op::RmsNorm { eps } => {
            let x = at.operand(0, "x", F32)?;
            let (weight, stored) = at.stored(1, "weight")?;
            let (out, out_stored) = at.rounded_result(0, "out")?;
            let [rows, hidden] = rows_hidden(x.dims(), x.numel());
            let eps = Lowering::f32_attribute(*eps);
            let (out, weight) = ((out.addr(), out_stored), (weight.addr(), stored));
            let launch = norm::rmsnorm_f32(out, x.addr(), weight, rows, hidden, eps)?;
            Ok(vec![launch])
        }
        Op::AddRmsNorm { eps } => {
            let x = at.operand(0, "x", F32)?;
            let residual = at.operand(1, "residual", F32)?;
            let (weight, stored) = at.stored(2, "weight")?;
            let sum = at.result(0, "sum", F32)?;
            let (out, out_stored) = at.rounded_result(1, "out")?;
            let [rows, hidden] = rows_hidden(x.dims(), x.numel());
            let eps = Lowering::f32_attribute(*eps);
            Ok(vec![norm::add_rmsnorm_f32(
                sum.addr(),
                (out.addr(), out_stored),
                x.addr(),
                residual.addr(),
                (weight.addr(), stored),
                rows,
                hidden,
                eps,
            )?])
        }
        Op::RmsNormBackward { eps } | Op::AddRmsNormBackward { eps } => {
            let fused = matches!(at.op, Op::AddRmsNormBackward { .. });
            let x_name = if fused { "sum" } else { "x" };
            let x = at.operand(0, x_name, F32)?;
            let weight = at.operand(1, "weight", F32)?;
            let grad_out = at.operand(2, "grad_out", F32)?;
            let grad_sum = match fused && at.i.len() > 3 {
                true => Some(at.operand(3, "grad_sum", F32)?.addr()),
                false => None,
            };
            let grad_x_name = if fused { "grad_input" } else { "grad_x" };
            let grad_x = at.result_forms(0, grad_x_name)?;
            let grad_weight = at.result(1, "grad_weight", F32)?;
            let [rows, hidden] = rows_hidden(x.dims(), x.numel());
            if hidden == 0 {
                return Ok(vec![]);
            }
            // Each row's rstd, saved by the row pass for the column pass, then the column
            // pass's partials.
            let (partials, bytes) = norm::backward_workspace(rows, hidden);
            let rstd = at.workspace(bytes, grad_weight.addr())?;
            let eps = Lowering::f32_attribute(*eps);
            let mut launches = Vec::new();
            if rows > 0 {
                let rows_at = RmsNormBackwardRows {
                    grad_x,
                    rstd,
                    x: x.addr(),
                    weight: weight.addr(),
                    grad_out: grad_out.addr(),
                    grad_sum,
                };
                launches.push(norm::rmsnorm_backward_rows_f32(rows_at, rows, hidden, eps)?);
            }
            launches.extend(norm::rmsnorm_backward_weight_f32(
                grad_weight.addr(),
                [x.addr(), grad_out.addr(), rstd],
                [rows, hidden],
                rstd.add(partials),
            )?);
            Ok(launches)
        }
        _ => unreachable!("lower_norm lowers only the RMSNorm ops"),
    }
}

/// `[B,T,H,D]` with `D` even, from the dims of `tensor` taken in `order` (indices of B, T, H, D).
fn rope_dims(at: &Lowering<'_>, dims: &[usize], order: [usize; 4], name: &str) -> Result<RopeDims> {
    match *dims {
        [_, _, _, d] if d % 2 == 0 => Ok(RopeDims {
            batch: size(dims[order[0]]),
            seq: size(dims[order[1]]),
            heads: size(dims[order[2]]),
            head_dim: size(dims[order[3]]),
        }),
        _ => Err(at.unsupported(format!(
            "`{name}` {dims:?} is not rank 4 with an even head dim"
        ))),
    }
}

pub(super) fn lower_rope(at: &Lowering<'_>) -> Result<Vec<Launch>> {
    match at.op {
        Op::Rope { theta, bias } => {
            let x = at.operand(0, "x", F32)?;
            let positions = at.operand(1, "positions", I64)?;
            let (bias, stored) = match bias {
                true => {
                    let (bias, stored) = at.stored(2, "bias")?;
                    (Some(bias.addr()), stored)
                }
                false => (None, Stored::F32),
            };
            let (out, out_stored) = at.rounded_result(0, "out")?;
            let dims = rope_dims(at, x.dims(), [0, 1, 2, 3], "x")?;
            let theta = Lowering::f32_attribute(*theta);
            Ok(vec![rope::rope_f32(
                (out.addr(), out_stored),
                [x.addr(), positions.addr()],
                (bias, stored),
                (dims, theta),
                at.fault,
            )])
        }
        Op::RopeBackward { theta } => {
            let grad = at.operand(0, "grad", F32)?;
            let positions = at.operand(1, "positions", I64)?;
            let grad_x = at.result_forms(0, "grad_x")?;
            // grad is [B,H,T,D].
            let dims = rope_dims(at, grad.dims(), [0, 2, 1, 3], "grad")?;
            let theta = Lowering::f32_attribute(*theta);
            Ok(vec![rope::rope_backward_f32(
                grad_x,
                [grad.addr(), positions.addr()],
                (dims, theta),
                at.fault,
            )])
        }
        _ => unreachable!("lower_rope lowers only the RoPE ops"),
    }
}
