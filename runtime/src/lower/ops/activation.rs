//! Activations: SwiGLU and its backward, softmax and its backward, argmax.

use kiln_ir::Op;
use kiln_kernels::gpu::{self, Launch};

use super::{rows_cols, size, Lowering, F32, I64};
use crate::error::Result;

pub(super) fn lower_activation(at: &Lowering<'_>) -> Result<Vec<Launch>> {
    match at.op {
        Op::SwiGlu => {
            // Gate and up of one dtype: f32, or rounded products.
            let (gate, in_stored) = at.stored(0, "gate")?;
            let up = at.operand(1, "up", gate.dtype)?;
            let (out, stored) = at.rounded_result(0, "out")?;
            let n = size(gate.numel());
            Ok(vec![gpu::elementwise::swiglu(
                (out.addr(), stored),
                ([gate.addr(), up.addr()], in_stored),
                n,
            )])
        }
        Op::SwiGluBackward => {
            let (gate, in_stored) = at.stored(0, "gate")?;
            let up = at.operand(1, "up", gate.dtype)?;
            let (grad, grad_stored) = at.stored(2, "grad")?;
            let (grad_gate, stored) = at.rounded_result(0, "grad_gate")?;
            let (grad_up, _) = at.rounded_result(1, "grad_up")?;
            Ok(vec![gpu::elementwise::swiglu_backward(
                ([grad_gate.addr(), grad_up.addr()], stored),
                ([gate.addr(), up.addr()], in_stored),
                (grad.addr(), grad_stored),
                size(gate.numel()),
            )])
        }
        Op::Softmax => {
            let x = at.operand(0, "x", F32)?;
            let out = at.result(0, "out", F32)?;
            let [rows, cols] = rows_cols(x);
            Ok(vec![gpu::activation::softmax_f32(
                out.addr(),
                x.addr(),
                rows,
                cols,
            )?])
        }
        Op::Argmax => {
            let x = at.operand(0, "x", F32)?;
            let out = at.result(0, "out", I64)?;
            let [rows, cols] = rows_cols(x);
            if rows == 0 {
                return Ok(vec![]);
            }
            Ok(vec![gpu::activation::argmax_f32(
                out.addr(),
                x.addr(),
                rows,
                cols,
            )?])
        }
        Op::SoftmaxBackward => {
            let y = at.operand(0, "y", F32)?;
            let grad = at.operand(1, "grad", F32)?;
            let grad_x = at.result(0, "grad_x", F32)?;
            let [rows, cols] = rows_cols(y);
            Ok(vec![gpu::activation::softmax_backward_f32(
                grad_x.addr(),
                y.addr(),
                grad.addr(),
                rows,
                cols,
            )?])
        }
        _ => unreachable!("lower_activation lowers only the activations"),
    }
}
