//! Schedule candidates: topological orders of the op nodes (indices into `Program::ops`).
//!
//! - [`NODE_ORDER`]: the graph's node order (the order the program was traced in).
//! - [`LIST`]: a list scheduler; among the ready ops it runs the one that frees the most arena
//!   bytes minus what it allocates, ties broken by node index.
//! - [`ADAMW_EARLY`] (only for programs with AdamW ops): node order, except that each AdamW op
//!   (and each `all_reduce`) runs as soon as its operands are ready, so a gradient dies right
//!   after its update instead of waiting for the whole backward pass.
//!
//! In every candidate each `all_reduce` then moves up to right after the last producer of its
//! operands ([`collectives_early`]): a data-parallel bucket is summed on the communication
//! stream while the backward computes on, not after it, where the trace appended it.
//!
//! Every candidate is a permutation of the ops in which each op comes after the producers of
//! its operands ([`check_order`] verifies it, so a scheduler bug is an error, not a wrong plan).
//! The planner keeps the candidate with the lowest peak of live arena bytes, ties to the first
//! in [`candidates`]' order.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use kiln_ir::{Alias, Op};

use crate::program::{Program, Value};
use crate::{Error, Result};

pub(crate) const NODE_ORDER: &str = "node-order";
pub(crate) const LIST: &str = "list-free-bytes";
pub(crate) const ADAMW_EARLY: &str = "adamw-early";

/// One schedule candidate.
pub(crate) struct Candidate {
    pub name: &'static str,
    /// Op indices in execution order.
    pub order: Vec<usize>,
}

/// Every candidate for `program`, in the fixed order ties are broken by: [`ADAMW_EARLY`] first
/// where there are updates (where the forward's saved activations set the peak, the
/// candidates tie, and node order would run every update after the whole backward, none of
/// them beside it on a side stream), then [`NODE_ORDER`] and [`LIST`].
pub(crate) fn candidates(program: &Program) -> Vec<Candidate> {
    let mut out = Vec::new();
    if program.ops.iter().any(|o| o.op.adamw().is_some()) {
        out.push(Candidate {
            name: ADAMW_EARLY,
            order: adamw_early(program),
        });
    }
    out.extend([
        Candidate {
            name: NODE_ORDER,
            order: (0..program.ops.len()).collect(),
        },
        Candidate {
            name: LIST,
            order: list_schedule(program),
        },
    ]);
    for candidate in &mut out {
        let order = collectives_early(program, std::mem::take(&mut candidate.order));
        candidate.order = defer_state_updates(program, order);
    }
    out
}

/// Moves each state update to after every other reader of the persistent input it may
/// overwrite, so that a device backend can make the update in that input's own memory (an
/// update of a param must not run before a later op reads the old param). A state update is
/// an op with an `Alias::MayOverwrite(i)` result whose operand `i` is a graph input (read
/// directly or through views). It moves only where it stays before every reader of its
/// results (AdamW's are only written back; the embedding update's unnamed rows are read by
/// its named rows' update), so the order stays topological.
fn defer_state_updates(program: &Program, mut order: Vec<usize>) -> Vec<usize> {
    use crate::program::Producer;
    for op in 0..program.ops.len() {
        let info = &program.ops[op];
        let overwritten: BTreeSet<Value> = (0..info.results.len())
            .filter_map(|port| match info.op.alias(port) {
                Alias::MayOverwrite(i) => info.operands.get(i).copied(),
                _ => None,
            })
            .filter(|&v| matches!(program.values[v].producer, Producer::Input(_)))
            .collect();
        if overwritten.is_empty() {
            continue;
        }
        // The inputs and every view of them.
        let mut family = overwritten;
        for viewer in &program.ops {
            for (port, &result) in viewer.results.iter().enumerate() {
                if let Alias::ViewOf(i) = viewer.op.alias(port) {
                    if viewer.operands.get(i).is_some_and(|v| family.contains(v)) {
                        family.insert(result);
                    }
                }
            }
        }
        let position = |o: usize| order.iter().position(|&x| x == o);
        let Some(at) = position(op) else { continue };
        let last_reader = family
            .iter()
            .flat_map(|&v| &program.values[v].readers)
            .filter(|&&(reader, _)| reader != op)
            .filter_map(|&(reader, _)| position(reader))
            .max();
        let first_result_reader = (info.results.iter())
            .flat_map(|&r| &program.values[r].readers)
            .filter_map(|&(reader, _)| position(reader))
            .min();
        let movable = |last: &usize| *last > at && first_result_reader.is_none_or(|f| *last < f);
        if let Some(last) = last_reader.filter(movable) {
            order.remove(at);
            order.insert(last, op);
        }
    }
    order
}

/// Checks that `order` runs every op once, after the producers of its operands.
pub(crate) fn check_order(program: &Program, name: &str, order: &[usize]) -> Result<()> {
    let unplannable = |detail: String| Error::Unplannable {
        rule: "schedule",
        detail: format!("schedule `{name}`: {detail}"),
    };
    let mut done = vec![false; program.ops.len()];
    for &op in order {
        let info = program
            .ops
            .get(op)
            .ok_or_else(|| unplannable(format!("op {op} does not exist")))?;
        if std::mem::replace(&mut done[op], true) {
            return Err(unplannable(format!("node {} runs twice", info.node)));
        }
        if let Some(barrier) = program.barrier.filter(|&b| op > b && !done[b]) {
            return Err(unplannable(format!(
                "node {} runs before node {}, which every later node follows",
                info.node, program.ops[barrier].node
            )));
        }
        for &operand in &info.operands {
            if program.producing_op(operand).is_some_and(|p| !done[p]) {
                return Err(unplannable(format!(
                    "node {} runs before the producer of {}",
                    info.node, program.values[operand].id
                )));
            }
        }
    }
    match done.iter().position(|d| !d) {
        Some(op) => Err(unplannable(format!(
            "node {} never runs (a cycle?)",
            program.ops[op].node
        ))),
        None => Ok(()),
    }
}

/// How many operand edges of each op come from ops (not graph inputs).
fn pending_operands(program: &Program) -> Vec<usize> {
    (program.ops.iter().enumerate())
        .map(|(op, info)| {
            let operands = (info.operands.iter())
                .filter(|&&v| program.producing_op(v).is_some())
                .count();
            operands + usize::from(program.behind_barrier(op))
        })
        .collect()
}

/// Marks `op` done and returns the ops its results made ready (all operands done), in the
/// order of the reading edges.
fn finish(program: &Program, pending: &mut [usize], op: usize) -> Vec<usize> {
    let mut ready = Vec::new();
    for &result in &program.ops[op].results {
        for &(reader, _) in &program.values[result].readers {
            pending[reader] -= 1;
            if pending[reader] == 0 {
                ready.push(reader);
            }
        }
    }
    if program.barrier == Some(op) {
        for (later, count) in pending.iter_mut().enumerate().skip(op + 1) {
            *count -= 1;
            if *count == 0 {
                ready.push(later);
            }
        }
    }
    ready
}

/// Node order, with each AdamW pulled forward to the moment its operands are ready.
fn adamw_early(program: &Program) -> Vec<usize> {
    let is_adamw = |op: usize| {
        let op = &program.ops[op].op;
        op.adamw().is_some() || matches!(op, Op::AllReduce)
    };
    let mut pending = pending_operands(program);
    let mut order = Vec::with_capacity(program.ops.len());
    // AdamW ops ready to run, smallest node first.
    let mut ready_updates: BTreeSet<usize> = (0..program.ops.len())
        .filter(|&op| is_adamw(op) && pending[op] == 0)
        .collect();
    let mut plain_ops = (0..program.ops.len()).filter(|&op| !is_adamw(op));
    // A ready update always goes first; otherwise the next op in node order.
    while let Some(op) = ready_updates.pop_first().or_else(|| plain_ops.next()) {
        order.push(op);
        let ready = finish(program, &mut pending, op);
        ready_updates.extend(ready.into_iter().filter(|&r| is_adamw(r)));
    }
    order
}

/// `order` with each `all_reduce` moved up to right after the last producer of its operands;
/// collectives ready at once go in their order in `order`. Each still follows its producers, so
/// the order stays topological. (The ranks issue their collectives alike because every rank
/// plans the same graph, and planning is deterministic.)
fn collectives_early(program: &Program, order: Vec<usize>) -> Vec<usize> {
    let is_collective = |op: usize| matches!(program.ops[op].op, Op::AllReduce);
    if !order.iter().any(|&op| is_collective(op)) {
        return order;
    }
    let mut pending = pending_operands(program);
    // Ready collectives by their place in `order`.
    let place: std::collections::BTreeMap<usize, usize> =
        order.iter().enumerate().map(|(at, &op)| (op, at)).collect();
    let mut ready: BTreeSet<(usize, usize)> = (order.iter().copied())
        .filter(|&op| is_collective(op) && pending[op] == 0)
        .map(|op| (place[&op], op))
        .collect();
    let mut out = Vec::with_capacity(order.len());
    let mut rest = order.iter().copied().filter(|&op| !is_collective(op));
    while let Some((_, op)) = ready.pop_first().or_else(|| rest.next().map(|op| (0, op))) {
        out.push(op);
        let now_ready = finish(program, &mut pending, op);
        ready.extend((now_ready.into_iter().filter(|&r| is_collective(r))).map(|r| (place[&r], r)));
    }
    out
}

/// Storage groups for the list scheduler: a value and the views of it share one group (its
/// root value). A group costs arena bytes unless its root is a graph input or one of its
/// values leaves the arena (an output or a write).
struct Groups {
    /// Root value of each value.
    root: Vec<Value>,
    /// Arena bytes of each group, indexed by root value (0 for non-roots).
    bytes: Vec<u64>,
    /// Distinct ops reading any value of each group, ascending, indexed by root value.
    readers: Vec<Vec<usize>>,
}

impl Groups {
    fn new(program: &Program) -> Self {
        let count = program.values.len();
        let mut root: Vec<Value> = (0..count).collect();
        for info in &program.ops {
            for (port, &result) in info.results.iter().enumerate() {
                if let Alias::ViewOf(i) = info.op.alias(port) {
                    if let Some(&operand) = info.operands.get(i) {
                        root[result] = root[operand];
                    }
                }
            }
        }
        let mut bytes = vec![0u64; count];
        let mut external = vec![false; count];
        for value in 0..count {
            external[root[value]] |= program.is_external(value);
        }
        for value in 0..count {
            if root[value] == value && program.producing_op(value).is_some() && !external[value] {
                bytes[value] = program.value_bytes(value);
            }
        }
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (value, info) in program.values.iter().enumerate() {
            readers[root[value]].extend(info.readers.iter().map(|&(op, _)| op));
        }
        for list in &mut readers {
            list.sort_unstable();
            list.dedup();
        }
        Groups {
            root,
            bytes,
            readers,
        }
    }
}

/// Greedy list scheduling by net freed bytes. Scores change only when a group drops to one
/// remaining reader, so each op's score is updated in place in an ordered set, O(E log N).
fn list_schedule(program: &Program) -> Vec<usize> {
    let groups = Groups::new(program);
    let op_count = program.ops.len();
    // Distinct groups each op reads.
    let groups_read: Vec<Vec<Value>> = program
        .ops
        .iter()
        .map(|info| {
            let mut read: Vec<Value> = info.operands.iter().map(|&v| groups.root[v]).collect();
            read.sort_unstable();
            read.dedup();
            read
        })
        .collect();
    // Bytes each op allocates: its results that are not views (in-place results are counted
    // too; the operand they take over is then counted as freed, so the net is the same).
    let allocated: Vec<i128> = program
        .ops
        .iter()
        .map(|info| {
            info.results
                .iter()
                .filter(|&&r| groups.root[r] == r)
                .map(|&r| i128::from(groups.bytes[r]))
                .sum()
        })
        .collect();
    let mut remaining: Vec<usize> = groups.readers.iter().map(Vec::len).collect();
    let mut done = vec![false; op_count];
    let score = |op: usize, remaining: &[usize]| -> i128 {
        let freed: i128 = groups_read[op]
            .iter()
            .filter(|&&g| remaining[g] == 1)
            .map(|&g| i128::from(groups.bytes[g]))
            .sum();
        freed - allocated[op]
    };
    let mut pending = pending_operands(program);
    // Ready ops by (highest score, lowest index); `current` holds each ready op's key.
    let mut ready: BTreeSet<(Reverse<i128>, usize)> = BTreeSet::new();
    let mut current: Vec<Option<i128>> = vec![None; op_count];
    for op in (0..op_count).filter(|&op| pending[op] == 0) {
        let s = score(op, &remaining);
        current[op] = Some(s);
        ready.insert((Reverse(s), op));
    }
    let mut order = Vec::with_capacity(op_count);
    while let Some((_, op)) = ready.pop_first() {
        current[op] = None;
        done[op] = true;
        order.push(op);
        for &g in &groups_read[op] {
            remaining[g] -= 1;
            if remaining[g] != 1 {
                continue;
            }
            // The last reader of `g` now frees it: rescore it if it is ready.
            let last = groups.readers[g].iter().copied().find(|&r| !done[r]);
            if let Some(last) = last {
                if let Some(old) = current[last] {
                    ready.remove(&(Reverse(old), last));
                    let s = score(last, &remaining);
                    current[last] = Some(s);
                    ready.insert((Reverse(s), last));
                }
            }
        }
        for reader in finish(program, &mut pending, op) {
            let s = score(reader, &remaining);
            current[reader] = Some(s);
            ready.insert((Reverse(s), reader));
        }
    }
    order
}

#[cfg(test)]
#[path = "schedule_tests.rs"]
mod tests;
