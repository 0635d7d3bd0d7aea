//! The `shared` rule (see the pass's module doc): an op that repeats an earlier one — the same
//! op on the same operands, once the repeats among those operands are merged too — is that
//! earlier op's result. Only ops that write nothing in place (every result fresh or a view)
//! and have one result are merged; their results are functions of their operands alone.

use std::collections::BTreeMap;

use petgraph::graph::NodeIndex;

use super::op_of;
use super::views::ViewRewrite;
use crate::op::Alias;
use crate::{Graph, Op, ValueId};

/// Every repeated op, as the earlier result that stands for it.
pub(super) fn shared_rewrites(graph: &Graph) -> BTreeMap<NodeIndex, ViewRewrite> {
    let mut rewrites = BTreeMap::new();
    // The value each merged result stands for.
    let mut same: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    // First occurrences by (merged) operands; ops hold floats, so they are compared, not keyed.
    let mut seen: BTreeMap<Vec<ValueId>, Vec<(&Op, ValueId)>> = BTreeMap::new();
    for node in graph.node_indices() {
        let Some(op) = op_of(graph, node) else {
            continue;
        };
        let results = graph.node(node).map_or(0, |n| n.outputs.len());
        if results != 1 || !matches!(op.alias(0), Alias::Fresh | Alias::ViewOf(_)) {
            continue;
        }
        let operands: Vec<ValueId> = (graph.operands(node).iter())
            .map(|v| same.get(v).copied().unwrap_or(*v))
            .collect();
        let result = ValueId { node, port: 0 };
        let earlier = seen.entry(operands).or_default();
        match earlier.iter().find(|(o, _)| *o == op) {
            Some(&(_, first)) => {
                same.insert(result, first);
                rewrites.insert(node, ViewRewrite::Same(first));
            }
            None => earlier.push((op, result)),
        }
    }
    rewrites
}
