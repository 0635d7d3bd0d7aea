//! `plan`: from a graph and options to a [`Plan`].
//!
//! 1. Verify the graph (the IR verifier) and the options.
//! 2. Build buffers for every schedule candidate; keep the one with the lowest peak of live
//!    arena bytes (ties to the earlier candidate).
//! 3. Assign streams and events for the winner.
//! 4. Place arena buffers (activations and workspaces) with every offset heuristic, sharing
//!    bytes only where happens-before allows it across streams; keep the smallest arena.
//! 5. Decide which writes of persistent inputs are computed in place (`in_place.rs`).
//! 6. Assemble the plan in its fixed orders and hash it.
//!
//! `lower_bound_bytes` is the peak of live (aligned) arena bytes over the schedule's steps,
//! from the buffers' own `[start, end]`. With several streams buffers stay busy until later
//! steps know they are done, so the arena may exceed the bound by what concurrency costs; it
//! never falls below.

use crate::buffers::{BufferInfo, Buffers};
use crate::hash::plan_hash;
use crate::in_place::in_place_writes;
use crate::offsets::{align_up, arena_size, lower_bound, place_best, ArenaItem, Placement};
use crate::program::Program;
use crate::schedule::{candidates, check_order};
use crate::streams::StreamPlan;
use crate::workspaces::WorkspaceNeeds;
use crate::{Buffer, BufferClass, Error, Plan, PlanOptions, Result, Step};

/// Plans `graph` with `options` for a backend whose kernels need `workspaces`. Same graph,
/// options and needs give the same plan, byte for byte.
pub fn plan(
    graph: &kiln_ir::Graph,
    options: &PlanOptions,
    workspaces: &dyn WorkspaceNeeds,
) -> Result<Plan> {
    plan_behind(graph, options, workspaces, None)
}

/// [`plan`], with every op after `barrier` (in node order) scheduled after it.
pub(crate) fn plan_behind(
    graph: &kiln_ir::Graph,
    options: &PlanOptions,
    workspaces: &dyn WorkspaceNeeds,
    barrier: Option<kiln_ir::graph::NodeIndex>,
) -> Result<Plan> {
    options.validate()?;
    kiln_ir::verify(graph)?;
    let program = Program::new(graph)?
        .with_workspaces(workspaces)
        .with_barrier(barrier);
    let chosen = choose_schedule(&program, options.alignment)?;
    let streams = StreamPlan::new(&program, &chosen.order, &chosen.buffers, options.streams);
    let arena = place_arena(&chosen, &streams, options.alignment)?;
    let in_place_writes = in_place_writes(&program, &chosen.order, &chosen.buffers, &streams);

    let schedule = chosen
        .order
        .iter()
        .enumerate()
        .map(|(step, &op)| Step {
            node: program.ops[op].node,
            op: program.ops[op].op.to_string(),
            stream: streams.stream(step),
            waits: streams.waits[step].clone(),
            records: streams.records[step].clone(),
        })
        .collect();
    let value_name = |v: usize| {
        let id = program.values[v].id;
        format!("{}.{}", id.node.index(), id.port)
    };
    let buffers = chosen
        .buffers
        .list
        .iter()
        .enumerate()
        .map(|(id, b)| Buffer {
            id,
            name: b.name.clone(),
            class: b.class,
            size: b.size,
            offset: arena.offset_of[id],
            start: b.start,
            end: b.end,
            stream: match b.class {
                // Inputs exist before the run; stream 0 by convention.
                BufferClass::Param | BufferClass::Input | BufferClass::State => 0,
                _ => streams.stream(b.start),
            },
            values: b.values.iter().map(|&v| value_name(v)).collect(),
            uses: b.uses,
        })
        .collect();
    // Values are numbered in node order then port, the order the plan lists them in.
    let value_buffers = chosen
        .buffers
        .of_value
        .iter()
        .enumerate()
        .map(|(v, &b)| (value_name(v), b))
        .collect();

    let mut plan = Plan {
        program: graph.name().to_string(),
        options: options.clone(),
        schedule,
        buffers,
        value_buffers,
        arena_bytes: arena.bytes,
        lower_bound_bytes: chosen.peak,
        schedule_strategy: chosen.name.to_string(),
        offset_strategy: arena.placement.strategy,
        offset_candidates: arena.placement.candidates,
        events: streams.events,
        in_place_writes,
        recomputed: Vec::new(),
        communication_stream: streams.communication(),
        hash: String::new(),
    };
    plan.hash = plan_hash(&plan)?;
    Ok(plan)
}

/// The most streams a plan may use. Streams pay off only while independent ops can run side by
/// side, which a Transformer step offers a few of; and the stream plan keeps a vector clock of
/// one entry per stream at every step, so the count must be bounded before it is allocated.
pub const MAX_STREAMS: usize = 64;

impl PlanOptions {
    /// Checks the options `plan` accepts: 1 to [`MAX_STREAMS`] streams, an alignment of at
    /// least one byte.
    pub fn validate(&self) -> Result<()> {
        let bad = |option, detail: String| Err(Error::Option { option, detail });
        if self.streams == 0 {
            return bad("streams", "must be at least 1".into());
        }
        if self.streams > MAX_STREAMS {
            let detail = format!(
                "{} is more than the {MAX_STREAMS} streams the planner supports",
                self.streams
            );
            return bad("streams", detail);
        }
        if self.alignment == 0 {
            return bad("alignment", "must be at least 1 byte".into());
        }
        Ok(())
    }
}

/// The winning schedule candidate with its buffers and peak of live arena bytes.
struct Chosen {
    name: &'static str,
    order: Vec<usize>,
    buffers: Buffers,
    peak: u64,
}

/// Builds buffers for every candidate; the lowest peak wins, ties to the earlier candidate.
fn choose_schedule(program: &Program, alignment: u64) -> Result<Chosen> {
    let mut best: Option<Chosen> = None;
    for candidate in candidates(program) {
        check_order(program, candidate.name, &candidate.order)?;
        let buffers = Buffers::build(program, &candidate.order)?;
        let items = arena_items(&buffers, alignment, |b| {
            ArenaItem::serial(0, b.start, b.end)
        })?;
        let peak = lower_bound(&items.into_iter().map(|(_, i)| i).collect::<Vec<_>>())?;
        if best.as_ref().is_none_or(|b| peak < b.peak) {
            best = Some(Chosen {
                name: candidate.name,
                order: candidate.order,
                buffers,
                peak,
            });
        }
    }
    best.ok_or_else(|| Error::Unplannable {
        rule: "schedule",
        detail: "no schedule candidate".to_string(),
    })
}

/// The placed arena: offsets by buffer id (`Some` exactly for arena buffers) and its size.
struct Arena {
    offset_of: Vec<Option<u64>>,
    bytes: u64,
    placement: Placement,
}

/// Places the chosen schedule's arena buffers; across streams they share bytes only where
/// happens-before allows it (`StreamPlan::busy_until`).
fn place_arena(chosen: &Chosen, streams: &StreamPlan, alignment: u64) -> Result<Arena> {
    let buffers = &chosen.buffers;
    let (ids, items): (Vec<usize>, Vec<ArenaItem>) =
        arena_items(buffers, alignment, |b| ArenaItem {
            size: 0,
            start: b.start,
            end: b.end,
            stream: streams.stream(b.start),
            busy_until: streams.busy_until(&b.users, b.end),
        })?
        .into_iter()
        .unzip();
    // The same sizes and lifetimes as the schedule's candidate: its peak is their bound.
    let placement = place_best(&items, chosen.peak)?;
    let mut offset_of = vec![None; buffers.list.len()];
    for (&id, &offset) in ids.iter().zip(&placement.offsets) {
        offset_of[id] = Some(offset);
    }
    Ok(Arena {
        offset_of,
        bytes: arena_size(&items, &placement.offsets),
        placement,
    })
}

/// The arena buffers as (buffer id, item): `item` gives each its lifetime and busy steps; the
/// size is set here, aligned.
fn arena_items(
    buffers: &Buffers,
    alignment: u64,
    item: impl Fn(&BufferInfo) -> ArenaItem,
) -> Result<Vec<(usize, ArenaItem)>> {
    buffers
        .list
        .iter()
        .enumerate()
        .filter(|(_, b)| b.class.in_arena())
        .map(|(id, b)| {
            let size = align_up(b.size, alignment)?;
            Ok((id, ArenaItem { size, ..item(b) }))
        })
        .collect()
}

#[cfg(test)]
#[path = "planner_tests.rs"]
mod tests;
