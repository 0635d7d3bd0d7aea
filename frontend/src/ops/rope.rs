//! Split-half rotary position embedding with fused bias and BTHD → BHTD layout change.

use kiln_ir::Shape;
use kiln_kernels::rope as k;
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::{Error, Result};
use crate::launch::{empty, launch};

/// `x [B,T,H,D]` (+ `bias [H·D]`) rotated at integer `positions [B,T]` → `[B,H,T,D]`.
pub fn rope(x: &Var, positions: &Tensor, bias: Option<&Var>, theta: f64) -> Result<Var> {
    let &[batch, seq, heads, head_dim] = x.dims() else {
        return Err(Error::Operand {
            op: "rope",
            reason: format!("x must be [B,T,H,D], got {}", x.shape()),
        });
    };
    let out = empty([batch, heads, seq, head_dim], x.dtype());
    match bias {
        Some(bias) => launch(&[x.value(), positions, bias.value()], &[&out], |i, o| {
            k::rope(&i[0], &i[1], Some(&i[2]), theta, &mut o[0])
        })?,
        None => launch(&[x.value(), positions], &[&out], |i, o| {
            k::rope(&i[0], &i[1], None, theta, &mut o[0])
        })?,
    }
    let (positions, x_shape, dtype) = (positions.clone(), x.shape().clone(), x.dtype());
    let mut inputs = vec![x];
    inputs.extend(bias);
    let has_bias = bias.is_some();
    Ok(Var::record_one("rope", &inputs, out, move |g| {
        let grad_x = empty(x_shape.clone(), dtype);
        launch(&[g, &positions], &[&grad_x], |i, o| {
            k::rope_backward(&i[0], &i[1], theta, &mut o[0])
        })?;
        if !has_bias {
            return Ok(vec![Some(grad_x)]);
        }
        // The bias was added before the rotation: its gradient sums grad_x over B and T.
        let grad_bias = empty(Shape::new(&[heads * head_dim]), dtype);
        let rows = grad_x.reshape([batch * seq, heads * head_dim])?;
        launch(&[&rows], &[&grad_bias], |i, o| {
            kiln_kernels::elementwise::sum_to_shape(&i[0], &mut o[0])
        })?;
        Ok(vec![Some(grad_x), Some(grad_bias)])
    }))
}
