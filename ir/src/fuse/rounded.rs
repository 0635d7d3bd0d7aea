//! The `rounded` rule (see the pass's module doc): an op each of whose roundable results
//! ([`Op::rounded_results`]) is read only by a `Cast{bf16}` (directly, or through reshapes each
//! read by the next alone) is one [`Op::Rounded`]: its kernel writes those results rounded, the f32
//! ones never exist. Mixed precision's backward rounds each gradient of a bf16 GEMM input so;
//! SwiGLU's result and its backward's gradients are rounded for the down and gate/up GEMMs, and the
//! normed rows for the GEMMs they feed. A result that only ports rounding it on entry read
//! ([`Op::rounded_on_entry`]: RoPE's q and k, which the bf16 FlashAttention takes; the normed rows,
//! SwiGLU's result and the attention's output a linear of many rows takes), directly or through
//! reshapes, is written rounded too, those readers taking the bf16 value: the same bits, half the
//! bytes. Where such a result is read both rounded (by a cast of its own) and as it is, an op that
//! can ([`Op::also_roundable`]: the norms' and RoPE's input gradients and v's made token-major in
//! the backward, FlashAttention's output in training) becomes one [`Op::AlsoRounded`]: it writes
//! the rounded copy beside the result, and the cast is gone.

use petgraph::graph::NodeIndex;

use super::{of_dtype, op_of, Fusion, Users};
use crate::{DType, Graph, Op, ValueId};

/// The rule at every roundable op it matches (run on the fused program, where the ops the
/// `widened` rule retyped read their stored operands and `shared` has merged repeated casts).
pub(super) fn rounded_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    let mut fusions = Vec::new();
    for node in graph.node_indices() {
        let Some(op) = op_of(graph, node).filter(|op| op.roundable()) else {
            continue;
        };
        let Some(ports) = graph.node(node).map(|n| n.outputs.len()) else {
            continue;
        };
        let operands = graph.operands(node);
        let Some(types) = (operands.iter())
            .map(|v| graph.value_type(*v).ok().cloned())
            .collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        let rounds = op.rounded_results();
        let value = |port| ValueId { node, port };
        // Each result the op rounds is read by its cast alone (or where it is rounded on
        // entry); the others stay as they are.
        let alone: Option<Vec<(ValueId, Vec<NodeIndex>)>> = (0..ports)
            .map(|port| match rounds.contains(&port) {
                true => rounding_cast(graph, users, value(port)),
                false => Some((value(port), Vec::new())),
            })
            .collect();
        // A product rounds from bf16 operands alone (the type rule's condition).
        let rounded = Op::Rounded(Box::new(op.clone()));
        if let Some(casts) = alone.filter(|_| rounded.infer(&types).is_ok()) {
            let nodes = casts.iter().flat_map(|(_, n)| n.iter().copied());
            fusions.push(Fusion {
                at: node,
                replaced: std::iter::once(node).chain(nodes).collect(),
                op: rounded,
                operands,
                ends: casts.into_iter().map(|(cast, _)| cast).collect(),
            });
            continue;
        }
        // Otherwise, where each result it rounds is also read by a cast of its own, the op
        // writes the rounded copies beside its results.
        let also = Op::AlsoRounded(Box::new(op.clone()));
        let copies: Option<Vec<(ValueId, Vec<NodeIndex>)>> = (rounds.iter())
            .map(|&port| cast_among_readers(graph, users, value(port)))
            .collect();
        let Some(copies) = copies.filter(|_| also.infer(&types).is_ok()) else {
            continue;
        };
        let nodes = copies.iter().flat_map(|(_, n)| n.iter().copied());
        fusions.push(Fusion {
            at: node,
            replaced: std::iter::once(node).chain(nodes).collect(),
            op: also,
            operands,
            ends: (0..ports)
                .map(value)
                .chain(copies.iter().map(|(cast, _)| *cast))
                .collect(),
        });
    }
    fusions
}

/// Among the readers of f32 `value`, directly or through reshapes, the first `Cast{bf16}` of
/// it (in node order, depth first), and the node it replaces: the cast (reshapes it leaves
/// unread are dropped as dead).
fn cast_among_readers(
    graph: &Graph,
    users: &Users,
    value: ValueId,
) -> Option<(ValueId, Vec<NodeIndex>)> {
    if !of_dtype(graph, value, DType::F32) {
        return None;
    }
    users.get(&value)?.iter().flatten().find_map(|&reader| {
        let cast = ValueId {
            node: reader,
            port: 0,
        };
        match op_of(graph, reader)? {
            Op::Cast { to: DType::BF16 } => Some((cast, vec![reader])),
            Op::Reshape { .. } => cast_among_readers(graph, users, cast),
            _ => None,
        }
    })
}

/// The `Cast{bf16}` that alone reads f32 `value` (through reshapes, each read by the next
/// alone) and the nodes it replaces: the cast's value and [reshapes,] cast; or `value` itself
/// and no node where only ports that round it on entry read it ([`Op::rounded_on_entry`]).
fn rounding_cast(
    graph: &Graph,
    users: &Users,
    value: ValueId,
) -> Option<(ValueId, Vec<NodeIndex>)> {
    if !of_dtype(graph, value, DType::F32) {
        return None;
    }
    if read_rounded_only(graph, users, value) {
        return Some((value, Vec::new()));
    }
    let reader = users.get(&value)?.as_slice();
    let &[Some(mut reader)] = reader else {
        return None;
    };
    let mut nodes = Vec::new();
    while let Some(Op::Reshape { .. }) = op_of(graph, reader) {
        let view = ValueId {
            node: reader,
            port: 0,
        };
        nodes.push(reader);
        let &[Some(next)] = users.get(&view)?.as_slice() else {
            return None;
        };
        reader = next;
    }
    let Some(Op::Cast { to: DType::BF16 }) = op_of(graph, reader) else {
        return None;
    };
    nodes.push(reader);
    Some((
        ValueId {
            node: reader,
            port: 0,
        },
        nodes,
    ))
}

/// Whether `value` has readers, each an op reading it only at ports that round it on entry,
/// or a reshape whose view is read so (no output or write is `value` or such a view).
fn read_rounded_only(graph: &Graph, users: &Users, value: ValueId) -> bool {
    users.get(&value).is_some_and(|readers| {
        readers.iter().all(|reader| {
            reader.is_some_and(|node| match op_of(graph, node) {
                Some(Op::Reshape { .. }) => {
                    read_rounded_only(graph, users, ValueId { node, port: 0 })
                }
                Some(op) => (graph.operands(node).iter().enumerate())
                    .all(|(port, v)| *v != value || op.rounded_on_entry().contains(&port)),
                None => false,
            })
        })
    })
}
