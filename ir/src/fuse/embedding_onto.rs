//! The `embedding_onto` rule (see the pass's module doc): an `Add` of an `EmbeddingBackward`'s
//! gradient, read by that add alone, and a term of the same shape — a tied embedding's
//! gradient, the LM head's plus the embedding's — is one `EmbeddingBackward { onto: true }`
//! onto the term: the scatter's table is the term to begin with, and no add reads and writes
//! the `[V,H]` table again. Addition is commutative, so either operand may be the scatter.

use super::{only_read_by, op_of, Fusion, Users};
use crate::{Graph, Op, ValueId};

/// The rule at every add it matches.
pub(super) fn embedding_onto_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    let mut fusions = Vec::new();
    for node in graph.node_indices() {
        let Some(Op::Add) = op_of(graph, node) else {
            continue;
        };
        let operands = graph.operands(node);
        for (scatter, base) in [(operands[0], operands[1]), (operands[1], operands[0])] {
            let Some(&Op::EmbeddingBackward { vocab, onto: false }) = op_of(graph, scatter.node)
            else {
                continue;
            };
            if !only_read_by(users, scatter, node) {
                continue;
            }
            let mut fused = graph.operands(scatter.node);
            fused.push(base);
            // The base is the whole table, of the scatter's dtype or stored in bf16.
            let op = Op::EmbeddingBackward { vocab, onto: true };
            let types: Option<Vec<_>> = (fused.iter())
                .map(|v| graph.value_type(*v).ok().cloned())
                .collect();
            if types.is_none_or(|t| op.infer(&t).is_err()) {
                continue;
            }
            fusions.push(Fusion {
                at: node,
                replaced: vec![scatter.node, node],
                op,
                operands: fused,
                ends: vec![ValueId { node, port: 0 }],
            });
            break;
        }
    }
    fusions
}
