//! The plan verifier: an independent proof checker of a [`Plan`] against its graph.
//!
//! It shares nothing with the planner but the data model: every fact it relies on (producers,
//! readers, lifetimes, happens-before, the live-bytes peak) is recomputed here from the graph
//! and the plan's own schedule, so a planner bug cannot hide behind a shared helper. Each rule
//! is reported as [`PlanError`] with the rule's name and a detail naming the step, buffer or
//! value at fault. Rules, checked in this order because later ones read what earlier ones
//! establish (steps exist, values have buffers, lifetimes are in range):
//! - `schedule`: every op node runs exactly once, after the producers of its operands, with the
//!   op text of its node, on a stream below `plan.streams()`; `all_reduce` steps, and only
//!   they, run on the communication stream, `options.streams`, which a plan names exactly
//!   when it has them.
//! - `events`: events are below `plan.events`; every waited event is recorded by an earlier
//!   step; every operand's producer happens before its reader (streams synchronize through
//!   events).
//! - `storage`: `buffers[i].id == i`; every IR value (`"node.port"`) is in `value_buffers`
//!   exactly once, in an existing buffer, and the buffers' `values` lists say the same; a
//!   buffer is at least as large as each value in it; each step whose op needs scratch has
//!   exactly one workspace buffer, one step long, at least that large (the needs are the
//!   backend's, given to the verifier as to the planner), and no other step has one.
//! - `classes`: an input's buffer has its kind's class; a buffer without values is a workspace;
//!   other buffers of op results are activations or outputs; arena classes (activation,
//!   workspace) have an offset, the others none.
//! - `lifetimes`: `start <= end <=` last step; `[start, end]` covers every step that writes or
//!   reads one of the buffer's values; buffers of inputs start at 0; buffers of values kept
//!   after the run (outputs, writes, params and states nobody writes) end at the last step;
//!   `uses` counts operand reads; `stream` is the first writer's stream.
//! - `aliasing`: a view shares its operand's buffer; the values of a buffer descend (through
//!   views and in-place results) from one root; an in-place result overwrites its operand only
//!   when no old value of the buffer is read afterwards or kept after the run.
//! - `alignment`: `options.alignment > 0` and divides every arena offset.
//! - `bounds`: `offset + size <= arena_bytes`; `arena_bytes >= lower_bound_bytes`.
//! - `lower_bound`: the peak over steps of live arena bytes (sizes rounded up to the alignment,
//!   live when `start <= step <= end`) equals `lower_bound_bytes`.
//! - `overlap`: arena buffers that share a byte are never live together: with one stream their
//!   `[start, end]` are disjoint; with several, every step touching one happens before the first
//!   write of the other.
//! - `in_place`: `in_place_writes` names writes of the graph, in its order; each is computed by
//!   an op that may overwrite the written input itself, its buffer holds it and its views only,
//!   and every other op reading the input (or a view of it) happens before that op.
//! - `recomputed`: each value the plan lists as recomputed and its clone are results of op
//!   nodes computing the same thing (the same op on the same operands, or on clones of them);
//!   every reader of the value runs before the clone's step, so the
//!   backward reads only the clone; `bytes` is the value's size.
//!
//! Byte arithmetic is done in `u128`, so no plan, however large its numbers, overflows it.
//! Everything is iterated in step, buffer or value order, so the violation reported is
//! deterministic.

mod in_place;
mod memory;
mod order;
mod storage;

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::graph::NodeKind;
use kiln_ir::{Graph, InputKind, Op, TensorType};

use crate::{Plan, WorkspaceNeeds};

/// A broken rule of the module doc.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid plan: {rule}: {detail}")]
pub struct PlanError {
    /// The rule's name, as listed in the module doc.
    pub rule: &'static str,
    /// What breaks it, naming the step, buffer or value.
    pub detail: String,
}

fn fail<T>(rule: &'static str, detail: String) -> Result<T, PlanError> {
    Err(PlanError { rule, detail })
}

/// Checks every rule of the module doc for a plan made for a backend whose kernels need
/// `workspaces`; the first violation found is the error.
pub fn verify_plan(
    graph: &Graph,
    plan: &Plan,
    workspaces: &dyn WorkspaceNeeds,
) -> Result<(), PlanError> {
    let program = Program::read(graph, workspaces);
    let steps = check_schedule(&program, plan)?;
    let order = order::check_events(&program, plan, &steps)?;
    let buffer_of = storage::check_storage(&program, plan)?;
    storage::check_classes(&program, plan, &buffer_of)?;
    let lifetimes = order::check_lifetimes(&program, plan, &buffer_of)?;
    order::check_aliasing(&program, plan, &buffer_of, &steps, &order)?;
    memory::check_alignment(plan)?;
    memory::check_bounds(plan)?;
    memory::check_lower_bound(plan)?;
    memory::check_overlap(plan, &lifetimes, &order)?;
    in_place::check_in_place(graph, &program, plan, (&buffer_of, &steps), &order)?;
    check_recomputed(&program, plan, &steps)
}

fn check_recomputed(
    program: &Program,
    plan: &Plan,
    steps: &BTreeMap<usize, usize>,
) -> Result<(), PlanError> {
    const RULE: &str = "recomputed";
    // Whether `a` and `b` are the same computation, up to `depth` ops deep.
    fn same(program: &Program, a: Value, b: Value, depth: usize) -> bool {
        if a == b {
            return true;
        }
        let (Some(x), Some(y)) = (program.ops.get(&a.0), program.ops.get(&b.0)) else {
            return false;
        };
        depth > 0
            && a.1 == b.1
            && x.op == y.op
            && x.operands.len() == y.operands.len()
            && (x.operands.iter().zip(&y.operands)).all(|(&u, &v)| same(program, u, v, depth - 1))
    }
    for entry in &plan.recomputed {
        let (Some(value), Some(clone)) = (parse(&entry.value), parse(&entry.clone)) else {
            return fail(
                RULE,
                format!("{} / {} are not values", entry.value, entry.clone),
            );
        };
        // Chains are a few ops and views deep, clones of clones a few chains.
        const DEPTH: usize = 64;
        if value == clone || !same(program, value, clone, DEPTH) {
            return fail(
                RULE,
                format!("{} does not compute what {} does", entry.clone, entry.value),
            );
        }
        let Some(&clone_step) = steps.get(&clone.0) else {
            return fail(RULE, format!("clone {} is not scheduled", entry.clone));
        };
        let late = (program.ops.iter())
            .filter(|(_, op)| op.operands.contains(&value))
            .find(|(node, _)| steps.get(node).is_some_and(|&s| s > clone_step));
        if let Some((node, _)) = late {
            return fail(
                RULE,
                format!(
                    "{} reads {} after its clone {} (step {clone_step})",
                    program.describe(*node),
                    entry.value,
                    entry.clone
                ),
            );
        }
        if program.value_bytes(value) != Some(entry.bytes) {
            return fail(
                RULE,
                format!("{} is not {} bytes", entry.value, entry.bytes),
            );
        }
    }
    Ok(())
}

/// An IR value as plans name it: (node index, output port).
type Value = (usize, usize);

fn show(value: Value) -> String {
    format!("{}.{}", value.0, value.1)
}

/// `"node.port"` back to a value, if it has that form.
fn parse(text: &str) -> Option<Value> {
    let (node, port) = text.split_once('.')?;
    Some((node.parse().ok()?, port.parse().ok()?))
}

/// An op node of the graph.
struct OpNode<'g> {
    op: &'g Op,
    operands: Vec<Value>,
    results: usize,
}

/// The facts about the graph the rules read, keyed by node index.
struct Program<'g> {
    ops: BTreeMap<usize, OpNode<'g>>,
    inputs: BTreeMap<usize, InputKind>,
    /// Every value and its type.
    values: BTreeMap<Value, &'g TensorType>,
    /// Values that must still hold their content after the run: outputs, written values, and
    /// params and states that nothing writes (the next run reads them again).
    kept: BTreeSet<Value>,
    /// The scratch the plan's backend needs per op.
    workspaces: &'g dyn WorkspaceNeeds,
}

impl<'g> Program<'g> {
    fn read(graph: &'g Graph, workspaces: &'g dyn WorkspaceNeeds) -> Self {
        let mut program = Program {
            ops: BTreeMap::new(),
            inputs: BTreeMap::new(),
            values: BTreeMap::new(),
            kept: BTreeSet::new(),
            workspaces,
        };
        let written: BTreeSet<&str> = graph.writes().iter().map(|(n, _)| n.as_str()).collect();
        for node in graph.node_indices() {
            let Some(weight) = graph.node(node) else {
                continue;
            };
            let index = node.index();
            for (port, ty) in weight.outputs.iter().enumerate() {
                program.values.insert((index, port), ty);
            }
            match &weight.kind {
                NodeKind::Input { name, kind } => {
                    program.inputs.insert(index, *kind);
                    if kind.is_persistent() && !written.contains(name.as_str()) {
                        program.kept.insert((index, 0));
                    }
                }
                NodeKind::Op(op) => {
                    let operands = graph.operands(node);
                    let operands = operands.iter().map(|v| (v.node.index(), v.port));
                    let op_node = OpNode {
                        op,
                        operands: operands.collect(),
                        results: weight.outputs.len(),
                    };
                    program.ops.insert(index, op_node);
                }
            }
        }
        let ends = graph.outputs().iter().chain(graph.writes());
        program
            .kept
            .extend(ends.map(|(_, v)| (v.node.index(), v.port)));
        program
    }

    /// How details name a node: `node 6 (scale{alpha=2.0})`.
    fn describe(&self, node: usize) -> String {
        match (self.ops.get(&node), self.inputs.get(&node)) {
            (Some(op), _) => format!("node {node} ({})", op.op),
            (None, Some(kind)) => format!("node {node} ({})", kind.name()),
            (None, None) => format!("node {node} (missing)"),
        }
    }

    /// Bytes of a value when contiguous (`None` if it has no type or overflows).
    fn value_bytes(&self, value: Value) -> Option<u64> {
        let ty = self.values.get(&value)?;
        let bytes = ty
            .shape
            .checked_numel()
            .ok()?
            .checked_mul(ty.dtype.size_bytes())?;
        u64::try_from(bytes).ok()
    }

    /// Bytes of scratch the op of `node` needs.
    fn scratch_bytes(&self, node: usize) -> u64 {
        let Some(op) = self.ops.get(&node) else {
            return 0;
        };
        let types: Option<Vec<TensorType>> = (op.operands.iter())
            .map(|v| self.values.get(v).map(|t| (*t).clone()))
            .collect();
        types.map_or(0, |types| self.workspaces.workspace_bytes(op.op, &types))
    }
}

/// How details name a buffer: `buffer 3 (`mul 3.0`)`.
fn describe_buffer(plan: &Plan, id: usize) -> String {
    match plan.buffers.get(id) {
        Some(buffer) => format!("buffer {id} (`{}`)", buffer.name),
        None => format!("buffer {id} (missing)"),
    }
}

/// Checks `schedule`; returns the step of every op node.
fn check_schedule(program: &Program, plan: &Plan) -> Result<BTreeMap<usize, usize>, PlanError> {
    let mut step_of = BTreeMap::new();
    let collectives = (program.ops.values()).any(|o| matches!(o.op, kiln_ir::Op::AllReduce));
    let communication = collectives.then_some(plan.options.streams);
    if plan.communication_stream != communication {
        let detail = format!(
            "the plan names communication stream {:?} for a program {} collectives",
            plan.communication_stream,
            if collectives { "with" } else { "without" }
        );
        return fail("schedule", detail);
    }
    for (step, s) in plan.schedule.iter().enumerate() {
        if s.stream >= plan.streams() {
            // The runtime creates `plan.streams()` streams; this one does not exist.
            let streams = plan.streams();
            let detail = format!("step {step} runs on stream {}, of {streams}", s.stream);
            return fail("schedule", detail);
        }
        let Some(op) = program.ops.get(&s.node) else {
            // Only op nodes run; an input or a missing node has nothing to execute.
            let what = program.describe(s.node);
            return fail("schedule", format!("step {step} runs {what}, not an op"));
        };
        if s.op != op.op.to_string() {
            // The step's text must describe the op it runs, or dumps mislead.
            let what = program.describe(s.node);
            let detail = format!("step {step} says `{}` but runs {what}", s.op);
            return fail("schedule", detail);
        }
        let collective = matches!(op.op, kiln_ir::Op::AllReduce);
        if collective != (Some(s.stream) == communication) {
            // Collectives must be issued in one order on every rank: on their own stream.
            let what = program.describe(s.node);
            let detail = format!(
                "step {step} runs {what} on stream {}, but the communication stream is {:?} \
                 and runs all_reduce steps only",
                s.stream, communication
            );
            return fail("schedule", detail);
        }
        if let Some(first) = step_of.insert(s.node, step) {
            // Running an op twice would redo its writes (and in-place ops are not idempotent).
            let what = program.describe(s.node);
            return fail(
                "schedule",
                format!("{what} runs at steps {first} and {step}"),
            );
        }
        for &operand in &op.operands {
            let producer = operand.0;
            if program.ops.contains_key(&producer) && !step_of.contains_key(&producer) {
                // The operand would be read before it is computed.
                let (what, by) = (program.describe(s.node), program.describe(producer));
                let value = show(operand);
                let detail =
                    format!("step {step} runs {what}, which reads {value} before {by} has run");
                return fail("schedule", detail);
            }
        }
    }
    if let Some(node) = program.ops.keys().find(|n| !step_of.contains_key(n)) {
        // An op that never runs leaves its results unwritten.
        return fail(
            "schedule",
            format!("{} never runs", program.describe(*node)),
        );
    }
    Ok(step_of)
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
