//! Cross-entropy loss, and the LM head with it over vocabulary chunks.

use kiln_ir::{DType, Shape};
use kiln_kernels::loss as k;
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::Result;
use crate::launch::{empty, launch};

/// Mean over rows whose target is not `ignore_index` of `logsumexp(row) − row[target]`, as a
/// scalar `{}`; `logits [N,V]`, integer `targets [N]`.
pub fn cross_entropy(logits: &Var, targets: &Tensor, ignore_index: i64) -> Result<Var> {
    let loss = empty(Shape::scalar(), logits.dtype());
    launch(&[logits.value(), targets], &[&loss], |i, o| {
        k::cross_entropy(&i[0], &i[1], ignore_index, &mut o[0])
    })?;
    let (logits_value, targets) = (logits.value().clone(), targets.clone());
    Ok(Var::record_one(
        "cross_entropy",
        &[logits],
        loss,
        move |g| {
            let grad = empty(logits_value.shape().clone(), logits_value.dtype());
            launch(&[&logits_value, &targets, g], &[&grad], |i, o| {
                k::cross_entropy_backward(&i[0], &i[1], ignore_index, &i[2], &mut o[0])
            })?;
            Ok(vec![Some(grad)])
        },
    ))
}

/// [`cross_entropy`] of the logits `x [N,H] · weightᵀ` (`x` and `weight` both f32 or both
/// bf16) without the logits whole: `kiln_kernels::loss::chunked`'s contract. The backward
/// rebuilds each chunk's logits from `x`, `weight` and the saved log-sum-exp.
pub fn linear_cross_entropy(
    x: &Var,
    weight: &Var,
    targets: &Tensor,
    ignore_index: i64,
) -> Result<Var> {
    let rows = x.dims().first().copied().unwrap_or(0);
    let loss = empty(Shape::scalar(), DType::F32);
    let lse = empty([rows], DType::F32);
    launch(
        &[x.value(), weight.value(), targets],
        &[&loss, &lse],
        |i, o| {
            let (loss, lse) = o.split_at_mut(1);
            k::chunked::linear_cross_entropy(
                &i[0],
                &i[1],
                &i[2],
                ignore_index,
                &mut loss[0],
                &mut lse[0],
            )
        },
    )?;
    let saved = [x.value().clone(), weight.value().clone(), targets.clone()];
    Ok(Var::record_one(
        "linear_cross_entropy",
        &[x, weight],
        loss,
        move |g| {
            let [x, weight, targets] = &saved;
            let grad_x = empty(x.shape().clone(), x.dtype());
            let grad_weight = empty(weight.shape().clone(), weight.dtype());
            launch(
                &[x, weight, targets, &lse, g],
                &[&grad_x, &grad_weight],
                |i, o| {
                    let (grad_x, grad_weight) = o.split_at_mut(1);
                    k::chunked::linear_cross_entropy_backward(
                        &i[0],
                        &i[1],
                        &i[2],
                        &i[3],
                        &i[4],
                        ignore_index,
                        &mut grad_x[0],
                        &mut grad_weight[0],
                    )
                },
            )?;
            Ok(vec![Some(grad_x), Some(grad_weight)])
        },
    ))
}
