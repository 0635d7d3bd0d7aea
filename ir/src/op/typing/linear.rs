//! The type rule of the fused [`Op::Linear`](crate::Op::Linear).

use super::Rule;
use crate::{DType, Result, TensorType};

/// The most weight groups of one [`Op::Linear`].
pub const LINEAR_MAX_GROUPS: usize = 3;

pub(super) fn linear_types(
    rule: &Rule<'_>,
    biases: &[bool],
    swiglu: bool,
    (rmsnorm, residual): (Option<f64>, bool),
) -> Result<Vec<TensorType>> {
    let groups = biases.len();
    if !(1..=LINEAR_MAX_GROUPS).contains(&groups) || (swiglu && groups != 2) {
        return Err(rule.attribute(format!(
            "{groups} weight groups (1 to {LINEAR_MAX_GROUPS}; swiglu takes exactly 2)"
        )));
    }
    if residual && (groups != 1 || swiglu) {
        return Err(rule.attribute("residual takes one group without swiglu"));
    }
    let norm_port = 1 + groups + biases.iter().filter(|&&b| b).count();
    let residual_port = norm_port + usize::from(rmsnorm.is_some());
    rule.arity(residual_port + usize::from(residual))?;
    let x = &rule.operands[0];
    let x_types = match rmsnorm {
        Some(_) => "f32 [M,K] (the norm's input)",
        None => "f32 or bf16 [M,K]",
    };
    let &[m, k] = x.dims() else {
        return Err(rule.type_error(0, x_types));
    };
    if !matches!(x.dtype, DType::F32 | DType::BF16) || (rmsnorm.is_some() && x.dtype != DType::F32)
    {
        return Err(rule.type_error(0, x_types));
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
    if rmsnorm.is_some() {
        rule.stored(norm_port, DType::F32, &[k])?;
    }
    if swiglu {
        if widths[0] != widths[1] {
            return Err(rule.type_error(2, format!("bf16 [{},{k}] like the gate", widths[0])));
        }
        return Ok(vec![TensorType::new(DType::F32, [m, widths[0]])?]);
    }
    if residual {
        return residual_type(rule, residual_port, [m, widths[0]]);
    }
    widths
        .iter()
        .map(|&n| TensorType::new(DType::F32, [m, n]))
        .collect()
}

/// The residual epilogue: `residual [..., N]` of `M` rows at `port`; the one result, the sum,
/// has its type.
fn residual_type(rule: &Rule<'_>, port: usize, [m, n]: [usize; 2]) -> Result<Vec<TensorType>> {
    let residual = &rule.operands[port];
    let (rows, last) = match residual.dims().split_last() {
        Some((&last, rest)) => (rest.iter().fold(1usize, |n, &d| n.saturating_mul(d)), last),
        None => (0, 0),
    };
    if residual.dtype != DType::F32 || rows != m || last != n {
        return Err(rule.type_error(port, format!("f32 [..., {n}] of {m} rows")));
    }
    Ok(vec![residual.clone()])
}
