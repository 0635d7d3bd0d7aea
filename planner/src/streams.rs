//! Streams, events and happens-before.
//!
//! Assignment: with one stream every step runs on stream 0. With `n > 1`, weight-gradient
//! GEMMs — MatMul results that flow (through views only) solely into AdamW grad operands or
//! into outputs named `grad.*` — go round-robin on streams `1..n`, together with those views
//! and AdamW updates; everything else stays on stream 0.
//!
//! Events: a step waits for every step it depends on that runs on another stream: the
//! producers of its operands (read after write) and, when it writes a buffer in place, every
//! earlier step using that buffer (write after read/write). A producer records at most one
//! event. Per stream we keep a vector clock, the "frontier": `frontier[w]` = k means every step
//! of stream `w` before schedule step k is known to be complete. A dependency whose producer is
//! already below the frontier (through program order or an earlier wait) needs no wait, and
//! dependencies are visited latest first, so no wait placed is implied by the others.
//!
//! Sharing arena bytes across streams: buffer B may reuse A's bytes only if every step using A
//! happens-before B's first writer. Placement works on intervals, so A's interval is extended
//! to [`StreamPlan::safe_end`]: the last step, on any stream, that does not yet happen-after
//! every use of A. Every later step happens-after all of A's uses, which is exactly what a
//! later buffer placed over A's bytes needs (its other users depend on its first writer).
//! With one stream this is A's own end. After the run, the caller synchronizes all streams
//! before reading outputs or copying written values back.

use kiln_ir::{Alias, Op};

use crate::buffers::Buffers;
use crate::program::{Program, Value};

/// Streams and events of one schedule.
pub(crate) struct StreamPlan {
    streams: usize,
    pub stream_of_step: Vec<usize>,
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
        let n = streams.max(1);
        let mut step_of_op = vec![0; program.ops.len()];
        for (step, &op) in order.iter().enumerate() {
            step_of_op[op] = step;
        }
        let stream_of_op = assign_streams(program, order, n);
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
        for (step, &op) in order.iter().enumerate() {
            let stream = stream_of_step[step];
            // Latest dependency on each other stream.
            let mut latest: Vec<Option<usize>> = vec![None; n];
            let mut depend = |dep: usize| {
                let s = stream_of_step[dep];
                if s != stream && latest[s].is_none_or(|l| l < dep) {
                    latest[s] = Some(dep);
                }
            };
            for &operand in &program.ops[op].operands {
                if let Some(producer) = program.producing_op(operand) {
                    depend(step_of_op[producer]);
                }
            }
            for &b in &buffers.overwritten[step] {
                for &user in buffers.list[b].users.iter().take_while(|&&u| u < step) {
                    depend(user);
                }
            }
            let mut deps: Vec<usize> = latest.into_iter().flatten().collect();
            deps.sort_unstable_by(|a, b| b.cmp(a));
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
            stream_of_step,
            waits,
            records,
            events,
            steps_on,
            frontier,
        }
    }

    /// The end of the interval a buffer used at `users` (ascending, non-empty for arena
    /// buffers) and ending at `end` must keep in placement: the last step, on any stream, that
    /// does not happen-after all of its uses (see the module doc).
    pub fn safe_end(&self, users: &[usize], end: usize) -> usize {
        let n = self.streams;
        let mut last_use: Vec<Option<usize>> = vec![None; n];
        for &u in users {
            let s = self.stream_of_step[u];
            last_use[s] = Some(last_use[s].map_or(u, |l| l.max(u)));
        }
        let after_all_uses = |step: usize| {
            let known = &self.frontier[step * n..(step + 1) * n];
            last_use
                .iter()
                .zip(known)
                .all(|(u, &k)| u.is_none_or(|u| k > u))
        };
        let mut safe_end = end;
        for steps in &self.steps_on {
            // Frontiers only grow along a stream, so "after all uses" flips once.
            let unsafe_steps = steps.partition_point(|&s| !after_all_uses(s));
            if let Some(&last_unsafe) = unsafe_steps.checked_sub(1).and_then(|i| steps.get(i)) {
                safe_end = safe_end.max(last_unsafe);
            }
        }
        safe_end
    }
}

/// Stream of every op: 0, or a side stream for weight-gradient chains (see the module doc).
fn assign_streams(program: &Program, order: &[usize], n: usize) -> Vec<usize> {
    let mut stream_of_op = vec![0; program.ops.len()];
    if n < 2 {
        return stream_of_op;
    }
    let mut next = 0;
    for &op in order {
        let info = &program.ops[op];
        if !matches!(info.op, Op::MatMul { .. }) || info.results.len() != 1 {
            continue;
        }
        if let Some(chain) = weight_gradient_chain(program, info.results[0]) {
            let stream = 1 + next % (n - 1);
            next += 1;
            stream_of_op[op] = stream;
            for member in chain {
                stream_of_op[member] = stream;
            }
        }
    }
    stream_of_op
}

/// If `value` is a parameter gradient — it reaches, through views only, nothing but AdamW grad
/// operands and outputs named `grad.*`, at least one of them — the view and AdamW ops on the
/// way.
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
                Op::AdamW(_) if port == 1 => sinks += 1,
                op if reader_info.results.len() == 1 && op.alias(0) == Alias::ViewOf(port) => {
                    stack.push(reader_info.results[0]);
                }
                _ => return None,
            }
            chain.push(reader);
        }
    }
    (sinks > 0).then_some(chain)
}

#[cfg(test)]
#[path = "streams_tests.rs"]
mod tests;
