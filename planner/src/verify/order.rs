//! The rules about time: `events` (and the happens-before order they give), `lifetimes` and
//! `aliasing`.
//!
//! Happens-before is recomputed from the schedule alone: steps of one stream run in schedule
//! order; a step that waits on event `e` runs after the latest earlier step that records `e`
//! (CUDA semantics: a wait sees the most recent record); the order is transitive. Since program
//! order on a stream is total, the steps of stream `s` that happen before step `i` are a prefix
//! of that stream's steps, so a vector clock (per stream, the length of that prefix) stores the
//! whole order in `steps × streams` numbers.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::Alias;

use super::{describe_buffer, fail, show, PlanError, Program, Value};
use crate::Plan;

/// The happens-before order of a plan's steps.
pub(super) struct HappensBefore {
    /// Per step: its stream (numbered densely) and its position among that stream's steps.
    lane: Vec<(usize, usize)>,
    /// Per step: for every stream, how many of that stream's steps happen before it.
    clock: Vec<Vec<usize>>,
}

impl HappensBefore {
    /// Whether step `a` finishes before step `b` starts (strict: never `a == b`).
    pub(super) fn before(&self, a: usize, b: usize) -> bool {
        match (self.lane.get(a), self.clock.get(b)) {
            (Some(&(stream, position)), Some(clock)) => position < clock[stream],
            _ => false,
        }
    }
}

/// Checks `events`; returns the happens-before order.
pub(super) fn check_events(
    program: &Program,
    plan: &Plan,
    step_of: &BTreeMap<usize, usize>,
) -> Result<HappensBefore, PlanError> {
    // Streams actually used, numbered densely: clocks are as long as that count, never longer
    // than the schedule, whatever numbers the plan holds.
    let lanes: BTreeMap<usize, usize> = (plan.schedule.iter().map(|s| s.stream))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .enumerate()
        .map(|(lane, stream)| (stream, lane))
        .collect();
    let streams = lanes.len();
    let mut order = HappensBefore {
        lane: Vec::new(),
        clock: Vec::new(),
    };
    let mut last_on_stream: Vec<Option<usize>> = vec![None; streams];
    let mut steps_on_stream = vec![0; streams];
    let mut last_record: BTreeMap<usize, usize> = BTreeMap::new();
    for (step, s) in plan.schedule.iter().enumerate() {
        if let Some(e) = s
            .waits
            .iter()
            .chain(&s.records)
            .find(|e| **e >= plan.events)
        {
            // The runtime creates `plan.events` events; this one does not exist.
            let events = plan.events;
            return fail("events", format!("step {step} uses event {e}, of {events}"));
        }
        let lane = lanes[&s.stream];
        // The steps this one directly follows; each brings everything before it.
        let mut after = Vec::new();
        after.extend(last_on_stream[lane]);
        for e in &s.waits {
            let Some(&recorder) = last_record.get(e) else {
                // Waiting on an event nobody recorded yet waits for nothing.
                return fail(
                    "events",
                    format!("step {step} waits for event {e}, which no earlier step records"),
                );
            };
            after.push(recorder);
        }
        let mut clock = vec![0; streams];
        for p in after {
            let (their_lane, position) = order.lane[p];
            for (mine, theirs) in clock.iter_mut().zip(&order.clock[p]) {
                *mine = (*mine).max(*theirs);
            }
            clock[their_lane] = clock[their_lane].max(position + 1);
        }
        order.lane.push((lane, steps_on_stream[lane]));
        steps_on_stream[lane] += 1;
        order.clock.push(clock);
        last_on_stream[lane] = Some(step);
        for e in &s.records {
            last_record.insert(*e, step);
        }
    }
    for (step, s) in plan.schedule.iter().enumerate() {
        let operands = program
            .ops
            .get(&s.node)
            .map_or(&[][..], |op| &op.operands[..]);
        for &operand in operands {
            // A view writes nothing: what must be complete is the step that wrote the data.
            let mut source = operand;
            while let Some(view) = program.ops.get(&source.0).filter(|op| is_view(op.op)) {
                match view.operands.first() {
                    Some(&inner) => source = inner,
                    None => break,
                }
            }
            let Some(&producer) = step_of.get(&source.0) else {
                continue;
            };
            if !order.before(producer, step) {
                // Another stream might still be computing the operand when this step reads it.
                let value = show(operand);
                let detail = format!(
                    "step {step} reads {value} from step {producer} without an event ordering them"
                );
                return fail("events", detail);
            }
        }
    }
    Ok(order)
}

/// What the overlap rule needs to know of each buffer's life.
pub(super) struct Lifetimes {
    /// Steps that write or read the buffer.
    pub(super) touches: Vec<BTreeSet<usize>>,
    /// The first step that writes it (`None` for buffers bound before the run).
    pub(super) first_write: Vec<Option<usize>>,
    /// Whether its content must survive the run.
    pub(super) kept: Vec<bool>,
}

/// Checks `lifetimes`; returns the recomputed facts.
pub(super) fn check_lifetimes(
    program: &Program,
    plan: &Plan,
    buffer_of: &BTreeMap<Value, usize>,
) -> Result<Lifetimes, PlanError> {
    let count = plan.buffers.len();
    let last = plan.schedule.len().saturating_sub(1);
    // Per buffer: every touching step with the value it touches, and the operand reads.
    let mut touches: Vec<BTreeMap<usize, Value>> = vec![BTreeMap::new(); count];
    let mut uses = vec![0; count];
    let mut first_write = vec![None; count];
    for (step, s) in plan.schedule.iter().enumerate() {
        let Some(op) = program.ops.get(&s.node) else {
            continue;
        };
        for value in (0..op.results).map(|port| (s.node, port)) {
            if let Some(&b) = buffer_of.get(&value) {
                touches[b].entry(step).or_insert(value);
                first_write[b] = first_write[b].or(Some(step));
            }
        }
        for value in &op.operands {
            if let Some(&b) = buffer_of.get(value) {
                touches[b].entry(step).or_insert(*value);
                uses[b] += 1;
            }
        }
    }
    let mut kept = vec![false; count];
    for (value, &b) in buffer_of {
        if program.inputs.contains_key(&value.0) {
            // Bound before the run: alive from the first step, and never first written by one.
            touches[b].entry(0).or_insert(*value);
            first_write[b] = None;
        }
        if program.kept.contains(value) {
            // Read after the run: alive through the last step.
            touches[b].insert(last, *value);
            kept[b] = true;
        }
    }
    for buffer in &plan.buffers {
        let (id, what) = (buffer.id, describe_buffer(plan, buffer.id));
        let (start, end) = (buffer.start, buffer.end);
        if start > end || end > last {
            // A lifetime is a range of existing steps.
            return fail(
                "lifetimes",
                format!(
                    "{what} lives over steps {start}..={end}, of {}",
                    plan.schedule.len()
                ),
            );
        }
        let outside = touches[id].iter().find(|(t, _)| **t < start || **t > end);
        if let Some((step, value)) = outside {
            // Its bytes could be handed to another buffer while this step still uses them.
            let value = show(*value);
            let detail = format!(
                "{what} lives over steps {start}..={end} but step {step} touches its value {value}"
            );
            return fail("lifetimes", detail);
        }
        if buffer.uses != uses[id] {
            // `uses` is the number of operand reads of the buffer's values.
            let detail = format!(
                "{what} claims {} uses; its values are read {} times",
                buffer.uses, uses[id]
            );
            return fail("lifetimes", detail);
        }
        let writer_stream = first_write[id].and_then(|step| plan.schedule.get(step));
        if let Some(writer) = writer_stream.filter(|w| w.stream != buffer.stream) {
            // `stream` is the stream of the first write.
            let detail = format!(
                "{what} is on stream {} but first written on stream {}",
                buffer.stream, writer.stream
            );
            return fail("lifetimes", detail);
        }
    }
    let mut touches: Vec<BTreeSet<usize>> = touches
        .into_iter()
        .map(|t| t.into_keys().collect())
        .collect();
    for buffer in plan.buffers.iter().filter(|b| b.values.is_empty()) {
        // A workspace (one step long, checked by `storage`) is written and read by its step.
        touches[buffer.id] = BTreeSet::from([buffer.start]);
        first_write[buffer.id] = Some(buffer.start);
    }
    Ok(Lifetimes {
        touches,
        first_write,
        kept,
    })
}

/// Checks `aliasing`.
pub(super) fn check_aliasing(
    program: &Program,
    plan: &Plan,
    buffer_of: &BTreeMap<Value, usize>,
    step_of: &BTreeMap<usize, usize>,
    order: &HappensBefore,
) -> Result<(), PlanError> {
    // Per value: the operand whose buffer it shares through its op's alias rule, and how.
    let mut parent: BTreeMap<Value, (Value, Alias)> = BTreeMap::new();
    let mut readers: BTreeMap<Value, Vec<usize>> = BTreeMap::new();
    for (&node, op) in &program.ops {
        let step = step_of.get(&node).copied();
        for &operand in &op.operands {
            readers.entry(operand).or_default().extend(step);
        }
        for value in (0..op.results).map(|port| (node, port)) {
            let alias = op.op.alias(value.1);
            let (Alias::ViewOf(i) | Alias::MayOverwrite(i)) = alias else {
                continue;
            };
            let Some(&operand) = op.operands.get(i) else {
                continue;
            };
            let same = buffer_of.get(&value) == buffer_of.get(&operand);
            if same {
                parent.insert(value, (operand, alias));
            } else if matches!(alias, Alias::ViewOf(_)) {
                // A view writes nothing: in a buffer of its own it would never hold data.
                let (v, o) = (show(value), show(operand));
                return fail(
                    "aliasing",
                    format!("view {v} is not in the buffer of its operand {o}"),
                );
            }
        }
    }
    // Per buffer: its values in value order, the first being its root.
    let mut members: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    for (value, b) in buffer_of {
        members.entry(*b).or_default().push(*value);
    }
    for (&b, values) in &members {
        let mut roots = values.iter().filter(|v| !parent.contains_key(v));
        if let (Some(first), Some(second)) = (roots.next(), roots.next()) {
            // Two unrelated values in one buffer would overwrite each other.
            let (what, first, second) = (describe_buffer(plan, b), show(*first), show(*second));
            let detail = format!("{what} holds {first} and {second}, neither a view nor an in-place result of the other");
            return fail("aliasing", detail);
        }
    }
    // Parents are operands, which the schedule has run earlier, so the walk ends.
    let descends = |mut v: Value, from: Value| loop {
        if v == from {
            return true;
        }
        match parent.get(&v) {
            Some((up, _)) => v = *up,
            None => return false,
        }
    };
    for (&result, &(overwritten, alias)) in &parent {
        let (Alias::MayOverwrite(_), Some(&step), Some(&b), Some(op)) = (
            alias,
            step_of.get(&result.0),
            buffer_of.get(&result),
            program.ops.get(&result.0),
        ) else {
            continue;
        };
        // The buffer's content before `step`: its values that do not descend from `result`.
        let old = members[&b].iter().filter(|v| !descends(**v, result));
        for &value in old {
            let what = format!(
                "step {step} writes {} over {}",
                show(result),
                show(overwritten)
            );
            if program.kept.contains(&value) {
                // The value must survive the run, and this write destroys it.
                return fail(
                    "aliasing",
                    format!(
                        "{what}, destroying {}, which is kept after the run",
                        show(value)
                    ),
                );
            }
            if value != overwritten && op.operands.contains(&value) {
                // The op reads other bytes of the buffer, laid out differently, as it writes.
                return fail(
                    "aliasing",
                    format!(
                        "{what} while also reading {}, in the same buffer",
                        show(value)
                    ),
                );
            }
            let reads = readers.get(&value).map_or(&[][..], |r| &r[..]);
            if let Some(r) = reads
                .iter()
                .find(|r| **r != step && !order.before(**r, step))
            {
                // The reader would see the new content instead of the old.
                return fail(
                    "aliasing",
                    format!("{what}, but step {r} reads {} after that", show(value)),
                );
            }
        }
    }
    Ok(())
}

/// Ops that only reinterpret their operand's bytes and run no work on a device.
pub(super) fn is_view(op: &kiln_ir::Op) -> bool {
    matches!(
        op,
        kiln_ir::Op::Reshape { .. } | kiln_ir::Op::Transpose { .. } | kiln_ir::Op::Slice { .. }
    )
}
