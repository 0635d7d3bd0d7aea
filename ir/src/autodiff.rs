//! Reverse-mode autodiff over the IR: [`append_backward`] appends the op nodes that compute the
//! gradient of a one-element loss with respect to chosen values (usually `Param` inputs).
//!
//! The backward graph mirrors the eager oracle's tape (`frontend/src/autograd/engine.rs` and the
//! VJP closures in `frontend/src/ops/*.rs`) op for op, operand for operand and in the same
//! order, so that running the same kernels gives bit-identical gradients. Invariants:
//! 1. Visited ops are those on a path from a `wrt` value to the loss, in descending node index
//!    (the tape's descending creation order: a reverse topological order).
//! 2. Accumulation: a value's first gradient contribution is used as is; each later one makes
//!    `add(previous, new)`, in visit order and, within one op, in operand order.
//! 3. Every appended node goes through [`Graph::op`], so its types are checked; every
//!    contribution is checked to have its value's exact type.
//! 4. Integer operands (ids, positions, targets) never receive a gradient.

use std::collections::{BTreeMap, BTreeSet};

use petgraph::stable_graph::NodeIndex;

use crate::graph::{Node, NodeKind};
use crate::{DType, Error, Graph, Op, Result, Shape, TensorType, ValueId};

/// Appends the backward pass of `loss` to `graph` and returns, per `wrt` value, its gradient
/// (`None` when the loss does not depend on it).
///
/// `loss` must be a one-element float value; `seed` is a value of the same type holding 1 (the
/// caller makes it a graph input, e.g. `loss_seed`, so no constant is baked into the program).
/// Errors: a value not in the graph, a non-scalar or non-float loss, a seed of another type, a
/// non-float `wrt` value, and an op on the path that has no gradient rule (named).
pub fn append_backward(
    graph: &mut Graph,
    loss: ValueId,
    seed: ValueId,
    wrt: &[ValueId],
) -> Result<Vec<Option<ValueId>>> {
    check_inputs(graph, loss, seed, wrt)?;
    // Only the forward nodes; what is appended below is never revisited.
    let forward: Vec<NodeIndex> = graph.node_indices().collect();
    let active = depends_on_wrt(graph, &forward, wrt);

    let mut grads = BTreeMap::new();
    grads.insert(loss, seed);
    for &node in forward.iter().rev() {
        let Some(Node {
            kind: NodeKind::Op(op),
            outputs,
        }) = graph.node(node)
        else {
            continue;
        };
        let (op, result_types) = (op.clone(), outputs.clone());
        let operands = graph.operands(node);
        let wanted: Vec<bool> = operands.iter().map(|v| active.contains(v)).collect();
        if !wanted.contains(&true) {
            continue; // a constant of the tape: computed from no wrt value
        }
        let output_grads: Vec<Option<ValueId>> = (0..result_types.len())
            .map(|port| grads.get(&ValueId { node, port }).copied())
            .collect();
        if output_grads.iter().all(Option::is_none) {
            continue; // it does not lead to the loss: like the tape, nothing flows
        }
        check_typed(graph, node, &op, &operands, &result_types)?;
        let site = Site {
            node,
            op: &op,
            operands: &operands,
            wanted: &wanted,
        };
        let input_grads = vjp(graph, &site, &output_grads)?;
        for ((&operand, &want), grad) in operands.iter().zip(&wanted).zip(input_grads) {
            if let (true, Some(grad)) = (want, grad) {
                contribute(graph, &mut grads, operand, grad)?;
            }
        }
    }
    Ok(wrt.iter().map(|v| grads.get(v).copied()).collect())
}

fn invalid(rule: &'static str, detail: String) -> Error {
    Error::Invalid { rule, detail }
}

fn check_inputs(graph: &Graph, loss: ValueId, seed: ValueId, wrt: &[ValueId]) -> Result<()> {
    let loss_type = graph.value_type(loss)?;
    if !loss_type.dtype.is_float() || loss_type.shape.numel() != 1 {
        return Err(invalid(
            "backward: loss",
            format!("loss {loss} is {loss_type}; it must be a one-element float value"),
        ));
    }
    let seed_type = graph.value_type(seed)?;
    if seed_type != loss_type {
        return Err(invalid(
            "backward: seed",
            format!("seed {seed} is {seed_type}, the loss {loss} is {loss_type}"),
        ));
    }
    for &value in wrt {
        let ty = graph.value_type(value)?;
        if !ty.dtype.is_float() {
            return Err(invalid(
                "backward: wrt",
                format!("{value} is {ty}; only float values have gradients"),
            ));
        }
    }
    Ok(())
}

/// The rules below index operands and results by position: a node edited past the builder
/// (`Graph::raw_mut`) must still obey its type rule, or this is an error rather than a panic.
fn check_typed(
    graph: &Graph,
    node: NodeIndex,
    op: &Op,
    operands: &[ValueId],
    results: &[TensorType],
) -> Result<()> {
    let types = operands
        .iter()
        .map(|&v| graph.value_type(v).cloned())
        .collect::<Result<Vec<_>>>()?;
    if op.infer(&types)? != results {
        return Err(invalid(
            "backward: gradient rule",
            format!(
                "`{op}` (node {}) has results that break its type rule",
                node.index()
            ),
        ));
    }
    Ok(())
}

/// Values computed from some `wrt` value (the tape's non-constants), `wrt` included.
fn depends_on_wrt(graph: &Graph, forward: &[NodeIndex], wrt: &[ValueId]) -> BTreeSet<ValueId> {
    let mut active: BTreeSet<ValueId> = wrt.iter().copied().collect();
    for &node in forward {
        let Some(Node {
            kind: NodeKind::Op(_),
            outputs,
        }) = graph.node(node)
        else {
            continue;
        };
        if graph.operands(node).iter().any(|v| active.contains(v)) {
            active.extend((0..outputs.len()).map(|port| ValueId { node, port }));
        }
    }
    active
}

/// Adds one gradient contribution to `value` (invariant 2).
fn contribute(
    graph: &mut Graph,
    grads: &mut BTreeMap<ValueId, ValueId>,
    value: ValueId,
    grad: ValueId,
) -> Result<()> {
    let (want, got) = (graph.value_type(value)?, graph.value_type(grad)?);
    if want != got {
        return Err(invalid(
            "backward: gradient",
            format!("gradient {grad} of {value} is {got}, the value is {want}"),
        ));
    }
    let total = match grads.get(&value) {
        None => grad,
        Some(&previous) => graph.op1(Op::Add, &[previous, grad])?,
    };
    grads.insert(value, total);
    Ok(())
}

/// The op being differentiated: its node, operands and which operands need a gradient.
struct Site<'a> {
    node: NodeIndex,
    op: &'a Op,
    operands: &'a [ValueId],
    wanted: &'a [bool],
}

impl Site<'_> {
    fn result(&self, port: usize) -> ValueId {
        ValueId {
            node: self.node,
            port,
        }
    }

    fn error(&self, reason: &str) -> Error {
        invalid(
            "backward: gradient rule",
            format!("`{}` (node {}) {reason}", self.op, self.node.index()),
        )
    }
}

fn dtype_of(graph: &Graph, value: ValueId) -> Result<DType> {
    Ok(graph.value_type(value)?.dtype)
}

fn shape_of(graph: &Graph, value: ValueId) -> Result<Shape> {
    Ok(graph.value_type(value)?.shape.clone())
}

/// `grad` summed down to `shape`, or `grad` itself when it already has it (the tape's `sum_to`).
fn sum_to(graph: &mut Graph, grad: ValueId, shape: &Shape) -> Result<ValueId> {
    if graph.value_type(grad)?.shape == *shape {
        return Ok(grad);
    }
    let shape = shape.clone();
    graph.op1(Op::SumToShape { shape }, &[grad])
}

/// `Some(make())` when `want`, else `None` (the gradient is not computed at all).
fn when(want: bool, make: impl FnOnce() -> Result<ValueId>) -> Result<Option<ValueId>> {
    want.then(make).transpose()
}

/// `value` again when it is a cast of a graph input (recomputed where it is needed), else
/// `value` itself.
fn recast_input(graph: &mut Graph, value: ValueId) -> Result<ValueId> {
    let Some(Node {
        kind: NodeKind::Op(Op::Cast { to }),
        ..
    }) = graph.node(value.node)
    else {
        return Ok(value);
    };
    let to = *to;
    let operand = graph.operands(value.node)[0];
    match graph.node(operand.node) {
        Some(Node {
            kind: NodeKind::Input { .. },
            ..
        }) => graph.op1(Op::Cast { to }, &[operand]),
        _ => Ok(value),
    }
}

/// `value` cast to `to` unless it already is (the tape's matmul casts).
fn cast_to(graph: &mut Graph, value: ValueId, to: DType) -> Result<ValueId> {
    if dtype_of(graph, value)? == to {
        return Ok(value);
    }
    graph.op1(Op::Cast { to }, &[value])
}

/// The VJP of one op: gradients of its operands (`None` where none flows) from those of its
/// results (at least one present). Same ops, operands and order as the tape's closure; nodes
/// that only an unwanted operand would use are not emitted (the caller drops its gradient).
fn vjp(graph: &mut Graph, site: &Site, out: &[Option<ValueId>]) -> Result<Vec<Option<ValueId>>> {
    let x = site.operands;
    let want = site.wanted;
    // Single-result ops (and attention's `out`) get their gradient on port 0.
    let g0 = || out[0].ok_or_else(|| site.error("got no gradient for its first result"));
    let grads = match site.op {
        Op::Add => {
            let g = g0()?;
            let grad_b = when(want[1], || sum_to(graph, g, &shape_of(graph, x[1])?))?;
            vec![Some(g), grad_b]
        }
        Op::Mul => {
            let g = g0()?;
            let grad_a = when(want[0], || graph.op1(Op::Mul, &[g, x[1]]))?;
            let grad_b = when(want[1], || {
                let product = graph.op1(Op::Mul, &[g, x[0]])?;
                sum_to(graph, product, &shape_of(graph, x[1])?)
            })?;
            vec![grad_a, grad_b]
        }
        &Op::Scale { alpha } => vec![Some(graph.op1(Op::Scale { alpha }, &[g0()?])?)],
        Op::Cast { .. } => {
            let to = dtype_of(graph, x[0])?;
            vec![Some(graph.op1(Op::Cast { to }, &[g0()?])?)]
        }
        &Op::MatMul {
            transpose_a: ta,
            transpose_b: tb,
        } => matmul_vjp(graph, x, want, ta, tb, g0()?)?,
        Op::Reshape { .. } => {
            let shape = shape_of(graph, x[0])?;
            vec![Some(graph.op1(Op::Reshape { shape }, &[g0()?])?)]
        }
        &Op::Transpose { dim0, dim1 } => {
            // The tape materializes it, so gradients reaching kernels are contiguous.
            let view = graph.op1(Op::Transpose { dim0, dim1 }, &[g0()?])?;
            vec![Some(graph.op1(Op::Contiguous, &[view])?)]
        }
        Op::Contiguous => vec![Some(g0()?)],
        Op::Embedding => {
            // The type rule made the weight [V,H].
            let vocab = shape_of(graph, x[0])?.dims().first().copied().unwrap_or(0);
            let onto = false;
            let grad = graph.op1(Op::EmbeddingBackward { vocab, onto }, &[x[1], g0()?])?;
            vec![Some(grad), None]
        }
        &Op::RmsNorm { eps } => {
            let r = graph.op(Op::RmsNormBackward { eps }, &[x[0], x[1], g0()?])?;
            vec![Some(r[0]), Some(r[1])]
        }
        &Op::AddRmsNorm { eps } => {
            // The tape would feed zeros for a missing `out` gradient; programs never need it.
            let grad_out =
                out[1].ok_or_else(|| site.error("got a gradient for `sum` but none for `out`"))?;
            let mut operands = vec![site.result(0), x[2], grad_out];
            operands.extend(out[0]);
            let r = graph.op(Op::AddRmsNormBackward { eps }, &operands)?;
            // d sum/dx = d sum/d residual = I: both take the same gradient value.
            vec![Some(r[0]), Some(r[0]), Some(r[1])]
        }
        &Op::Rope { theta, bias } => {
            let grad_x = graph.op1(Op::RopeBackward { theta }, &[g0()?, x[1]])?;
            let mut grads = vec![Some(grad_x), None];
            if bias {
                grads.push(when(want[2], || rope_bias_grad(graph, grad_x))?);
            }
            grads
        }
        &Op::Attention { scale } => {
            if out[1].is_some() {
                return Err(site.error("has a gradient on `probs`, which is not differentiable"));
            }
            let operands = [x[0], x[1], x[2], site.result(1), g0()?];
            let r = graph.op(Op::AttentionBackward { scale }, &operands)?;
            vec![Some(r[0]), Some(r[1]), Some(r[2])]
        }
        &Op::FlashAttention { scale, rounding } => {
            if rounding != DType::BF16 {
                return Err(site.error(&format!(
                    "rounds to {rounding}: only the bf16 FlashAttention has a backward"
                )));
            }
            if out[1].is_some() {
                return Err(site.error("has a gradient on `lse`, which is not differentiable"));
            }
            let operands = [x[0], x[1], x[2], site.result(0), site.result(1), g0()?];
            let r = graph.op(Op::FlashAttentionBackward { scale }, &operands)?;
            vec![Some(r[0]), Some(r[1]), Some(r[2])]
        }
        Op::SwiGlu => {
            let r = graph.op(Op::SwiGluBackward, &[x[0], x[1], g0()?])?;
            vec![Some(r[0]), Some(r[1])]
        }
        Op::Softmax => {
            let grad = graph.op1(Op::SoftmaxBackward, &[site.result(0), g0()?])?;
            vec![Some(grad)]
        }
        &Op::CrossEntropy { ignore_index } => {
            let backward = Op::CrossEntropyBackward { ignore_index };
            vec![Some(graph.op1(backward, &[x[0], x[1], g0()?])?), None]
        }
        &Op::LinearCrossEntropy { ignore_index } => {
            if out[1].is_some() {
                return Err(site.error("has a gradient on `lse`, which is not differentiable"));
            }
            let backward = Op::LinearCrossEntropyBackward { ignore_index };
            // A bf16 copy of a graph input is cast again, as in `matmul_vjp`.
            let weight = recast_input(graph, x[1])?;
            let operands = [x[0], weight, x[2], site.result(1), g0()?];
            let r = graph.op(backward, &operands)?;
            vec![Some(r[0]), Some(r[1]), None]
        }
        Op::SumToShape { .. } => {
            // The tape's `sum` broadcasts the gradient back as `zeros + g`, whatever the shapes.
            let shape = shape_of(graph, x[0])?;
            vec![Some(graph.op1(Op::BroadcastTo { shape }, &[g0()?])?)]
        }
        Op::BroadcastTo { .. } => {
            let shape = shape_of(graph, x[0])?;
            vec![Some(sum_to(graph, g0()?, &shape)?)]
        }
        Op::EmbeddingBackward { .. }
        | Op::RmsNormBackward { .. }
        | Op::AddRmsNormBackward { .. }
        | Op::RopeBackward { .. }
        | Op::AttentionBackward { .. }
        | Op::FlashAttentionBackward { .. }
        | Op::CachedAttention { .. }
        | Op::KvCacheWrite
        | Op::RopeKvWrite { .. }
        | Op::CastInto
        | Op::SwiGluBackward
        | Op::SoftmaxBackward
        | Op::Argmax
        | Op::CrossEntropyBackward { .. }
        | Op::LinearCrossEntropyBackward { .. }
        | Op::LinearCrossEntropyGrad { .. }
        | Op::AdamW(_)
        | Op::AdamWCopy(_)
        | Op::EmbeddingAdamW { .. }
        | Op::ClipGradNorm { .. }
        | Op::AllReduce
        | Op::Linear { .. }
        | Op::Rounded(_)
        | Op::AlsoRounded(_)
        | Op::Slice { .. } => {
            return Err(site.error("has no gradient rule but is on the path to the loss"))
        }
    };
    Ok(grads)
}

/// `out = op(a)·op(b)`: `grad_a = G·op(b)ᵀ` or `op(b)·Gᵀ`, `grad_b = op(a)ᵀ·G` or `Gᵀ·op(a)`,
/// each one flagged matmul (frontend/src/ops/matmul.rs). bf16 operands give an f32 product,
/// so `G` is rounded to the operand dtype first and the gradients are rounded back after.
fn matmul_vjp(
    graph: &mut Graph,
    x: &[ValueId],
    want: &[bool],
    ta: bool,
    tb: bool,
    g: ValueId,
) -> Result<Vec<Option<ValueId>>> {
    // A cast of a graph input (a bf16 copy of a weight) is cast again here rather than kept
    // alive from the forward pass to this point: the same bits, and no copy of every weight
    // held across the whole step.
    let (a, b) = (recast_input(graph, x[0])?, recast_input(graph, x[1])?);
    let input_dtype = dtype_of(graph, a)?;
    let g = cast_to(graph, g, input_dtype)?;
    let matmul = |transpose_a, transpose_b| Op::MatMul {
        transpose_a,
        transpose_b,
    };
    let grad_a = when(want[0], || match ta {
        true => graph.op1(matmul(tb, true), &[b, g]),
        false => graph.op1(matmul(false, !tb), &[g, b]),
    })?;
    let grad_b = when(want[1], || match tb {
        true => graph.op1(matmul(true, ta), &[g, a]),
        false => graph.op1(matmul(!ta, false), &[a, g]),
    })?;
    // Rounded back in the tape's order: grad_a, then grad_b.
    let mut back = |grad: Option<ValueId>| grad.map(|t| cast_to(graph, t, input_dtype)).transpose();
    Ok(vec![back(grad_a)?, back(grad_b)?])
}

/// The bias was added before the rotation: its gradient sums `grad_x [B,T,H,D]` over B and T.
fn rope_bias_grad(graph: &mut Graph, grad_x: ValueId) -> Result<ValueId> {
    let &[batch, seq, heads, head_dim] = graph.value_type(grad_x)?.dims() else {
        return Err(invalid(
            "backward: gradient rule",
            format!("rope_backward result {grad_x} is not [B,T,H,D]"),
        ));
    };
    let rows_shape = Shape::new(&[batch * seq, heads * head_dim]);
    let rows = graph.op1(Op::Reshape { shape: rows_shape }, &[grad_x])?;
    let bias_shape = Shape::new(&[heads * head_dim]);
    graph.op1(Op::SumToShape { shape: bias_shape }, &[rows])
}

#[cfg(test)]
#[path = "autodiff_tests.rs"]
mod tests;
