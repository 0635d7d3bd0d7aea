//! The rules about where values live: `storage` (every value in one buffer, large enough;
//! workspaces for the steps that need scratch) and `classes` (inputs bound from outside,
//! the arena for activations and workspaces only).

use std::collections::BTreeMap;

use kiln_ir::InputKind;

use super::{describe_buffer, fail, parse, show, PlanError, Program, Value};
use crate::{BufferClass, Plan};

/// Checks `storage`; returns the buffer of every value.
pub(super) fn check_storage(
    program: &Program,
    plan: &Plan,
) -> Result<BTreeMap<Value, usize>, PlanError> {
    if let Some((i, b)) = plan.buffers.iter().enumerate().find(|(i, b)| b.id != *i) {
        // Buffers are referred to by id; the id must be the index they are found at.
        return fail("storage", format!("buffer at index {i} has id {}", b.id));
    }
    let mut buffer_of = BTreeMap::new();
    for (text, buffer) in &plan.value_buffers {
        let Some(value) = parse(text).filter(|v| program.values.contains_key(v)) else {
            // A plan only stores values of its graph.
            return fail(
                "storage",
                format!("value_buffers lists `{text}`, not a value of the graph"),
            );
        };
        if *buffer >= plan.buffers.len() {
            // The value would live nowhere.
            let count = plan.buffers.len();
            let detail = format!("value {text} is in buffer {buffer}, of {count}");
            return fail("storage", detail);
        }
        if buffer_of.insert(value, *buffer).is_some() {
            // A value is stored in exactly one place.
            return fail("storage", format!("value {text} is listed twice"));
        }
    }
    if let Some(value) = program.values.keys().find(|v| !buffer_of.contains_key(v)) {
        // Every value is computed into (or bound to) some storage.
        let what = program.describe(value.0);
        return fail(
            "storage",
            format!("value {} of {what} has no buffer", show(*value)),
        );
    }
    let mut mapped = vec![0; plan.buffers.len()];
    buffer_of.values().for_each(|b| mapped[*b] += 1);
    for buffer in &plan.buffers {
        for text in &buffer.values {
            let listed = parse(text).and_then(|v| buffer_of.get(&v));
            if listed != Some(&buffer.id) {
                // Both views of the mapping must agree, or readers of the plan disagree.
                let detail = format!(
                    "{} lists value {text}, which value_buffers puts in {listed:?}",
                    describe_buffer(plan, buffer.id)
                );
                return fail("storage", detail);
            }
        }
        let count = mapped[buffer.id];
        if count != buffer.values.len() {
            // Some value mapped here is missing from (or repeated in) the buffer's list.
            let (what, listed) = (describe_buffer(plan, buffer.id), buffer.values.len());
            let detail = format!("{what} lists {listed} values but value_buffers maps {count}");
            return fail("storage", detail);
        }
    }
    for (&value, &buffer) in &buffer_of {
        let Some(bytes) = program.value_bytes(value) else {
            // A value too large to address cannot be stored.
            return fail(
                "storage",
                format!("value {} is too large to store", show(value)),
            );
        };
        if bytes > plan.buffers[buffer].size {
            // Writing the value would run past the end of its buffer.
            let (what, size) = (describe_buffer(plan, buffer), plan.buffers[buffer].size);
            let detail = format!(
                "{what} has {size} bytes but holds {} of {bytes}",
                show(value)
            );
            return fail("storage", detail);
        }
    }
    check_workspaces(program, plan)?;
    Ok(buffer_of)
}

/// The workspace part of `storage`: workspaces and steps that need scratch match one to one.
fn check_workspaces(program: &Program, plan: &Plan) -> Result<(), PlanError> {
    let mut scratch_of_step = BTreeMap::new();
    for buffer in plan
        .buffers
        .iter()
        .filter(|b| b.class == BufferClass::Workspace)
    {
        let what = describe_buffer(plan, buffer.id);
        if buffer.start != buffer.end {
            // A workspace is one op's scratch while it runs: exactly one step.
            let (start, end) = (buffer.start, buffer.end);
            return fail(
                "storage",
                format!("workspace {what} spans steps {start}..={end}"),
            );
        }
        let need = (plan.schedule.get(buffer.start)).map_or(0, |s| program.scratch_bytes(s.node));
        if need == 0 {
            // Only ops that need scratch get a workspace.
            let step = buffer.start;
            return fail(
                "storage",
                format!("workspace {what} is at step {step}, which needs none"),
            );
        }
        if buffer.size < need {
            // The op would write past the end of its scratch.
            let (step, size) = (buffer.start, buffer.size);
            let detail = format!("workspace {what} has {size} bytes; step {step} needs {need}");
            return fail("storage", detail);
        }
        if let Some(other) = scratch_of_step.insert(buffer.start, buffer.id) {
            // The runtime hands each op one scratch buffer; two would be ambiguous.
            let step = buffer.start;
            let detail = format!("step {step} has workspaces {other} and {}", buffer.id);
            return fail("storage", detail);
        }
    }
    for (step, s) in plan.schedule.iter().enumerate() {
        let need = program.scratch_bytes(s.node);
        if need > 0 && !scratch_of_step.contains_key(&step) {
            // The op needs scratch and would have none.
            let what = program.describe(s.node);
            let detail = format!(
                "step {step} runs {what}, which needs {need} bytes of workspace, and has none"
            );
            return fail("storage", detail);
        }
    }
    Ok(())
}

fn input_class(kind: InputKind) -> BufferClass {
    match kind {
        InputKind::Param => BufferClass::Param,
        InputKind::Input => BufferClass::Input,
        InputKind::State => BufferClass::State,
    }
}

/// Checks `classes`.
pub(super) fn check_classes(
    program: &Program,
    plan: &Plan,
    buffer_of: &BTreeMap<Value, usize>,
) -> Result<(), PlanError> {
    for (value, kind) in program.inputs.iter().map(|(n, k)| ((*n, 0), *k)) {
        let Some(&id) = buffer_of.get(&value) else {
            continue;
        };
        let class = plan.buffers[id].class;
        if class != input_class(kind) {
            // Inputs are bound from outside (weights, per-run data, state), never arena slices.
            let what = describe_buffer(plan, id);
            let detail = format!(
                "{what} holds {} {} but is {class:?}",
                kind.name(),
                show(value)
            );
            return fail("classes", detail);
        }
    }
    for buffer in &plan.buffers {
        let what = describe_buffer(plan, buffer.id);
        let values: Vec<Option<Value>> = buffer.values.iter().map(|t| parse(t)).collect();
        let holds_input = values
            .iter()
            .flatten()
            .any(|v| program.inputs.contains_key(&v.0));
        let class = buffer.class;
        let fits = match class {
            BufferClass::Workspace => values.is_empty(),
            BufferClass::Activation | BufferClass::Output => !values.is_empty() && !holds_input,
            BufferClass::Param | BufferClass::Input | BufferClass::State => holds_input,
        };
        if !fits {
            // Workspaces hold no values; values of ops live in activations or outputs; the
            // input classes are only for buffers bound to an input.
            let count = values.len();
            let detail = format!(
                "{what} is {class:?} with {count} values (input among them: {holds_input})"
            );
            return fail("classes", detail);
        }
        if buffer.offset.is_some() != class.in_arena() {
            // Exactly the arena classes are placed in the arena.
            let offset = buffer.offset;
            return fail(
                "classes",
                format!("{what} is {class:?} with offset {offset:?}"),
            );
        }
    }
    Ok(())
}
