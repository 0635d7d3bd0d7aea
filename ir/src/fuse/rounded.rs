//! The `rounded_matmul` rule (see the pass's module doc): a product of bf16 operands rounded
//! to bf16 at once — `Cast{bf16}` of a `MatMul` read by that cast alone — is one
//! [`Op::RoundedMatMul`]: the GEMM writes the rounded product, the f32 one never exists.

use std::collections::BTreeSet;

use petgraph::graph::NodeIndex;

use super::{of_dtype, only_read_by, op_of, Fusion, Users};
use crate::{DType, Graph, Op, ValueId};

/// The rule at every cast it matches whose product no other fusion has taken (`taken`).
pub(super) fn rounded_matmul_fusions(
    graph: &Graph,
    users: &Users,
    taken: &BTreeSet<NodeIndex>,
) -> Vec<Fusion> {
    let mut fusions = Vec::new();
    for node in graph.node_indices() {
        let Some(Op::Cast { to: DType::BF16 }) = op_of(graph, node) else {
            continue;
        };
        let product = graph.operands(node)[0];
        let Some(&Op::MatMul {
            transpose_a,
            transpose_b,
        }) = op_of(graph, product.node)
        else {
            continue;
        };
        let operands = graph.operands(product.node);
        let bf16 = operands.iter().all(|v| of_dtype(graph, *v, DType::BF16));
        if bf16 && only_read_by(users, product, node) && !taken.contains(&product.node) {
            fusions.push(Fusion {
                at: product.node,
                replaced: vec![product.node, node],
                op: Op::RoundedMatMul {
                    transpose_a,
                    transpose_b,
                },
                operands: operands.to_vec(),
                ends: vec![ValueId { node, port: 0 }],
            });
        }
    }
    fusions
}
