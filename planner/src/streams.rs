//! Streams, events and happens-before.
//!
//! Assignment: every `all_reduce` runs on the communication stream, stream `n` (one past the
//! `n` compute streams; a program without collectives has none), and nothing else does: NCCL
//! needs each rank to issue its collectives in one order, which one stream in schedule order
//! gives, and the backward computes on while a bucket's gradients are summed. Otherwise, with
//! one stream every step runs on stream 0. With `n > 1`, weight-gradient
//! GEMMs — MatMul results (rounded or not) that flow solely into AdamW grad operands or
//! outputs named `grad.*`, through views, casts, contiguous copies and scales only — and the
//! column sums of bias gradients (`SumToShape` results that flow so) go round-robin on streams
//! `1..n`, each with that chain of ops and the AdamW updates it feeds (a "chain"); so does each
//! other AdamW update, alone (a norm weight's, whose gradient comes with the norm's input
//! gradient), and the embedding update of the rows no id names; everything else stays on
//! stream 0.
//!
//! Events: a step waits for every step it depends on that runs on another stream: the ops
//! that wrote its operands' data (read after write; through a view, the op that wrote the
//! viewed value: a view op moves no data, so waiting for it would be a wasted event) and, when
//! it writes a buffer in place, every earlier step using that buffer (write after
//! read/write). One more kind of wait bounds the
//! work in flight: when a new chain starts on side stream `w`, the next stream-0 step joins
//! `w` up to the end of the chain [`SIDE_LAG`] chains before it. Without joins nothing on stream 0 would ever
//! happen-after side-stream work, so every buffer a chain reads would stay reserved to the
//! end of the run (below); with them a side stream runs at most about [`SIDE_LAG`] chains
//! behind and frees its operands' bytes that many chains later than a serial plan.
//!
//! A producer records at most one event. Per stream we keep a vector clock, the "frontier":
//! `frontier[w]` = k means every step of stream `w` before schedule step k is known to be
//! complete. A dependency already below the frontier (through program order or an earlier
//! wait) needs no wait, and dependencies are visited latest first, so no wait placed is
//! implied by the others.
//!
//! Sharing arena bytes across streams: buffer B may reuse A's bytes only if every step using A
//! happens-before B's first writer (B's other users depend on its first writer, so they follow
//! too). For each stream `t`, [`StreamPlan::busy_until`] gives the last step on `t` that does
//! not happen-after all of A's uses; since frontiers only grow along a stream, every later step
//! on `t` does. Placement lets B (first written at step s on stream t) share A's bytes only if
//! `s > busy_until(A)[t]`. With one stream this is A's own end: plain interval overlap. After
//! the run, the caller synchronizes all streams before reading outputs or copying written
//! values back.

use std::collections::VecDeque;

use kiln_ir::{Alias, EmbeddingRows, Op};

use crate::buffers::Buffers;
use crate::in_place::overwrite_chain;
use crate::program::{Producer, Program, Value};

/// Chains a side stream may run behind stream 0: when its next chain starts, stream 0 joins
/// the end of the chain this many before it. H100, 0.5B bf16-swiglu train on two streams, one
/// call: 1 → 3 took T=512 from 13.65 to 13.12 ms (stream 0 had waited 2.3 ms a step on the
/// joins, eager timeline) and T=2048 from 28.69 to 28.74 ms, the arena the same; 7 gave 13.14
/// and 28.88 ms.
pub(crate) const SIDE_LAG: usize = 3;

/// Streams and events of one schedule.
pub(crate) struct StreamPlan {
    streams: usize,
    communication: Option<usize>,
    stream_of_step: Vec<usize>,
    pub waits: Vec<Vec<usize>>,
    pub records: Vec<Vec<usize>>,
    pub events: usize,
    /// Steps of each stream, ascending.
    steps_on: Vec<Vec<usize>>,
    /// Frontier at the start of each step (after its waits), `streams` entries per step.
    frontier: Vec<usize>,
}

impl StreamPlan {
    /// Assigns streams and events for `program` run in `order` with `streams >= 1` streams.
    pub fn new(program: &Program, order: &[usize], buffers: &Buffers, streams: usize) -> Self {
        let compute = streams.max(1);
        let collectives = (program.ops.iter()).any(|o| matches!(o.op, Op::AllReduce));
        let n = compute + usize::from(collectives);
        let mut step_of_op = vec![0; program.ops.len()];
        for (step, &op) in order.iter().enumerate() {
            step_of_op[op] = step;
        }
        let (stream_of_op, chain_start) = assign_streams(program, order, compute);
        let updated_inputs = updated_inputs(program, buffers);
        let stream_of_step: Vec<usize> = order.iter().map(|&op| stream_of_op[op]).collect();
        let steps = order.len();
        let mut steps_on = vec![Vec::new(); n];
        for (step, &stream) in stream_of_step.iter().enumerate() {
            steps_on[stream].push(step);
        }

        let mut waits = vec![Vec::new(); steps];
        let mut records = vec![Vec::new(); steps];
        let mut event_of_step: Vec<Option<usize>> = vec![None; steps];
        let mut events = 0;
        let mut frontier = vec![0usize; steps * n];
        let mut current = vec![vec![0usize; n]; n];
        // Per stream, its latest step so far; per side stream, the last steps of its chains
        // stream 0 has not joined yet, and the step stream 0 must join.
        let mut last_on: Vec<Option<usize>> = vec![None; n];
        let mut chain_ends: Vec<VecDeque<usize>> = vec![VecDeque::new(); n];
        let mut pending_join: Vec<Option<usize>> = vec![None; n];
        for (step, &op) in order.iter().enumerate() {
            let stream = stream_of_step[step];
            if chain_start[op] && stream != 0 {
                if let Some(previous) = last_on[stream] {
                    chain_ends[stream].push_back(previous);
                }
                if chain_ends[stream].len() >= SIDE_LAG {
                    pending_join[stream] = chain_ends[stream].pop_front();
                }
            }
            last_on[stream] = Some(step);
            // Read after write: the steps that wrote the operands' data.
            let mut depends_on: Vec<usize> = program.ops[op]
                .operands
                .iter()
                .filter_map(|&operand| data_writer(program, operand))
                .map(|writer| step_of_op[writer])
                .collect();
            // Joins of side streams whose next chain has started.
            if stream == 0 {
                depends_on.extend(pending_join.iter_mut().filter_map(Option::take));
            }
            // Write after read/write: every earlier user of a buffer overwritten in place, and of
            // a persistent input the step updates (so that the update may go into the input's
            // own storage: in_place.rs).
            for &b in buffers.overwritten[step].iter().chain(&updated_inputs[op]) {
                depends_on.extend(buffers.list[b].users.iter().take_while(|&&u| u < step));
            }
            let deps = latest_per_stream(&stream_of_step, stream, depends_on);
            let mut known = current[stream].clone();
            for dep in deps {
                let dep_stream = stream_of_step[dep];
                if known[dep_stream] > dep {
                    continue;
                }
                let event = *event_of_step[dep].get_or_insert_with(|| {
                    records[dep].push(events);
                    events += 1;
                    events - 1
                });
                waits[step].push(event);
                let dep_frontier = &frontier[dep * n..(dep + 1) * n];
                for (w, k) in known.iter_mut().enumerate() {
                    let after = if w == dep_stream {
                        dep + 1
                    } else {
                        dep_frontier[w]
                    };
                    *k = (*k).max(after);
                }
            }
            waits[step].sort_unstable();
            frontier[step * n..(step + 1) * n].copy_from_slice(&known);
            known[stream] = step + 1;
            current[stream] = known;
        }
        StreamPlan {
            streams: n,
            communication: collectives.then_some(compute),
            stream_of_step,
            waits,
            records,
            events,
            steps_on,
            frontier,
        }
    }

    /// The communication stream, where the program has collectives.
    pub fn communication(&self) -> Option<usize> {
        self.communication
    }

    /// Stream of the step `step`.
    pub fn stream(&self, step: usize) -> usize {
        self.stream_of_step.get(step).copied().unwrap_or(0)
    }

    /// Whether step `a` finishes before step `b` starts: earlier on the same stream, or below
    /// `b`'s frontier (through its waits and what they bring).
    pub fn happens_before(&self, a: usize, b: usize) -> bool {
        let n = self.streams;
        a < b
            && (self.stream(a) == self.stream(b)
                || self
                    .frontier
                    .get(b * n + self.stream(a))
                    .is_some_and(|&k| k > a))
    }

    /// For a buffer used at `users` (ascending) whose last use is `end`: per stream, the last
    /// step that does not happen-after every use (at least `end`). A buffer first written on
    /// stream `t` after `busy_until[t]` may take its bytes (see the module doc).
    pub fn busy_until(&self, users: &[usize], end: usize) -> Vec<usize> {
        let n = self.streams;
        let mut last_use: Vec<Option<usize>> = vec![None; n];
        for &u in users {
            let s = self.stream(u);
            last_use[s] = Some(last_use[s].map_or(u, |l| l.max(u)));
        }
        let after_all_uses = |step: usize| {
            let known = &self.frontier[step * n..(step + 1) * n];
            last_use
                .iter()
                .zip(known)
                .all(|(u, &k)| u.is_none_or(|u| k > u))
        };
        self.steps_on
            .iter()
            .map(|steps| {
                // Frontiers only grow along a stream, so "after all uses" flips once.
                let unsafe_steps = steps.partition_point(|&s| !after_all_uses(s));
                let last_unsafe = unsafe_steps.checked_sub(1).and_then(|i| steps.get(i));
                last_unsafe.map_or(end, |&s| s.max(end))
            })
            .collect()
    }
}

/// Of `steps` (what a step on `stream` depends on), the latest on each other stream, latest
/// first; an earlier step of the same stream is implied by program order.
fn latest_per_stream(stream_of_step: &[usize], stream: usize, steps: Vec<usize>) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for dep in steps {
        let s = stream_of_step[dep];
        if s == stream {
            continue;
        }
        match out.iter_mut().find(|d| stream_of_step[**d] == s) {
            Some(d) => *d = (*d).max(dep),
            None => out.push(dep),
        }
    }
    out.sort_unstable_by(|a, b| b.cmp(a));
    out
}

/// The op that wrote the bytes `value` reads: its producer, or through views the producer of
/// the viewed value; `None` for graph inputs.
fn data_writer(program: &Program, mut value: Value) -> Option<usize> {
    while let Producer::Op { op, port } = program.values[value].producer {
        let info = &program.ops[op];
        match info.op.alias(port) {
            Alias::ViewOf(i) => value = *info.operands.get(i)?,
            _ => return Some(op),
        }
    }
    None
}

/// Stream of every op (0, a side stream for weight-gradient chains, or the communication
/// stream `n` for collectives; see the module doc) and whether it starts a chain.
fn assign_streams(program: &Program, order: &[usize], n: usize) -> (Vec<usize>, Vec<bool>) {
    let mut stream_of_op: Vec<usize> = (program.ops.iter())
        .map(|o| if matches!(o.op, Op::AllReduce) { n } else { 0 })
        .collect();
    let mut chain_start = vec![false; program.ops.len()];
    if n < 2 {
        return (stream_of_op, chain_start);
    }
    let mut next = 0;
    for &op in order {
        let info = &program.ops[op];
        let root = matches!(
            info.op.unrounded(),
            Op::MatMul { .. } | Op::SumToShape { .. }
        );
        let chain = match (root, info.results.as_slice()) {
            (true, &[result]) => weight_gradient_chain(program, result),
            // An update whose gradient no chain makes (a norm's weight, an embedding table's
            // unnamed rows): alone.
            _ if side_update(info.op) && stream_of_op[op] == 0 => Some(Vec::new()),
            _ => None,
        };
        if let Some(chain) = chain {
            let stream = 1 + next % (n - 1);
            next += 1;
            stream_of_op[op] = stream;
            chain_start[op] = true;
            for member in chain {
                stream_of_op[member] = stream;
            }
        }
    }
    (stream_of_op, chain_start)
}

/// Whether `op` is an update that may run alone on a side stream: AdamW's, and the embedding
/// update of the rows no id names (its named rows' update waits for the whole backward, and
/// is last).
fn side_update(op: &Op) -> bool {
    matches!(
        op,
        Op::AdamW(_)
            | Op::AdamWCopy(_)
            | Op::EmbeddingAdamW {
                rows: EmbeddingRows::Unnamed,
                ..
            }
    )
}

/// Whether `op`, reading its only operand, passes a gradient on unchanged in meaning: a view,
/// a cast (mixed precision rounds weight gradients through bf16), a copy or a scale.
fn passes_gradient_on(op: &Op, port: usize) -> bool {
    match op.alias(0) {
        Alias::ViewOf(i) => i == port,
        _ => port == 0 && matches!(op, Op::Cast { .. } | Op::Contiguous | Op::Scale { .. }),
    }
}

/// If `value` is a parameter gradient — it reaches, through ops that pass it on, nothing but
/// AdamW grad operands and outputs named `grad.*`, at least one of them — the ops on the way
/// and the AdamW updates.
fn weight_gradient_chain(program: &Program, value: Value) -> Option<Vec<usize>> {
    let mut chain = Vec::new();
    let mut sinks = 0;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        let info = &program.values[v];
        if info.is_written {
            return None;
        }
        if info.is_output {
            let mut names = program.outputs.iter().filter(|(_, o)| *o == v);
            if !names.all(|(name, _)| name.starts_with("grad.")) {
                return None;
            }
            sinks += 1;
        }
        for &(reader, port) in &info.readers {
            let reader_info = &program.ops[reader];
            match reader_info.op {
                Op::AdamW(_) | Op::AdamWCopy(_) if port == 1 => sinks += 1,
                op if reader_info.operands.len() == 1
                    && reader_info.results.len() == 1
                    && passes_gradient_on(op, port) =>
                {
                    stack.push(reader_info.results[0]);
                }
                _ => return None,
            }
            chain.push(reader);
        }
    }
    (sinks > 0).then_some(chain)
}

/// By op, the buffers of the persistent inputs it updates: the operand each op of a written
/// value's chain of overwrites may overwrite to compute it.
fn updated_inputs(program: &Program, buffers: &Buffers) -> Vec<Vec<usize>> {
    let mut updated = vec![Vec::new(); program.ops.len()];
    for &(_, value) in &program.writes {
        for (op, operand) in overwrite_chain(program, value) {
            updated[op].push(buffers.of_value[operand]);
        }
    }
    updated
}

#[cfg(test)]
#[path = "streams_tests.rs"]
mod tests;
