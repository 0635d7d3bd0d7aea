//! SwiGLU and softmax.

use kiln_kernels::activation as k;

use crate::autograd::Var;
use crate::error::Result;
use crate::launch::{empty, launch};

/// `silu(gate) · up`.
pub fn swiglu(gate: &Var, up: &Var) -> Result<Var> {
    let out = empty(gate.shape().clone(), gate.dtype());
    launch(&[gate.value(), up.value()], &[&out], |i, o| {
        k::swiglu(&i[0], &i[1], &mut o[0])
    })?;
    let (gate_value, up_value) = (gate.value().clone(), up.value().clone());
    Ok(Var::record_one("swiglu", &[gate, up], out, move |g| {
        let grad_gate = empty(gate_value.shape().clone(), gate_value.dtype());
        let grad_up = empty(up_value.shape().clone(), up_value.dtype());
        launch(
            &[&gate_value, &up_value, g],
            &[&grad_gate, &grad_up],
            |i, o| {
                let (gg, gu) = o.split_at_mut(1);
                k::swiglu_backward(&i[0], &i[1], &i[2], &mut gg[0], &mut gu[0])
            },
        )?;
        Ok(vec![Some(grad_gate), Some(grad_up)])
    }))
}

/// Softmax over the last dim.
pub fn softmax(x: &Var) -> Result<Var> {
    let out = empty(x.shape().clone(), x.dtype());
    launch(&[x.value()], &[&out], |i, o| k::softmax(&i[0], &mut o[0]))?;
    let y = out.clone();
    Ok(Var::record_one("softmax", &[x], out, move |g| {
        let grad = empty(y.shape().clone(), y.dtype());
        launch(&[&y, g], &[&grad], |i, o| {
            k::softmax_backward(&i[0], &i[1], &mut o[0])
        })?;
        Ok(vec![Some(grad)])
    }))
}
