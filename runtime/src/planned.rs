//! The planned CPU executor: runs a [`Graph`] as its [`Plan`] says, with every activation and
//! workspace in ONE host arena at the plan's byte offsets, and gives bit for bit what
//! [`interpret`](crate::interpret) gives.
//!
//! Invariants:
//! 1. Same kernels, same arguments, same order of arithmetic: each kernel step calls the
//!    interpreter's one op table (`interpret::ops::run_op`), in `plan.schedule` order (checked
//!    topological as it runs), on views with the layouts the interpreter's tensors would have
//!    (`placed/layout.rs`). Kernels overwrite their results, so where a result is placed does
//!    not change its bits.
//! 2. Inputs are bound and checked exactly as the interpreter binds them; the plan is checked
//!    against the graph before any step runs (`placed/plan.rs`, then `planned/placement.rs`):
//!    a mismatch (a step or value the graph lacks, a value without a buffer, a buffer outside
//!    the arena, a missing or small workspace) is an error, never a panic.
//! 3. The arena is one 8-byte aligned allocation of `plan.arena_bytes`; a buffer is the bytes
//!    `offset..offset + size` of it, seen as typed elements through `bytemuck` (no unsafe
//!    code). A step writes only its results' and workspace's bytes, as disjoint slices; its
//!    operands may not overlap them, except an in-place result's own operand, which is copied
//!    first (`planned/step.rs`).
//! 4. Nothing bound in `values` is written during the run; after the last step, each named
//!    output is copied out of its buffer into a fresh tensor, and each write replaces
//!    `values[name]` with a fresh tensor, as in the interpreter. An error anywhere leaves
//!    `values` as it was.
//! 5. Poison mode checks the plan's lifetimes: the arena (and every output buffer) starts
//!    filled with the byte 0xFF, and after each step but the last, the arena bytes of every
//!    buffer whose lifetime ends there are filled with it again. 0xFF bytes are a NaN in every
//!    float dtype, so a value read after its buffer died, or clobbered by a buffer the plan
//!    wrongly overlaps with it, breaks bit-equality with the interpreter.
//!
//! Steps run one at a time in schedule order; streams and events are ignored (a serial run in
//! schedule order respects every event). Lifetimes are in schedule steps, so poisoning after a
//! buffer's last step is right for multi-stream plans too.

pub(crate) mod executable;
mod memory;
mod placement;
mod step;

use std::collections::BTreeMap;

use kiln_ir::{Graph, ValueId};
use kiln_planner::Plan;

use crate::device::Device;
use crate::error::Result;
use crate::interpret::{bound_inputs, check_write, type_of};
use crate::placed::bytes::read_view;
use crate::placed::{plan_error, Layouts};
use crate::tensor::Tensor;
pub use executable::CpuExecutable;
use memory::{bound_view, Memory};
use placement::{Home, Placement};

/// Runs `graph` as `plan` places it, on the inputs bound in `values` (by input name); returns
/// the named outputs and applies the graph's writes to `values`, exactly as
/// [`interpret`](crate::interpret) does. With `poison`, dead arena bytes are filled with 0xFF
/// (see the module doc), so a plan whose lifetimes or offsets are wrong gives different bits.
pub fn execute(
    graph: &Graph,
    plan: &Plan,
    values: &mut BTreeMap<String, Tensor>,
    poison: bool,
) -> Result<BTreeMap<String, Tensor>> {
    let bound = bound_inputs(graph, values)?;
    let placement = Placement::read(graph, plan, &bound)?;
    let mut memory = Memory::new(&placement, poison)?;
    let mut layouts: Layouts = placement.inputs.iter().cloned().collect();
    for index in 0..plan.schedule.len() {
        step::run_step(graph, plan, &placement, &mut memory, &mut layouts, index)?;
        if poison {
            for range in placement.dying.get(&index).into_iter().flatten() {
                memory.poison(0, range.clone());
            }
        }
    }

    let mut outputs = BTreeMap::new();
    for (name, value) in graph.outputs() {
        let tensor = copy_out(plan, &placement, &memory, &layouts, *value, name)?;
        outputs.insert(name.clone(), tensor);
    }
    let mut writes = Vec::with_capacity(graph.writes().len());
    for (name, value) in graph.writes() {
        let tensor = copy_out(plan, &placement, &memory, &layouts, *value, name)?;
        check_write(graph, name, *value, &type_of(&tensor))?;
        writes.push((name.clone(), tensor));
    }
    // Only now, with nothing left to fail, are the persistent values replaced.
    values.extend(writes);
    Ok(outputs)
}

/// A fresh contiguous tensor holding `value` as it is after the last step.
fn copy_out(
    plan: &Plan,
    placement: &Placement,
    memory: &Memory,
    layouts: &Layouts,
    value: ValueId,
    name: &str,
) -> Result<Tensor> {
    let key = (value.node.index(), value.port);
    let (Some(layout), Some(&buffer)) = (layouts.get(&key), placement.buffer_of.get(&key)) else {
        let reason = format!("value {value} is never computed");
        return Err(plan_error(plan, format!("`{name}`"), reason));
    };
    let out = Tensor::zeros(layout.shape().clone(), layout.dtype, Device::Cpu);
    match &placement.homes[buffer] {
        Home::Region { region, range } => {
            let source = read_view(memory.bytes(*region, range.clone()), layout)?;
            out.write_with(|mut dst| kiln_kernels::copy::copy(&source, &mut dst))??;
        }
        Home::Bound(tensor) => {
            let guard = tensor.storage().read()?;
            let source = bound_view(&guard, layout)?;
            out.write_with(|mut dst| kiln_kernels::copy::copy(&source, &mut dst))??;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
