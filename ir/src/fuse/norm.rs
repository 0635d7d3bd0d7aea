//! The `rmsnorm` and `residual` rules (see the pass's module doc): a norm whose result only
//! fused linears read becomes their prologue, and the residual add of an `AddRmsNorm` after a
//! one-group linear becomes that linear's epilogue.

use std::collections::BTreeSet;

use petgraph::graph::NodeIndex;

use super::{only_read_by, op_of, through_reshapes, Fusion, Users};
use crate::{Graph, Op, ValueId};

/// Applies both rules to `fusions` (the linears already matched), at every norm they match:
/// `RmsNorm{eps}(x, w)` or `AddRmsNorm{eps}(x, residual, w)` whose normed result is read only
/// by linears as their input (each through one reshape) takes effect as those linears'
/// prologue, on `x` (RmsNorm) or on the sum (AddRmsNorm). An `AddRmsNorm` also needs its `x`
/// to be the result of a one-group linear without SwiGLU, read by the norm alone: that linear
/// computes the sum, `y + residual`, as its epilogue, emitted where the norm was.
pub(super) fn apply_norm_rules(graph: &Graph, users: &Users, fusions: &mut [Fusion]) {
    for node in graph.node_indices() {
        let (eps, normed) = match op_of(graph, node) {
            Some(&Op::RmsNorm { eps }) => (eps, ValueId { node, port: 0 }),
            Some(&Op::AddRmsNorm { eps }) => (eps, ValueId { node, port: 1 }),
            _ => continue,
        };
        let Some((consumers, views)) = consumers(graph, users, fusions, normed) else {
            continue;
        };
        let operands = graph.operands(node);
        let (input, weight) = match normed.port {
            0 => (operands[0], operands[1]),
            _ => {
                let Some(producer) = producer(graph, users, fusions, node) else {
                    continue;
                };
                let (view, fusion) = producer;
                let fusion = &mut fusions[fusion];
                if let Op::Linear { residual, .. } = &mut fusion.op {
                    *residual = true;
                }
                fusion.at = node;
                fusion.operands.push(operands[1]);
                fusion.replaced.extend(view.into_iter().chain([node]));
                fusion.ends = vec![ValueId { node, port: 0 }];
                (ValueId { node, port: 0 }, operands[2])
            }
        };
        for (index, &consumer) in consumers.iter().enumerate() {
            let fusion = &mut fusions[consumer];
            let Op::Linear {
                biases, rmsnorm, ..
            } = &mut fusion.op
            else {
                continue;
            };
            *rmsnorm = Some(eps);
            let norm_port = 1 + biases.len() + biases.iter().filter(|&&b| b).count();
            let shape = graph
                .value_type(fusion.operands[0])
                .map(|t| t.shape.clone())
                .ok();
            fusion.operands[0] = input;
            fusion.operands.insert(norm_port, weight);
            fusion.views.extend(shape.map(|shape| (0, shape)));
            fusion.replaced.extend(views.iter().copied());
            if index == 0 && normed.port == 0 {
                fusion.replaced.push(node);
            }
        }
    }
}

/// The linears (indices into `fusions`) that read `normed` as their input, and the reshapes
/// between, when those are all its readers: each reader is absorbed by such a linear (its
/// folded cast or product), or a reshape whose readers all are, in turn. A linear that
/// already has a prologue does not qualify.
fn consumers(
    graph: &Graph,
    users: &Users,
    fusions: &[Fusion],
    normed: ValueId,
) -> Option<(Vec<usize>, Vec<NodeIndex>)> {
    let linears: Vec<usize> = (fusions.iter().enumerate())
        .filter(|(_, f)| {
            matches!(f.op, Op::Linear { rmsnorm: None, .. })
                && through_reshapes(graph, f.operands[0]) == normed
        })
        .map(|(i, _)| i)
        .collect();
    let absorbed: BTreeSet<NodeIndex> = (linears.iter())
        .flat_map(|&i| fusions[i].replaced.iter().copied())
        .collect();
    let mut views = Vec::new();
    let mut pending = vec![normed];
    while let Some(value) = pending.pop() {
        for reader in users.get(&value)? {
            let reader = (*reader)?;
            if absorbed.contains(&reader) {
                continue;
            }
            let Some(Op::Reshape { .. }) = op_of(graph, reader) else {
                return None;
            };
            views.push(reader);
            pending.push(ValueId {
                node: reader,
                port: 0,
            });
        }
    }
    (!linears.is_empty()).then_some((linears, views))
}

/// The one-group linear without SwiGLU or an epilogue whose result (or a reshape of it, the
/// view returned) is the `x` of the `AddRmsNorm` at `norm`, and nothing else reads.
fn producer(
    graph: &Graph,
    users: &Users,
    fusions: &[Fusion],
    norm: NodeIndex,
) -> Option<(Option<NodeIndex>, usize)> {
    let x = graph.operands(norm)[0];
    let (view, y) = match op_of(graph, x.node) {
        Some(Op::Reshape { .. }) => (Some(x.node), graph.operands(x.node)[0]),
        _ => (None, x),
    };
    if !only_read_by(users, x, norm) || view.is_some_and(|v| !only_read_by(users, y, v)) {
        return None;
    }
    let fusion = fusions.iter().position(|f| {
        matches!(
            &f.op,
            Op::Linear {
                biases,
                swiglu: false,
                residual: false,
                ..
            } if biases.len() == 1
        ) && f.ends == [y]
    })?;
    Some((view, fusion))
}
