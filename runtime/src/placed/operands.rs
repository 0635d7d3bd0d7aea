//! What one schedule step reads, as every backend reads it: its op, the layouts of its operands
//! (from the layouts of the values computed so far) and the types of its results.

use std::collections::BTreeMap;

use kiln_ir::graph::NodeKind;
use kiln_ir::{Graph, Op, TensorType};
use kiln_planner::Plan;
use petgraph::stable_graph::NodeIndex;

use super::{plan_error, Value, ValueLayout};
use crate::error::Result;
use crate::interpret::result_types;

/// What the steps so far computed: the layout of every value available (inputs and the results
/// of steps that ran).
pub(crate) type Layouts = BTreeMap<Value, ValueLayout>;

/// Step `index` of a plan as every executor reads it: its op, its operands' layouts (from the
/// layouts of the values computed so far) and its results' types.
pub(crate) struct StepOperands<'g> {
    pub node: usize,
    pub op: &'g Op,
    pub operands: Vec<(Value, ValueLayout)>,
    pub types: Vec<TensorType>,
}

impl<'g> StepOperands<'g> {
    /// Reads step `index`; an op node that is missing, or an operand not yet computed, is an
    /// error naming the step.
    pub(crate) fn read(
        graph: &'g Graph,
        plan: &Plan,
        layouts: &Layouts,
        index: usize,
    ) -> Result<Self> {
        let node_index = plan.schedule[index].node;
        let node = NodeIndex::new(node_index);
        let Some(NodeKind::Op(op)) = graph.node(node).map(|n| &n.kind) else {
            let reason = "runs no op".to_string();
            return Err(plan_error(plan, format!("step {index}"), reason));
        };
        let what = || format!("step {index} (node %{node_index} {op})");
        let mut operands: Vec<(Value, ValueLayout)> = Vec::new();
        for (port, operand) in graph.operands(node).iter().enumerate() {
            let value = (operand.node.index(), operand.port);
            let layout = layouts.get(&value).ok_or_else(|| {
                let reason = format!(
                    "reads operand {port}, value {}.{}, before the step that computes it",
                    value.0, value.1
                );
                plan_error(plan, what(), reason)
            })?;
            operands.push((value, layout.clone()));
        }
        let operand_types: Vec<TensorType> = operands.iter().map(|(_, l)| l.ty()).collect();
        let recorded = graph.node(node).map_or(&[][..], |n| &n.outputs[..]);
        let types = result_types(node_index, op, &operand_types, recorded)?;
        Ok(StepOperands {
            node: node_index,
            op,
            operands,
            types,
        })
    }
}
