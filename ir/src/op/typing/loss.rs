//! The type rule of the chunked LM-head loss, its backward, and both in one.

use super::Rule;
use crate::{DType, Op, Result, Shape, TensorType};

/// `(x [N,H], weight [V,H], targets [N] int) -> (loss [] f32, lse [N] f32)`, `x` and `weight`
/// both f32 or both bf16; the backward `(x, weight, targets, lse, grad_loss [] f32) ->
/// (grad_x, grad_weight)` of `x`'s and `weight`'s types; both in one `(x, weight, targets,
/// grad_loss []) -> (loss [] f32, grad_x, grad_weight)`.
pub(super) fn linear_cross_entropy_types(rule: &Rule<'_>) -> Result<Vec<TensorType>> {
    let backward = matches!(rule.op, Op::LinearCrossEntropyBackward { .. });
    let both = matches!(rule.op, Op::LinearCrossEntropyGrad { .. });
    rule.arity(match (backward, both) {
        (true, _) => 5,
        (_, true) => 4,
        _ => 3,
    })?;
    let x = &rule.operands[0];
    if !matches!(x.dtype, DType::F32 | DType::BF16) || x.dims().len() != 2 {
        return Err(rule.type_error(0, "f32 or bf16 [N,H]"));
    }
    let &[n, h] = x.dims() else {
        unreachable!("rank checked")
    };
    let weight = &rule.operands[1];
    if weight.dtype != x.dtype || weight.dims().len() != 2 || weight.dims()[1] != h {
        return Err(rule.type_error(1, format!("{} [V,{h}]", x.dtype)));
    }
    rule.int(2)?;
    if rule.operands[2].dims() != [n] {
        return Err(rule.type_error(2, format!("int [{n}]")));
    }
    if backward {
        rule.shaped(3, DType::F32, &[n])?;
        rule.shaped(4, DType::F32, &[])?;
        return Ok(vec![x.clone(), weight.clone()]);
    }
    let loss = TensorType::new(DType::F32, Shape::scalar())?;
    if both {
        rule.shaped(3, DType::F32, &[])?;
        return Ok(vec![loss, x.clone(), weight.clone()]);
    }
    Ok(vec![loss, TensorType::new(DType::F32, [n])?])
}
