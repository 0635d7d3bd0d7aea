//! The type rule of the fused [`Op::Linear`](crate::Op::Linear).

use super::Rule;
use crate::{DType, Result, TensorType};

/// The most weight groups of one [`Op::Linear`].
pub const LINEAR_MAX_GROUPS: usize = 3;

pub(super) fn linear_types(
    rule: &Rule<'_>,
    biases: &[bool],
    swiglu: bool,
) -> Result<Vec<TensorType>> {
    let groups = biases.len();
    if !(1..=LINEAR_MAX_GROUPS).contains(&groups) || (swiglu && groups != 2) {
        return Err(rule.attribute(format!(
            "{groups} weight groups (1 to {LINEAR_MAX_GROUPS}; swiglu takes exactly 2)"
        )));
    }
    rule.arity(1 + groups + biases.iter().filter(|&&b| b).count())?;
    let x = &rule.operands[0];
    let &[m, k] = x.dims() else {
        return Err(rule.type_error(0, "f32 or bf16 [M,K]"));
    };
    if !matches!(x.dtype, DType::F32 | DType::BF16) {
        return Err(rule.type_error(0, "f32 or bf16 [M,K]"));
    }
    let mut widths = Vec::with_capacity(groups);
    for port in 1..=groups {
        let w = &rule.operands[port];
        match *w.dims() {
            [n, wk] if wk == k && w.dtype == DType::BF16 => widths.push(n),
            _ => return Err(rule.type_error(port, format!("bf16 [N,{k}]"))),
        }
    }
    let biased = biases.iter().enumerate().filter(|(_, &b)| b);
    for (port, (group, _)) in (1 + groups..).zip(biased) {
        rule.stored(port, DType::F32, &[widths[group]])?;
    }
    if swiglu {
        if widths[0] != widths[1] {
            return Err(rule.type_error(2, format!("bf16 [{},{k}] like the gate", widths[0])));
        }
        return Ok(vec![TensorType::new(DType::F32, [m, widths[0]])?]);
    }
    widths
        .iter()
        .map(|&n| TensorType::new(DType::F32, [m, n]))
        .collect()
}
