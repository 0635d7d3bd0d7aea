//! The `round_trip` rule (see the pass's module doc): `Cast{bf16}` of a dense bf16 value
//! widened by `Cast{f32}` (through reshapes) is that bf16 value, viewed as the cast's shape:
//! widening is exact, so rounding back gives the same value (the same bits but for a NaN's
//! payload). Mixed precision's backward makes such pairs where a rounded value's gradient is
//! rounded for a GEMM (SwiGLU's rounded gate and up).

use std::collections::BTreeMap;

use petgraph::graph::NodeIndex;

use super::views::{is_dense, ViewRewrite};
use super::{of_dtype, op_of, through_reshapes};
use crate::{DType, Graph, Op};

/// The `round_trip` rule at every `Cast{bf16}` it matches.
pub(super) fn round_trip_rewrites(graph: &Graph) -> BTreeMap<NodeIndex, ViewRewrite> {
    let mut rewrites = BTreeMap::new();
    for node in graph.node_indices() {
        let Some(Op::Cast { to: DType::BF16 }) = op_of(graph, node) else {
            continue;
        };
        let widened = through_reshapes(graph, graph.operands(node)[0]);
        let Some(Op::Cast { to: DType::F32 }) = op_of(graph, widened.node) else {
            continue;
        };
        let stored = graph.operands(widened.node)[0];
        // A view that moves elements (a transpose, a slice) stays behind its copy.
        if !of_dtype(graph, stored, DType::BF16) || !is_dense(graph, stored) {
            continue;
        }
        let same_shape = (graph.value_type(stored).ok())
            .zip(graph.node(node).and_then(|n| n.outputs.first()))
            .is_some_and(|(a, b)| a.shape == b.shape);
        let rewrite = match same_shape {
            true => ViewRewrite::Same(stored),
            false => ViewRewrite::Reshape(stored),
        };
        rewrites.insert(node, rewrite);
    }
    rewrites
}
