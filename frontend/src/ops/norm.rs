//! RMSNorm and fused residual-add + RMSNorm.

use kiln_kernels::norm as k;
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::Result;
use crate::launch::{empty, launch};

/// `(x · rstd) · weight` over the last dim, `rstd = 1/sqrt(mean(x²) + eps)`.
pub fn rmsnorm(x: &Var, weight: &Var, eps: f64) -> Result<Var> {
    let out = empty(x.shape().clone(), x.dtype());
    launch(&[x.value(), weight.value()], &[&out], |i, o| {
        k::rmsnorm(&i[0], &i[1], eps, &mut o[0])
    })?;
    let (x_value, weight_value) = (x.value().clone(), weight.value().clone());
    Ok(Var::record_one("rmsnorm", &[x, weight], out, move |g| {
        let grad_x = empty(x_value.shape().clone(), x_value.dtype());
        let grad_weight = empty(weight_value.shape().clone(), weight_value.dtype());
        launch(
            &[&x_value, &weight_value, g],
            &[&grad_x, &grad_weight],
            |i, o| {
                let (gx, gw) = o.split_at_mut(1);
                k::rmsnorm_backward(&i[0], &i[1], &i[2], eps, &mut gx[0], &mut gw[0])
            },
        )?;
        Ok(vec![Some(grad_x), Some(grad_weight)])
    }))
}

/// Fused `sum = x + residual` and `out = rmsnorm(sum)`; returns `(sum, out)`.
pub fn add_rmsnorm(x: &Var, residual: &Var, weight: &Var, eps: f64) -> Result<(Var, Var)> {
    let sum = empty(x.shape().clone(), x.dtype());
    let out = empty(x.shape().clone(), x.dtype());
    launch(
        &[x.value(), residual.value(), weight.value()],
        &[&sum, &out],
        |i, o| {
            let (s, n) = o.split_at_mut(1);
            k::add_rmsnorm(&i[0], &i[1], &i[2], eps, &mut s[0], &mut n[0])
        },
    )?;
    let (sum_value, weight_value) = (sum.clone(), weight.value().clone());
    let mut outs = Var::record(
        "add_rmsnorm",
        &[x, residual, weight],
        vec![sum, out],
        move |grads: &[Option<Tensor>]| {
            let grad_input = empty(sum_value.shape().clone(), sum_value.dtype());
            let grad_weight = empty(weight_value.shape().clone(), weight_value.dtype());
            // No gradient through the norm is a zero gradient; none through the sum is skipped
            // (the IR's add_rmsnorm_backward then has no grad_sum operand either).
            let grad_out = match &grads[1] {
                Some(grad) => grad.clone(),
                None => empty(sum_value.shape().clone(), sum_value.dtype()),
            };
            let mut inputs = vec![&sum_value, &weight_value, &grad_out];
            inputs.extend(grads[0].as_ref());
            launch(&inputs, &[&grad_input, &grad_weight], |i, o| {
                let (gi, gw) = o.split_at_mut(1);
                k::add_rmsnorm_backward(&i[0], &i[1], &i[2], i.get(3), eps, &mut gi[0], &mut gw[0])
            })?;
            // d sum/dx = d sum/d residual = I: both get the same (never mutated) gradient.
            Ok(vec![
                Some(grad_input.clone()),
                Some(grad_input),
                Some(grad_weight),
            ])
        },
    );
    let out = outs.remove(1);
    let sum = outs.remove(0);
    Ok((sum, out))
}
