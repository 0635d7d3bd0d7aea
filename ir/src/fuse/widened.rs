//! The `widened` rule (see the pass's module doc): an operand an op may take stored in bf16
//! ([`Op::stored_operands`]) that is `Cast{f32}` of a bf16 value, the cast read by that op
//! alone or only ever as a stored operand (SwiGLU and its backward reading one rounded gate),
//! is the bf16 value, widened exactly as the op reads it: the f32 copy never exists. The
//! operand may be reshapes of the cast, each read by the next alone and the last by that op
//! alone: the first reshape then views the bf16 value.

use std::collections::BTreeSet;

use petgraph::graph::NodeIndex;

use super::{of_dtype, only_read_by, op_of, Fusion, Users};
use crate::{DType, Graph, Op, TensorType, ValueId};

/// The rule at every op it matches that no other fusion has taken (`taken`).
pub(super) fn widened_fusions(
    graph: &Graph,
    users: &Users,
    taken: &BTreeSet<NodeIndex>,
) -> Vec<Fusion> {
    let mut fusions = Vec::new();
    for node in graph.node_indices() {
        let Some(op) = op_of(graph, node) else {
            continue;
        };
        let f32_op = (graph.operands(node).get(op.compute_operand()))
            .is_some_and(|v| of_dtype(graph, *v, DType::F32));
        if taken.contains(&node) || !f32_op {
            continue;
        }
        let mut operands = graph.operands(node);
        let Some(mut types) = (operands.iter())
            .map(|v| graph.value_type(*v).ok().cloned())
            .collect::<Option<Vec<TensorType>>>()
        else {
            continue;
        };
        let (mut direct, mut viewed) = (Vec::new(), Vec::new());
        let mut rewritten = false;
        for &port in op.stored_operands() {
            let Some(&operand) = operands.get(port) else {
                continue;
            };
            // The operand may be reshapes of the cast, each read by the next alone: the first
            // then views the bf16 value instead.
            let mut chain = vec![node];
            let mut widened = operand;
            while let Some(Op::Reshape { .. }) = op_of(graph, widened.node) {
                chain.push(widened.node);
                widened = graph.operands(widened.node)[0];
            }
            let view = chain.len() > 1;
            let Some(Op::Cast { to: DType::F32 }) = op_of(graph, widened.node) else {
                continue;
            };
            let stored = graph.operands(widened.node)[0];
            let first_view = ValueId {
                node: chain[chain.len() - 1],
                port: 0,
            };
            let alone = only_read_by(users, widened, chain[chain.len() - 1])
                && (chain.windows(2)).all(|pair| {
                    let link = ValueId {
                        node: pair[1],
                        port: 0,
                    };
                    only_read_by(users, link, pair[0])
                });
            // A cast that several ops read, each as a stored operand, dies once each of them
            // reads the bf16 value (dropped as dead then, so no fusion replaces it).
            let shared = !view && !alone && read_stored_only(graph, users, widened);
            if !of_dtype(graph, stored, DType::BF16) || !(alone || shared) {
                continue;
            }
            let Ok(read) = TensorType::new(DType::BF16, types[port].dims().to_vec()) else {
                continue;
            };
            types[port] = read;
            match view {
                true => viewed.push((first_view, widened.node, stored)),
                false => {
                    operands[port] = stored;
                    direct.extend(alone.then_some(widened.node));
                    rewritten = true;
                }
            }
        }
        // The op must type the same with its operands read stored.
        let results = graph.node(node).map(|n| n.outputs.clone());
        if (!rewritten && viewed.is_empty()) || op.infer(&types).ok() != results {
            continue;
        }
        for (view, cast, stored) in viewed {
            let Some(reshape) = op_of(graph, view.node) else {
                continue;
            };
            fusions.push(Fusion {
                at: view.node,
                replaced: vec![cast, view.node],
                op: reshape.clone(),
                operands: vec![stored],
                ends: vec![view],
            });
        }
        if rewritten {
            direct.push(node);
            let results = results.map_or(0, |r| r.len());
            fusions.push(Fusion {
                at: node,
                replaced: direct,
                op: op.clone(),
                operands,
                ends: (0..results).map(|port| ValueId { node, port }).collect(),
            });
        }
    }
    fusions
}

/// Whether every reader of `value` reads it only at ports it may take stored in bf16 (and no
/// output or write is `value`).
fn read_stored_only(graph: &Graph, users: &Users, value: ValueId) -> bool {
    users.get(&value).is_some_and(|readers| {
        readers.iter().all(|reader| {
            reader.is_some_and(|node| {
                op_of(graph, node).is_some_and(|op| {
                    (graph.operands(node).iter().enumerate())
                        .all(|(port, v)| *v != value || op.stored_operands().contains(&port))
                })
            })
        })
    })
}
