//! The `views` rule (see the pass's module doc): a `Contiguous` of a view that moves no element
//! of a dense value is that value, or a reshape of it.

use std::collections::BTreeMap;

use petgraph::graph::NodeIndex;

use super::{op_of, through_reshapes};
use crate::{Graph, Op, ValueId};

/// What the `views` rule makes of a `Contiguous` node (the `shared` rule of a repeat, the
/// `round_trip` rule of a cast).
pub(super) enum ViewRewrite {
    /// The dense value viewed as the contiguous result's shape.
    Reshape(ValueId),
    /// The value itself: the dense value, or the earlier result the repeat stands for.
    Same(ValueId),
}

/// Whether `value` is dense row-major: the result of a non-view op or an input, or a reshape
/// of one.
pub(super) fn is_dense(graph: &Graph, value: ValueId) -> bool {
    let root = through_reshapes(graph, value);
    !matches!(
        op_of(graph, root.node),
        Some(Op::Transpose { .. } | Op::Slice { .. })
    )
}

/// The `views` rule at every `Contiguous` it matches.
pub(super) fn view_rewrites(graph: &Graph) -> BTreeMap<NodeIndex, ViewRewrite> {
    let mut rewrites = BTreeMap::new();
    for node in graph.node_indices() {
        let Some(Op::Contiguous) = op_of(graph, node) else {
            continue;
        };
        let view = graph.operands(node)[0];
        let Some(source) = graph.operands(view.node).first().copied() else {
            continue;
        };
        let Ok(dims) = graph.value_type(source).map(|t| t.dims().to_vec()) else {
            continue;
        };
        if !is_dense(graph, source) {
            continue;
        }
        match op_of(graph, view.node) {
            Some(&Op::Transpose { dim0, dim1 }) => {
                let (i, j) = (dim0.min(dim1), dim0.max(dim1));
                // The non-unit dims keep their order: one of the two is 1, and so is every
                // dim the other passes.
                let unit = |d: usize| dims.get(d) == Some(&1);
                if (unit(i) || unit(j)) && (i + 1..j).all(unit) {
                    rewrites.insert(node, ViewRewrite::Reshape(source));
                }
            }
            Some(&Op::Slice { axis, start, end }) if start == 0 && dims.get(axis) == Some(&end) => {
                rewrites.insert(node, ViewRewrite::Same(source));
            }
            _ => {}
        }
    }
    rewrites
}
