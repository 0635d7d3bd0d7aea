//! The rules of mixed precision's rounded gradients (see the pass's module doc):
//! - `rounded_matmul`: a product of bf16 operands rounded to bf16 at once — `Cast{bf16}` of a
//!   `MatMul` read by that cast alone — is one [`Op::RoundedMatMul`]: the GEMM writes the
//!   rounded product, the f32 one never exists;
//! - `bf16_grad`: an `AdamW` whose gradient is `Cast{f32}` of a bf16 value, read by it alone,
//!   reads the bf16 value (a stored operand, widened as read): the f32 copy never exists.

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

/// The `bf16_grad` rule at every AdamW it matches.
pub(super) fn bf16_grad_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    let mut fusions = Vec::new();
    for node in graph.node_indices() {
        let Some(op @ Op::AdamW(_)) = op_of(graph, node) else {
            continue;
        };
        let mut operands = graph.operands(node);
        let Some(&widened) = operands.get(1) else {
            continue;
        };
        let Some(Op::Cast { to: DType::F32 }) = op_of(graph, widened.node) else {
            continue;
        };
        let rounded = graph.operands(widened.node)[0];
        if of_dtype(graph, rounded, DType::BF16) && only_read_by(users, widened, node) {
            operands[1] = rounded;
            let results = graph.node(node).map_or(0, |n| n.outputs.len());
            fusions.push(Fusion {
                at: node,
                replaced: vec![widened.node, node],
                op: op.clone(),
                operands,
                ends: (0..results).map(|port| ValueId { node, port }).collect(),
            });
        }
    }
    fusions
}
