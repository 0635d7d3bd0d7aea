//! Buffers and lifetimes for one schedule.
//!
//! Rules (steps are positions in the schedule; lifetimes are inclusive at both ends):
//! - Every graph input is a buffer of class param/input/state living over the whole run.
//! - Every op result is a value. A view (`Alias::ViewOf(i)`) joins operand `i`'s buffer. A
//!   result with `Alias::MayOverwrite(i)` takes over operand `i`'s buffer when that buffer is
//!   an activation that dies at this step (none of its values is read later), has the
//!   result's byte size, is not taken by another result of the same step, and no other operand
//!   of the op reads it through a different value, and the operand is laid out row-major from
//!   the buffer's start (not a transpose or slice view): an in-place elementwise write must
//!   never race a differently indexed read of the same bytes. Otherwise the result gets a
//!   fresh buffer.
//! - An op the backend needs scratch for (`OpInfo::workspace_bytes > 0`) gets a workspace
//!   buffer of that size living only at its step.
//! - A buffer holding a graph output, or a value written to a Param/State, is class output:
//!   outside the arena, alive to the end. Writes are not done in place: the new value lives in
//!   its own output buffer and is copied into the persistent input after the run (which also
//!   keeps every reader of the old value safe, whatever the schedule). Buffers rooted at an
//!   input keep the input's class even when a view of them is an output.
//! - Everything else is an activation. Its lifetime runs from its first writer to the last
//!   step that reads any of its values; views and in-place results extend it.
//! - A buffer's size is its first value's size; `uses` counts operand reads of its values.
//!
//! Ids are given in order of first appearance: inputs in node order, then per step the fresh
//! result buffers in port order, then the workspace.

use kiln_ir::{Alias, InputKind, Op};

use crate::program::{Producer, Program, Value};
use crate::{BufferClass, Error, Result};

/// One buffer for one schedule.
#[derive(Clone, Debug)]
pub(crate) struct BufferInfo {
    pub name: String,
    pub class: BufferClass,
    pub size: u64,
    pub start: usize,
    pub end: usize,
    /// Values stored in it, in the order they joined.
    pub values: Vec<Value>,
    pub uses: usize,
    /// Steps that read or write it, ascending, without repeats.
    pub users: Vec<usize>,
}

/// The buffers of one schedule.
pub(crate) struct Buffers {
    pub list: Vec<BufferInfo>,
    /// Buffer of each value.
    pub of_value: Vec<usize>,
    /// Per step, the buffers a result of that step overwrote in place (for stream hazards).
    pub overwritten: Vec<Vec<usize>>,
}

/// What the builder tracks per buffer beyond `BufferInfo`.
struct Tracking {
    /// The input kind, for buffers rooted at a graph input.
    input: Option<InputKind>,
    /// Some value of it is an output or a write.
    external: bool,
    /// Last step any of its values is read (or it is written).
    last_use: usize,
}

impl Buffers {
    /// Builds the buffers of `program` run in `order` (op indices).
    pub fn build(program: &Program, order: &[usize]) -> Result<Buffers> {
        let steps = order.len();
        let last_step = steps.saturating_sub(1);
        let mut step_of_op = vec![0; program.ops.len()];
        for (step, &op) in order.iter().enumerate() {
            step_of_op[op] = step;
        }
        let last_read: Vec<Option<usize>> = program
            .values
            .iter()
            .map(|v| v.readers.iter().map(|&(op, _)| step_of_op[op]).max())
            .collect();

        let mut list: Vec<BufferInfo> = Vec::new();
        let mut tracking: Vec<Tracking> = Vec::new();
        let mut of_value: Vec<Option<usize>> = vec![None; program.values.len()];
        let mut overwritten = vec![Vec::new(); steps];
        // Whether each value is stored row-major from its buffer's start.
        let mut row_major = vec![true; program.values.len()];

        for input in &program.inputs {
            of_value[input.value] = Some(list.len());
            list.push(BufferInfo {
                name: input.name.to_string(),
                class: input_class(input.kind),
                size: program.value_bytes(input.value),
                start: 0,
                end: last_step,
                values: vec![input.value],
                uses: 0,
                users: Vec::new(),
            });
            tracking.push(Tracking {
                input: Some(input.kind),
                external: false,
                last_use: last_step,
            });
        }

        for (step, &op) in order.iter().enumerate() {
            let info = &program.ops[op];
            let operand_buffers = info
                .operands
                .iter()
                .map(|&v| of_value[v].ok_or_else(|| not_ready(program, v, info.node)))
                .collect::<Result<Vec<usize>>>()?;
            for &b in &operand_buffers {
                add_user(&mut list[b], step);
            }
            for (port, &result) in info.results.iter().enumerate() {
                let result_bytes = program.value_bytes(result);
                let joined = match info.op.alias(port) {
                    Alias::ViewOf(i) => operand_buffers.get(i).copied(),
                    Alias::MayOverwrite(i) => operand_buffers.get(i).copied().filter(|&b| {
                        let t = &tracking[b];
                        let operand = info.operands[i];
                        let dying_activation =
                            t.input.is_none() && !t.external && t.last_use == step;
                        let fits = list[b].size == result_bytes;
                        let untaken = !overwritten[step].contains(&b);
                        // Any other operand in `b` must be this very value (same indexing).
                        let no_other_reading = info
                            .operands
                            .iter()
                            .zip(&operand_buffers)
                            .all(|(&v, &vb)| vb != b || v == operand);
                        dying_activation
                            && fits
                            && untaken
                            && row_major[operand]
                            && no_other_reading
                    }),
                    Alias::Fresh => None,
                };
                let b = match joined {
                    Some(b) => {
                        if !matches!(info.op.alias(port), Alias::ViewOf(_)) {
                            overwritten[step].push(b);
                        }
                        b
                    }
                    None => {
                        list.push(BufferInfo {
                            name: format!("{} %{}.{port}", info.op.name(), info.node),
                            class: BufferClass::Activation,
                            size: result_bytes,
                            start: step,
                            end: step,
                            values: Vec::new(),
                            uses: 0,
                            users: vec![step],
                        });
                        tracking.push(Tracking {
                            input: None,
                            external: false,
                            last_use: step,
                        });
                        list.len() - 1
                    }
                };
                of_value[result] = Some(b);
                row_major[result] = match (info.op, info.op.alias(port)) {
                    (Op::Reshape { .. }, Alias::ViewOf(i)) => {
                        info.operands.get(i).is_some_and(|&v| row_major[v])
                    }
                    (_, Alias::ViewOf(_)) => false,
                    _ => true,
                };
                let buffer = &mut list[b];
                buffer.values.push(result);
                add_user(buffer, step);
                let t = &mut tracking[b];
                t.external |= program.is_external(result);
                t.last_use = t.last_use.max(last_read[result].unwrap_or(step));
            }
            let workspace = info.workspace_bytes;
            if workspace > 0 {
                list.push(BufferInfo {
                    name: format!("{} %{} workspace", info.op.name(), info.node),
                    class: BufferClass::Workspace,
                    size: workspace,
                    start: step,
                    end: step,
                    values: Vec::new(),
                    uses: 0,
                    users: vec![step],
                });
                tracking.push(Tracking {
                    input: None,
                    external: false,
                    last_use: step,
                });
            }
        }

        // Classes, ends and use counts are final only once every value has joined.
        for (buffer, t) in list.iter_mut().zip(&tracking) {
            if buffer.class == BufferClass::Workspace || t.input.is_some() {
                continue;
            }
            if t.external {
                buffer.class = BufferClass::Output;
                buffer.end = last_step;
            } else {
                buffer.end = t.last_use;
            }
        }
        for buffer in &mut list {
            buffer.uses = buffer
                .values
                .iter()
                .map(|&v| program.values[v].readers.len())
                .sum();
        }
        let of_value = of_value
            .into_iter()
            .enumerate()
            .map(|(v, b)| b.ok_or_else(|| never_written(program, v)))
            .collect::<Result<Vec<usize>>>()?;
        name_external(program, &of_value, &mut list);
        Ok(Buffers {
            list,
            of_value,
            overwritten,
        })
    }
}

/// Output buffers are named after the first output (else write) they hold.
fn name_external(program: &Program, of_value: &[usize], list: &mut [BufferInfo]) {
    let mut named = vec![false; list.len()];
    let outputs = program.outputs.iter().map(|&(n, v)| (n.to_string(), v));
    let writes = program
        .writes
        .iter()
        .map(|&(n, v)| (format!("write {n}"), v));
    for (name, value) in outputs.chain(writes) {
        let b = of_value[value];
        if list[b].class == BufferClass::Output && !named[b] {
            named[b] = true;
            list[b].name = name;
        }
    }
}

fn add_user(buffer: &mut BufferInfo, step: usize) {
    if buffer.users.last() != Some(&step) {
        buffer.users.push(step);
    }
}

fn input_class(kind: InputKind) -> BufferClass {
    match kind {
        InputKind::Param => BufferClass::Param,
        InputKind::Input => BufferClass::Input,
        InputKind::State => BufferClass::State,
    }
}

fn not_ready(program: &Program, value: Value, node: usize) -> Error {
    Error::Unplannable {
        rule: "schedule",
        detail: format!(
            "node {node} reads {} before it is computed",
            program.values[value].id
        ),
    }
}

fn never_written(program: &Program, value: Value) -> Error {
    let what = match program.values[value].producer {
        Producer::Input(_) => "an input",
        Producer::Op { .. } => "an op result",
    };
    Error::Unplannable {
        rule: "schedule",
        detail: format!(
            "value {} ({what}) is never computed",
            program.values[value].id
        ),
    }
}

#[cfg(test)]
#[path = "buffers_tests.rs"]
mod tests;
