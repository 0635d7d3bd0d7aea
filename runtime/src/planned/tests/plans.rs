//! Hand-made plans for the executor tests: the test says which values share which buffer and
//! where each arena buffer sits; the rest (serial schedule in node order, sizes, lifetimes,
//! uses, arena size, lower bound) is worked out here the way the plan verifier recomputes it,
//! so a test can check its plan with `verify_plan` before running it.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::graph::NodeKind;
use kiln_ir::{Graph, ValueId};
use kiln_planner::{Buffer, BufferClass, Plan, PlanOptions, Step, WorkspaceNeeds};

use crate::workspaces::Workspaces;

/// Alignment of the test plans' arena offsets.
pub const ALIGN: u64 = 256;

/// What a test says about one buffer.
pub struct Spec {
    class: Option<BufferClass>,
    offset: Option<u64>,
    values: Vec<ValueId>,
    /// For a workspace: a result of the op it serves.
    workspace_of: Option<ValueId>,
}

/// The buffer of the input `values[0]` (its kind's class), with any in-place results after it.
pub fn bound(values: &[ValueId]) -> Spec {
    Spec {
        class: None,
        offset: None,
        values: values.to_vec(),
        workspace_of: None,
    }
}

/// An output buffer holding `values`.
pub fn output(values: &[ValueId]) -> Spec {
    Spec {
        class: Some(BufferClass::Output),
        ..bound(values)
    }
}

/// An activation at arena byte `offset` holding `values`.
pub fn arena(offset: u64, values: &[ValueId]) -> Spec {
    Spec {
        class: Some(BufferClass::Activation),
        offset: Some(offset),
        ..bound(values)
    }
}

/// The workspace of the op that produced `result`, at arena byte `offset`.
pub fn workspace(offset: u64, result: ValueId) -> Spec {
    Spec {
        class: Some(BufferClass::Workspace),
        offset: Some(offset),
        values: Vec::new(),
        workspace_of: Some(result),
    }
}

fn key(value: ValueId) -> (usize, usize) {
    (value.node.index(), value.port)
}

/// The plan of `graph` with the buffers `specs` (every value must be in one of them).
pub fn make_plan(graph: &Graph, specs: &[Spec]) -> Plan {
    let mut schedule = Vec::new();
    let mut step_of = BTreeMap::new();
    let mut inputs = BTreeMap::new();
    for node in graph.node_indices() {
        match &graph.node(node).unwrap().kind {
            NodeKind::Op(op) => {
                step_of.insert(node.index(), schedule.len());
                schedule.push(Step {
                    node: node.index(),
                    op: op.to_string(),
                    stream: 0,
                    waits: vec![],
                    records: vec![],
                });
            }
            NodeKind::Input { name, kind } => {
                inputs.insert(node.index(), (name.clone(), *kind));
            }
        }
    }
    let last = schedule.len().saturating_sub(1);
    let written: BTreeSet<&str> = graph.writes().iter().map(|(n, _)| n.as_str()).collect();
    let mut kept: BTreeSet<(usize, usize)> = (graph.outputs().iter().chain(graph.writes()))
        .map(|(_, v)| key(*v))
        .collect();
    for (node, (name, kind)) in &inputs {
        if kind.is_persistent() && !written.contains(name.as_str()) {
            kept.insert((*node, 0));
        }
    }
    // Steps that read each value.
    let mut readers: BTreeMap<(usize, usize), Vec<usize>> = BTreeMap::new();
    for (&node, &step) in &step_of {
        let index = graph.node_indices().find(|n| n.index() == node).unwrap();
        for operand in graph.operands(index) {
            readers.entry(key(operand)).or_default().push(step);
        }
    }

    let mut buffers = Vec::new();
    let mut value_buffers = Vec::new();
    for (id, spec) in specs.iter().enumerate() {
        let values: Vec<(usize, usize)> = spec.values.iter().map(|v| key(*v)).collect();
        let class = spec.class.unwrap_or_else(|| match inputs[&values[0].0].1 {
            kiln_ir::InputKind::Param => BufferClass::Param,
            kiln_ir::InputKind::Input => BufferClass::Input,
            kiln_ir::InputKind::State => BufferClass::State,
        });
        let bytes = |v: &ValueId| graph.value_type(*v).unwrap().size_bytes() as u64;
        let (size, start, end) = match spec.workspace_of {
            Some(result) => {
                let node = graph.node_indices().find(|n| *n == result.node).unwrap();
                let NodeKind::Op(op) = &graph.node(node).unwrap().kind else {
                    panic!("a workspace serves an op");
                };
                let types: Vec<_> = (graph.operands(node).iter())
                    .map(|v| graph.value_type(*v).unwrap().clone())
                    .collect();
                let step = step_of[&node.index()];
                (Workspaces::Any.workspace_bytes(op, &types), step, step)
            }
            None => {
                let size = spec.values.iter().map(bytes).max().unwrap_or(0);
                let mut touched: Vec<usize> = Vec::new();
                for value in &values {
                    touched.push(step_of.get(&value.0).copied().unwrap_or(0));
                    touched.extend(readers.get(value).into_iter().flatten());
                    if kept.contains(value) {
                        touched.push(last);
                    }
                }
                let start = *touched.iter().min().unwrap();
                (size, start, *touched.iter().max().unwrap())
            }
        };
        let uses = values
            .iter()
            .map(|v| readers.get(v).map_or(0, Vec::len))
            .sum();
        buffers.push(Buffer {
            id,
            name: format!("buffer {id}"),
            class,
            size,
            offset: spec.offset,
            start,
            end,
            stream: 0,
            values: values.iter().map(|(n, p)| format!("{n}.{p}")).collect(),
            uses,
        });
        value_buffers.extend(values.iter().map(|v| (*v, id)));
    }
    value_buffers.sort();
    let mut plan = Plan {
        program: graph.name().to_string(),
        options: PlanOptions {
            streams: 1,
            alignment: ALIGN,
        },
        schedule,
        buffers,
        value_buffers: (value_buffers.into_iter())
            .map(|((n, p), b)| (format!("{n}.{p}"), b))
            .collect(),
        arena_bytes: 0,
        lower_bound_bytes: 0,
        schedule_strategy: "node order".to_string(),
        offset_strategy: "by hand".to_string(),
        offset_candidates: vec![],
        events: 0,
        in_place_writes: Vec::new(),
        recomputed: Vec::new(),
        communication_stream: None,
        hash: "test".to_string(),
    };
    settle_arena(&mut plan);
    plan
}

/// Sets `lower_bound_bytes` (the peak of live arena bytes) and `arena_bytes` (the end of the
/// last arena buffer, and at least the lower bound) from the buffers.
pub fn settle_arena(plan: &mut Plan) {
    let arena: Vec<&Buffer> = plan.buffers.iter().filter(|b| b.offset.is_some()).collect();
    let round = |size: u64| size.div_ceil(ALIGN) * ALIGN;
    let live = |step: usize| -> u64 {
        (arena.iter())
            .filter(|b| b.start <= step && step <= b.end)
            .map(|b| round(b.size))
            .sum()
    };
    let peak = (0..plan.schedule.len()).map(live).max().unwrap_or(0);
    let end = (arena.iter())
        .map(|b| b.offset.unwrap() + b.size)
        .max()
        .unwrap_or(0);
    plan.lower_bound_bytes = peak;
    plan.arena_bytes = end.max(peak);
}
