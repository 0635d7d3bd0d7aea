//! The `adamw_copy` rule (see the pass's module doc): an `AdamW` whose new param is rounded
//! into its persistent bf16 copy by a `CastInto` is one [`Op::AdamWCopy`], which writes the
//! copy as it writes the param: one pass over the param, one launch instead of two.

use std::collections::BTreeSet;

use super::{of_dtype, op_of, Fusion};
use crate::{DType, Graph, Op, ValueId};

/// `fusions` with the rule applied at every `CastInto` it matches: a `widened` update takes
/// the copy too; an update no other fusion has taken becomes a fusion of its own.
pub(super) fn with_copies(graph: &Graph, mut fusions: Vec<Fusion>) -> Vec<Fusion> {
    let taken: BTreeSet<_> = fusions.iter().flat_map(|f| f.replaced.clone()).collect();
    for node in graph.node_indices() {
        let Some(Op::CastInto) = op_of(graph, node) else {
            continue;
        };
        let &[copy, updated] = graph.operands(node).as_slice() else {
            continue;
        };
        let Some(&Op::AdamW(config)) = op_of(graph, updated.node) else {
            continue;
        };
        if updated.port != 0 || !of_dtype(graph, copy, DType::BF16) {
            continue;
        }
        let update = updated.node;
        let at = fusions.iter().position(|f| f.at == update);
        let fusion = match at {
            Some(at) if matches!(fusions[at].op, Op::AdamW(_)) => &mut fusions[at],
            Some(_) => continue,
            None if taken.contains(&update) => continue,
            None => {
                let operands = graph.operands(update);
                fusions.push(Fusion {
                    at: update,
                    replaced: vec![update],
                    op: Op::AdamW(config),
                    operands,
                    ends: (0..3).map(|port| ValueId { node: update, port }).collect(),
                });
                fusions.last_mut().expect("just pushed")
            }
        };
        fusion.op = Op::AdamWCopy(config);
        fusion.operands.insert(4, copy);
        fusion.replaced.push(node);
        fusion.ends.push(ValueId { node, port: 0 });
    }
    fusions
}
