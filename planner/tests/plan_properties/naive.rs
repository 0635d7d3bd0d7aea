//! A naive plan, valid by construction, and single-field edits that break it: inputs for
//! property tests of the verifier.

use std::collections::BTreeMap;

use kiln_ir::graph::NodeKind;
use kiln_ir::{Alias, Graph, InputKind, TensorType, ValueId};
use kiln_planner::testing::TestWorkspaces;
use kiln_planner::{Buffer, BufferClass, Plan, PlanOptions, Step, WorkspaceNeeds};

/// A plan any planner beats: ops in node order on stream 0, no in-place results, every buffer
/// alive from its first write to the last step at an offset of its own. It is valid by
/// construction, so `verify_plan` accepting it guards the verifier against false alarms.
pub fn naive_plan(graph: &Graph, options: &PlanOptions) -> Plan {
    let round = |size: u64| size.div_ceil(options.alignment) * options.alignment;
    let ops: Vec<_> = (graph.node_indices())
        .filter(|n| matches!(graph.node(*n).map(|w| &w.kind), Some(NodeKind::Op(_))))
        .collect();
    let last = ops.len().saturating_sub(1);
    let mut buffers = Vec::new();
    let mut buffer_of = BTreeMap::new();
    let mut arena = 0;
    // Appends a buffer (at the end of the arena if it is an arena one); returns its id.
    let mut add = |buffers: &mut Vec<Buffer>,
                   class: BufferClass,
                   size: u64,
                   (start, end): (usize, usize),
                   value: Option<ValueId>| {
        let offset = class.in_arena().then_some(arena);
        if class.in_arena() {
            arena += round(size);
        }
        let values = value
            .iter()
            .map(|v| format!("{}.{}", v.node.index(), v.port))
            .collect();
        let (id, name) = (buffers.len(), format!("buffer {}", buffers.len()));
        let stream = 0;
        buffers.push(Buffer {
            id,
            name,
            class,
            size,
            offset,
            start,
            end,
            stream,
            values,
            uses: 0,
        });
        id
    };
    for (value, _, kind, ty) in graph.inputs() {
        let class = match kind {
            InputKind::Param => BufferClass::Param,
            InputKind::Input => BufferClass::Input,
            InputKind::State => BufferClass::State,
        };
        let id = add(
            &mut buffers,
            class,
            ty.size_bytes() as u64,
            (0, last),
            Some(value),
        );
        buffer_of.insert(value, id);
    }
    let mut schedule = Vec::new();
    for (step, &node) in ops.iter().enumerate() {
        let Some(NodeKind::Op(op)) = graph.node(node).map(|w| &w.kind) else {
            continue;
        };
        let operands = graph.operands(node);
        let types: Vec<TensorType> = operands
            .iter()
            .map(|v| graph.value_type(*v).unwrap().clone())
            .collect();
        operands
            .iter()
            .for_each(|v| buffers[buffer_of[v]].uses += 1);
        schedule.push(Step {
            node: node.index(),
            op: op.to_string(),
            stream: 0,
            waits: vec![],
            records: vec![],
        });
        for (port, ty) in graph.node(node).unwrap().outputs.iter().enumerate() {
            let value = ValueId { node, port };
            let id = match op.alias(port) {
                Alias::ViewOf(i) => {
                    let id = buffer_of[&operands[i]];
                    buffers[id].values.push(format!("{}.{port}", node.index()));
                    id
                }
                _ => add(
                    &mut buffers,
                    BufferClass::Activation,
                    ty.size_bytes() as u64,
                    (step, last),
                    Some(value),
                ),
            };
            buffer_of.insert(value, id);
        }
        let need = TestWorkspaces.workspace_bytes(op, &types);
        if need > 0 {
            add(
                &mut buffers,
                BufferClass::Workspace,
                need,
                (step, step),
                None,
            );
        }
    }
    let live = |step: usize| -> u64 {
        let arena_buffers = buffers.iter().filter(|b| b.offset.is_some());
        arena_buffers
            .filter(|b| b.start <= step && step <= b.end)
            .map(|b| round(b.size))
            .sum()
    };
    let lower_bound_bytes = (0..schedule.len()).map(live).max().unwrap_or(0);
    let value_buffers = buffer_of
        .iter()
        .map(|(v, b)| (format!("{}.{}", v.node.index(), v.port), *b))
        .collect();
    Plan {
        program: graph.name().to_string(),
        options: options.clone(),
        schedule,
        buffers,
        value_buffers,
        arena_bytes: arena,
        lower_bound_bytes,
        schedule_strategy: "node order".to_string(),
        offset_strategy: "no reuse".to_string(),
        offset_candidates: vec![("no reuse".to_string(), arena)],
        events: 0,
        in_place_writes: Vec::new(),
        recomputed: Vec::new(),
        communication_stream: None,
        hash: String::new(),
    }
}

/// Sets one field of `plan` (chosen by `field`, at `index` modulo its length) to `number`.
pub fn edit(plan: &mut Plan, field: u8, index: usize, number: u64) {
    let n = number as usize;
    let buffers = plan.buffers.len().max(1);
    let steps = plan.schedule.len().max(1);
    let buffer = plan.buffers.get_mut(index % buffers);
    let step = plan.schedule.get_mut(index % steps);
    match (field, buffer, step) {
        (0, _, Some(step)) => step.node = n % 64,
        (1, _, Some(step)) => step.stream = n % 4,
        (2, _, Some(step)) => step.waits.push(n % 4),
        (3, _, Some(step)) => step.records.push(n % 4),
        (4, Some(buffer), _) => buffer.start = n % 64,
        (5, Some(buffer), _) => buffer.end = n % 64,
        (6, Some(buffer), _) => buffer.offset = Some(number),
        (7, Some(buffer), _) => buffer.size = number,
        (8, Some(buffer), _) => buffer.values.push(format!("{}.{}", n % 64, index % 3)),
        (9, ..) => plan.arena_bytes = number,
        (10, ..) => plan.lower_bound_bytes = number,
        _ => {
            let len = plan.value_buffers.len().max(1);
            if let Some(entry) = plan.value_buffers.get_mut(index % len) {
                entry.1 = n % 64;
            }
            plan.events = n % 4;
        }
    }
}
