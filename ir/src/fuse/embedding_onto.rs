//! The `embedding_onto` rule (see the pass's module doc): an `Add` of an `EmbeddingBackward`'s
//! gradient, read by that add alone, and a term of the same shape — a tied embedding's
//! gradient, the LM head's plus the embedding's — is one `EmbeddingBackward { onto: true }`
//! onto the term: the scatter's table is the term to begin with, and no add reads and writes
//! the `[V,H]` table again. Addition is commutative, so either operand may be the scatter.

use super::{only_read_by, op_of, takes, Fusion, Users};
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
            if !takes(graph, &op, &fused) {
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

#[cfg(test)]
mod tests {
    use crate::fuse::ops_with_operands;
    use crate::graph::NodeKind;
    use crate::{fuse, DType, Graph, InputKind, Op, TensorType};

    /// A tied embedding's gradient: the scatter of `grad` added to the LM head's bf16 gradient
    /// (widened by a cast), the scatter first or second; `keep` also outputs the scatter.
    fn tied(scatter_first: bool, keep: bool) -> Graph {
        let ty = |dtype, dims: &[usize]| TensorType::new(dtype, dims).unwrap();
        let mut g = Graph::new("tied");
        let ids = g.input("ids", InputKind::Input, ty(DType::I64, &[2, 3]));
        let grad = g.input("grad", InputKind::Input, ty(DType::F32, &[2, 3, 4]));
        let head = g.input("head", InputKind::Input, ty(DType::BF16, &[7, 4]));
        let (ids, grad, head) = (ids.unwrap(), grad.unwrap(), head.unwrap());
        let op = Op::EmbeddingBackward {
            vocab: 7,
            onto: false,
        };
        let scatter = g.op1(op, &[ids, grad]).unwrap();
        let widened = g.op1(Op::Cast { to: DType::F32 }, &[head]).unwrap();
        let terms = match scatter_first {
            true => [scatter, widened],
            false => [widened, scatter],
        };
        let sum = g.op1(Op::Add, &terms).unwrap();
        g.output("grad.embed", sum).unwrap();
        if keep {
            g.output("scatter", scatter).unwrap();
        }
        g
    }

    #[test]
    fn the_scatter_goes_onto_the_lm_heads_gradient_in_either_order() {
        let onto = Op::EmbeddingBackward {
            vocab: 7,
            onto: true,
        };
        for scatter_first in [true, false] {
            let fused = fuse(&tied(scatter_first, false)).unwrap();
            crate::verify(&fused).unwrap();
            let ops = ops_with_operands(&fused);
            let (op, operands) = ops.last().unwrap();
            assert_eq!(*op, onto, "{ops:?}");
            let out = fused.outputs()[0].1;
            let kind = &fused.node(out.node).unwrap().kind;
            assert!(matches!(kind, NodeKind::Op(op) if *op == onto), "{kind:?}");
            // Either term of the add is a stored operand: `widened` read the head's gradient
            // as bf16 first, so the base is the bf16 gradient itself (no cast, no add).
            assert_eq!(ops.len(), 1, "{ops:?}");
            assert_eq!(Some(operands[2]), fused.input_named("head"));
            assert_eq!(fused.value_type(operands[2]).unwrap().dtype, DType::BF16);
        }
    }

    #[test]
    fn a_scatter_read_elsewhere_stays_a_scatter() {
        let fused = fuse(&tied(true, true)).unwrap();
        let names: Vec<&str> = ops_with_operands(&fused)
            .iter()
            .map(|(op, _)| op.name())
            .collect();
        assert!(names.contains(&"add"), "{names:?}");
        assert!(ops_with_operands(&fused)
            .iter()
            .all(|(op, _)| !matches!(op, Op::EmbeddingBackward { onto: true, .. })));
    }
}
