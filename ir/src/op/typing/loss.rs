//! The type rule of the chunked LM-head loss and its backward.

use super::Rule;
use crate::{DType, Op, Result, Shape, TensorType};

/// `(x [N,H], weight [V,H], targets [N] int) -> (loss [] f32, lse [N] f32)`, `x` and `weight`
/// both f32 or both bf16; the backward `(x, weight, targets, lse, grad_loss [] f32) ->
/// (grad_x, grad_weight)` of `x`'s and `weight`'s types.
pub(super) fn linear_cross_entropy_types(rule: &Rule<'_>) -> Result<Vec<TensorType>> {
    let backward = matches!(rule.op, Op::LinearCrossEntropyBackward { .. });
    rule.arity(if backward { 5 } else { 3 })?;
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
    Ok(vec![
        TensorType::new(DType::F32, Shape::scalar())?,
        TensorType::new(DType::F32, [n])?,
    ])
}
