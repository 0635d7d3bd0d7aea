//! Cross-entropy loss.

use kiln_ir::Shape;
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
