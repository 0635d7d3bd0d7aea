//! `plan`: from a graph and options to a [`Plan`].
//!
//! 1. Verify the graph (the IR verifier) and the options.
//! 2. Build buffers for every schedule candidate; keep the one with the lowest peak of live
//!    arena bytes (ties to the earlier candidate).
//! 3. Assign streams and events for the winner.
//! 4. Place arena buffers (activations and workspaces) with every offset heuristic, sharing
//!    bytes only where happens-before allows it across streams; keep the smallest arena.
//! 5. Assemble the plan in its fixed orders and hash it.
//!
//! `lower_bound_bytes` is the peak of live (aligned) arena bytes over the schedule's steps,
//! from the buffers' own `[start, end]`. With several streams buffers stay busy until later
//! steps know they are done, so the arena may exceed the bound by what concurrency costs; it
//! never falls below.

use crate::buffers::{BufferInfo, Buffers};
use crate::hash::plan_hash;
use crate::offsets::{align_up, arena_size, lower_bound, place_best, ArenaItem};
use crate::program::Program;
use crate::schedule::{candidates, check_order};
use crate::streams::StreamPlan;
use crate::{Buffer, BufferClass, Error, Plan, PlanOptions, Result, Step};

/// Plans `graph` with `options`. Same graph and options give the same plan, byte for byte.
pub fn plan(graph: &kiln_ir::Graph, options: &PlanOptions) -> Result<Plan> {
    if options.streams == 0 {
        return Err(Error::Option {
            option: "streams",
            detail: "must be at least 1".to_string(),
        });
    }
    if options.alignment == 0 {
        return Err(Error::Option {
            option: "alignment",
            detail: "must be at least 1 byte".to_string(),
        });
    }
    kiln_ir::verify(graph)?;
    let program = Program::new(graph)?;

    let mut best: Option<(&'static str, Vec<usize>, Buffers, u64)> = None;
    for candidate in candidates(&program) {
        check_order(&program, candidate.name, &candidate.order)?;
        let buffers = Buffers::build(&program, &candidate.order)?;
        let items = arena_items(&buffers, options.alignment, |b| {
            ArenaItem::serial(0, b.start, b.end)
        })?;
        let peak = lower_bound(&items.into_iter().map(|(_, i)| i).collect::<Vec<_>>())?;
        if best.as_ref().is_none_or(|(_, _, _, p)| peak < *p) {
            best = Some((candidate.name, candidate.order, buffers, peak));
        }
    }
    let Some((schedule_strategy, order, buffers, lower_bound_bytes)) = best else {
        return Err(Error::Unplannable {
            rule: "schedule",
            detail: "no schedule candidate".to_string(),
        });
    };

    let streams = StreamPlan::new(&program, &order, &buffers, options.streams);
    let placement = arena_items(&buffers, options.alignment, |b| ArenaItem {
        size: 0,
        start: b.start,
        end: b.end,
        stream: streams.stream(b.start),
        busy_until: streams.busy_until(&b.users, b.end),
    })?;
    let ids: Vec<usize> = placement.iter().map(|(id, _)| *id).collect();
    let items: Vec<ArenaItem> = placement.into_iter().map(|(_, i)| i).collect();
    let placed = place_best(&items)?;
    let arena_bytes = arena_size(&items, &placed.offsets);
    let mut offset_of = vec![None; buffers.list.len()];
    for (&id, &offset) in ids.iter().zip(&placed.offsets) {
        offset_of[id] = Some(offset);
    }

    let schedule = order
        .iter()
        .enumerate()
        .map(|(step, &op)| Step {
            node: program.ops[op].node,
            op: program.ops[op].op.to_string(),
            stream: streams.stream_of_step[step],
            waits: streams.waits[step].clone(),
            records: streams.records[step].clone(),
        })
        .collect();
    let value_name = |v: usize| {
        let id = program.values[v].id;
        format!("{}.{}", id.node.index(), id.port)
    };
    let plan_buffers = buffers
        .list
        .iter()
        .enumerate()
        .map(|(id, b)| Buffer {
            id,
            name: b.name.clone(),
            class: b.class,
            size: b.size,
            offset: offset_of[id],
            start: b.start,
            end: b.end,
            stream: match b.class {
                // Inputs exist before the run; stream 0 by convention.
                BufferClass::Param | BufferClass::Input | BufferClass::State => 0,
                _ => streams.stream_of_step.get(b.start).copied().unwrap_or(0),
            },
            values: b.values.iter().map(|&v| value_name(v)).collect(),
            uses: b.uses,
        })
        .collect();
    // Values are numbered in node order then port, which is the order the plan lists them.
    let value_buffers = buffers
        .of_value
        .iter()
        .enumerate()
        .map(|(v, &b)| (value_name(v), b))
        .collect();

    let mut plan = Plan {
        program: graph.name().to_string(),
        options: options.clone(),
        schedule,
        buffers: plan_buffers,
        value_buffers,
        arena_bytes,
        lower_bound_bytes,
        schedule_strategy: schedule_strategy.to_string(),
        offset_strategy: placed.strategy,
        offset_candidates: placed.candidates,
        events: streams.events,
        hash: String::new(),
    };
    plan.hash = plan_hash(&plan)?;
    Ok(plan)
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
