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
