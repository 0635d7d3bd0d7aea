//! The type rule of the fused [`Op::Linear`](crate::Op::Linear).

use super::Rule;
use crate::op::rope_kv;
use crate::{DType, Op, Result, TensorType};

/// The most weight groups of one [`Op::Linear`].
pub const LINEAR_MAX_GROUPS: usize = 3;

/// The most rows of `x` the skinny linear kernels take (kernels/src/gpu/linear.rs), and the
/// most a linear runs there by default (the CUDA lowering's `linear_rows`).
pub const LINEAR_MAX_ROWS: usize = 32;

/// The most rows of `x` of a linear without a rounded form. The skinny kernels write f32
/// results; a linear of more rows has a rounded form ([`Op::Rounded`]): it runs on the vendor
/// GEMM, whose own SwiGLU and add + RMSNorm kernels write the next linear's input rounded
/// (no cast before that linear's GEMM), whatever the lowering's `linear_rows`. Up to 16 rows
/// every linear on the skinny kernels measured fastest; at 24 and 32 rows the rounded ones on
/// the vendor GEMM and the others (q/k/v, the LM head) on the skinny kernels beat every linear
/// on the vendor GEMM (BENCHMARKS.md; every linear on the skinny kernels is not measured
/// against that).
pub const UNROUNDED_LINEAR_MAX_ROWS: usize = 16;

pub(super) fn linear_types(
    rule: &Rule<'_>,
    biases: &[bool],
    swiglu: bool,
    (add_rmsnorm, rope_kv): (Option<f64>, Option<f64>),
) -> Result<Vec<TensorType>> {
    let groups = biases.len();
    if !(1..=LINEAR_MAX_GROUPS).contains(&groups) || (swiglu && groups != 2) {
        return Err(rule.attribute(format!(
            "{groups} weight groups (1 to {LINEAR_MAX_GROUPS}; swiglu takes exactly 2)"
        )));
    }
    if add_rmsnorm.is_some() && (groups != 1 || swiglu || rope_kv.is_some()) {
        return Err(rule.attribute("add_rmsnorm takes one group without swiglu"));
    }
    if rope_kv.is_some() && (groups != 3 || swiglu) {
        return Err(rule.attribute("rope_kv takes three groups (q, k, v) without swiglu"));
    }
    let linear_operands = 1 + groups + biases.iter().filter(|&&b| b).count();
    match rope_kv {
        // The caches, the rope positions, the positions, and the rows of a pooled cache.
        Some(_) => rule.arity_either([linear_operands + 4, linear_operands + 5])?,
        None => rule.arity(linear_operands + if add_rmsnorm.is_some() { 2 } else { 0 })?,
    }
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
    if let Some(eps) = add_rmsnorm {
        return add_rmsnorm_types(rule, linear_operands, [m, widths[0]], eps);
    }
    if let Some(theta) = rope_kv {
        return rope_kv_types(rule, linear_operands, (m, &widths), theta);
    }
    widths
        .iter()
        .map(|&n| TensorType::new(DType::F32, [m, n]))
        .collect()
}

/// The norm epilogue: `residual [..., N]` of `M` rows at `port`, `norm_weight` after it; the
/// results are `AddRmsNorm`'s (its errors renamed to this op and its ports).
fn add_rmsnorm_types(
    rule: &Rule<'_>,
    port: usize,
    [m, n]: [usize; 2],
    eps: f64,
) -> Result<Vec<TensorType>> {
    let residual = &rule.operands[port];
    let (rows, last) = match residual.dims().split_last() {
        Some((&last, rest)) => (rest.iter().fold(1usize, |n, &d| n.saturating_mul(d)), last),
        None => (0, 0),
    };
    if residual.dtype != DType::F32 || rows != m || last != n {
        return Err(rule.type_error(port, format!("f32 [..., {n}] of {m} rows")));
    }
    let y = TensorType::new(DType::F32, residual.dims())?;
    let operands = [y, residual.clone(), rule.operands[port + 1].clone()];
    Op::AddRmsNorm { eps }
        .infer(&operands)
        .map_err(|error| rule.renamed(error, |p| port + p - 1))
}

/// The RoPE and cache epilogue: the results of `RopeKvWrite{theta}` on the groups' outputs
/// (`[M, H·D]` each) viewed as its q, k and v, with `B·T = M` from the rope positions `[B,T]`
/// and `D` the caches' head size (its errors renamed to this op and its ports: a view's to its
/// weight's).
fn rope_kv_types(
    rule: &Rule<'_>,
    first: usize,
    (m, widths): (usize, &[usize]),
    theta: f64,
) -> Result<Vec<TensorType>> {
    let cache = rule.rank(first, 4, "[S,Hkv,Smax,D]")?;
    let rope_positions = first + 2;
    let positions = rule.operands[rope_positions].dims();
    if !matches!(*positions, [b, t] if b.checked_mul(t) == Some(m)) {
        return Err(rule.type_error(rope_positions, format!("int [B,T] with B·T = {m}")));
    }
    let Some(views) = rope_kv::LinearRopeKv::views(widths, cache, positions) else {
        // A width that is no whole number of heads (at least one) of the caches' head size.
        let (d, k) = (cache[3], rule.operands[0].dims()[1]);
        let group = (widths.iter())
            .position(|&n| d == 0 || n == 0 || !n.is_multiple_of(d))
            .unwrap_or(0);
        return Err(rule.type_error(1 + group, format!("bf16 [H·{d},{k}] with H ≥ 1")));
    };
    let mut operands = (views.into_iter())
        .map(|dims| TensorType::new(DType::F32, dims))
        .collect::<Result<Vec<_>>>()?;
    operands.extend_from_slice(&rule.operands[first..]);
    let op = Op::RopeKvWrite {
        theta,
        bias: false,
        staged: None,
    };
    // A view's error is its weight's.
    op.infer(&operands).map_err(|error| {
        rule.renamed(error, |port| match port.checked_sub(rope_kv::K_CACHE) {
            Some(past) => first + past,
            None => 1 + port,
        })
    })
}
