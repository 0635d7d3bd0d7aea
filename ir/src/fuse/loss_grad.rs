//! The `loss_grad` rule (see the pass's module doc): a bf16 `LinearCrossEntropy` whose `lse`
//! only its `LinearCrossEntropyBackward` reads, that backward taking the same `x`, `weight`
//! and `targets` and a `grad_loss` that is a graph input (the train step's seed, known before
//! the loss), is one [`Op::LinearCrossEntropyGrad`]: the logits are made once. It stands where
//! the backward stood (the seed, an input the backward added, may be numbered after the loss),
//! which reads nothing the loss did not but the seed.

use petgraph::graph::NodeIndex;

use super::{of_dtype, only_read_by, op_of, Fusion, Users};
use crate::graph::NodeKind;
use crate::{DType, Graph, Op, ValueId};

/// The rule at every backward it matches.
pub(super) fn loss_grad_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    graph
        .node_indices()
        .filter_map(|node| loss_grad(graph, users, node))
        .collect()
}

fn loss_grad(graph: &Graph, users: &Users, backward: NodeIndex) -> Option<Fusion> {
    let &Op::LinearCrossEntropyBackward { ignore_index } = op_of(graph, backward)? else {
        return None;
    };
    let &[x, weight, targets, lse, grad_loss] = graph.operands(backward).as_slice() else {
        return None;
    };
    let loss = lse.node;
    let forward = op_of(graph, loss)?;
    let seed = matches!(
        graph.node(grad_loss.node).map(|n| &n.kind),
        Some(NodeKind::Input { .. })
    );
    let matches = *forward == Op::LinearCrossEntropy { ignore_index }
        && lse.port == 1
        && graph.operands(loss) == [x, weight, targets]
        && only_read_by(users, lse, backward)
        && of_dtype(graph, x, DType::BF16)
        && seed;
    matches.then(|| Fusion {
        at: backward,
        replaced: vec![loss, backward],
        op: Op::LinearCrossEntropyGrad { ignore_index },
        operands: vec![x, weight, targets, grad_loss],
        ends: vec![
            ValueId {
                node: loss,
                port: 0,
            },
            ValueId {
                node: backward,
                port: 0,
            },
            ValueId {
                node: backward,
                port: 1,
            },
        ],
    })
}

/// `graph` with each `LinearCrossEntropyGrad` back as the `LinearCrossEntropy` and
/// `LinearCrossEntropyBackward` it stands for, both where it stood: the memory budget's
/// fallback, as the two ops' vocabulary chunks take far less scratch than its chunks of whole
/// rows. Every other node is copied as it is.
pub fn split_loss_grads(graph: &Graph) -> crate::Result<Graph> {
    let mut new = Graph::new(graph.name());
    let mut map = std::collections::BTreeMap::new();
    for node in graph.node_indices() {
        let Some(&NodeKind::Op(Op::LinearCrossEntropyGrad { ignore_index })) =
            graph.node(node).map(|old| &old.kind)
        else {
            super::copy_node(graph, node, (&mut new, &mut map), |_| None)?;
            continue;
        };
        let operands = (graph.operands(node).iter())
            .map(|v| super::mapped(&map, v))
            .collect::<crate::Result<Vec<_>>>()?;
        let &[x, weight, targets, grad_loss] = operands.as_slice() else {
            return Err(crate::Error::Invalid {
                rule: "split_loss_grads: operands",
                detail: format!("{node:?} has {} operands, not 4", operands.len()),
            });
        };
        let forward = Op::LinearCrossEntropy { ignore_index };
        let loss = new.op(forward, &[x, weight, targets])?;
        let backward = Op::LinearCrossEntropyBackward { ignore_index };
        let grads = new.op(backward, &[x, weight, targets, loss[1], grad_loss])?;
        for (port, result) in [loss[0], grads[0], grads[1]].into_iter().enumerate() {
            map.insert(ValueId { node, port }, result);
        }
    }
    super::carry_over(graph, &mut new, &map)?;
    Ok(new)
}
