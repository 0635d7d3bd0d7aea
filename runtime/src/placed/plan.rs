//! A plan read against its graph, as every backend reads it before anything runs: which buffer
//! holds each value (`value_buffers`, checked: every value in exactly one existing buffer) and
//! whether the schedule runs every op node once. A mismatch is an error naming the step, buffer
//! or value ([`plan_error`]); nothing here panics on a bad plan.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::graph::NodeKind;
use kiln_ir::{Graph, ValueId};
use kiln_planner::{Buffer, Plan};
use petgraph::stable_graph::NodeIndex;

use crate::error::{Error, Result};

/// An IR value as plans name it: (node index, output port).
pub(crate) type Value = (usize, usize);

/// An error about the plan: `what` names the step, buffer or value at fault.
pub(crate) fn plan_error(plan: &Plan, what: impl std::fmt::Display, reason: String) -> Error {
    Error::Graph {
        what: format!("plan `{}`: {what}", plan.program),
        reason,
    }
}

/// How errors name a buffer.
pub(crate) fn describe(buffer: &Buffer) -> String {
    format!("buffer {} (`{}`)", buffer.id, buffer.name)
}

/// `value_buffers` checked and parsed: every value of the graph in exactly one existing buffer.
pub(crate) fn map_values(graph: &Graph, plan: &Plan) -> Result<BTreeMap<Value, usize>> {
    if let Some((index, buffer)) = plan.buffers.iter().enumerate().find(|(i, b)| b.id != *i) {
        let reason = format!("is at index {index}; buffer ids must be their index");
        return Err(plan_error(plan, describe(buffer), reason));
    }
    let mut buffer_of = BTreeMap::new();
    for (text, buffer) in &plan.value_buffers {
        let what = format!("value `{text}`");
        let value = parse(text).filter(|&(node, port)| {
            graph
                .value_type(ValueId {
                    node: NodeIndex::new(node),
                    port,
                })
                .is_ok()
        });
        let Some(value) = value else {
            return Err(plan_error(
                plan,
                what,
                "is not a value of the graph".to_string(),
            ));
        };
        if *buffer >= plan.buffers.len() {
            let reason = format!("is in buffer {buffer}, of {}", plan.buffers.len());
            return Err(plan_error(plan, what, reason));
        }
        if buffer_of.insert(value, *buffer).is_some() {
            return Err(plan_error(plan, what, "is listed twice".to_string()));
        }
    }
    for node in graph.node_indices() {
        let outputs = graph.node(node).map_or(0, |n| n.outputs.len());
        for port in 0..outputs {
            if !buffer_of.contains_key(&(node.index(), port)) {
                let what = format!("value {}.{port}", node.index());
                return Err(plan_error(plan, what, "has no buffer".to_string()));
            }
        }
    }
    Ok(buffer_of)
}

/// `"node.port"` as a value, if it has that form.
fn parse(text: &str) -> Option<Value> {
    let (node, port) = text.split_once('.')?;
    Some((node.parse().ok()?, port.parse().ok()?))
}

/// Every step runs an op node of the graph, with that op's text, and every op node runs once.
/// (Whether operands are computed before they are read is checked as the steps run.)
pub(crate) fn check_schedule(graph: &Graph, plan: &Plan) -> Result<()> {
    let mut ran = BTreeSet::new();
    for (index, step) in plan.schedule.iter().enumerate() {
        let what = format!("step {index}");
        let op = match graph.node(NodeIndex::new(step.node)).map(|n| &n.kind) {
            Some(NodeKind::Op(op)) => op,
            Some(NodeKind::Input { name, .. }) => {
                let reason = format!("runs node %{}, the input `{name}`", step.node);
                return Err(plan_error(plan, what, reason));
            }
            None => {
                let reason = format!("runs node %{}, which the graph does not have", step.node);
                return Err(plan_error(plan, what, reason));
            }
        };
        if step.op != op.to_string() {
            let reason = format!("says `{}` but node %{} is `{op}`", step.op, step.node);
            return Err(plan_error(plan, what, reason));
        }
        if !ran.insert(step.node) {
            let reason = format!("runs node %{} a second time", step.node);
            return Err(plan_error(plan, what, reason));
        }
    }
    for node in graph.node_indices() {
        let is_op = matches!(graph.node(node).map(|n| &n.kind), Some(NodeKind::Op(_)));
        if is_op && !ran.contains(&node.index()) {
            let what = format!("node %{}", node.index());
            return Err(plan_error(
                plan,
                what,
                "is an op that no step runs".to_string(),
            ));
        }
    }
    Ok(())
}
