//! Running one schedule step: the op's operands as read views and its results (and workspace)
//! as write views over the run's memory, then the one op table, [`run_op`].
//!
//! A view op (reshape, transpose, slice) runs nothing: its result's layout is derived from its
//! operand's, in the same buffer. Every other result is written contiguous from the start of its
//! buffer. An operand in the buffer of one of the step's results (an in-place result,
//! `Alias::MayOverwrite`) is first copied into a scratch allocation and read from there: the
//! CPU reference kernels never see aliased operands. (GPU kernels will write in place.)

use kiln_ir::{Graph, Op};
use kiln_kernels::{TensorView, TensorViewMut};
use kiln_planner::Plan;

use super::memory::{bound_view, Memory};
use super::placement::{Home, Placement};
use crate::error::{Error, Result};
use crate::interpret::ops::run_op;
use crate::placed::bytes::{self, read_view, write_view};
use crate::placed::{describe, plan_error, Layouts, StepOperands, Value, ValueLayout};
use crate::storage::StorageRead;

/// Runs step `index` of `plan` and records its results' layouts.
pub(super) fn run_step(
    graph: &Graph,
    plan: &Plan,
    placement: &Placement,
    memory: &mut Memory,
    layouts: &mut Layouts,
    index: usize,
) -> Result<()> {
    let StepOperands {
        node: node_index,
        op,
        operands,
        types,
    } = StepOperands::read(graph, plan, layouts, index)?;
    let what = || format!("step {index} (node %{node_index} {op})");
    let results: Vec<Value> = (0..types.len()).map(|port| (node_index, port)).collect();
    let failed = |source: Error| Error::Node {
        node: node_index,
        op: op.to_string(),
        source: Box::new(source),
    };

    if let Some((value, layout)) = operands.first() {
        let buffer = placement.buffer_of[value];
        if let Some(view) = layout.view(op, capacity(placement, buffer, layout)) {
            if placement.buffer_of[&results[0]] != buffer {
                let reason = "is a view, but the plan puts it in another buffer than its operand";
                return Err(plan_error(plan, what(), reason.to_string()));
            }
            layouts.insert(results[0], view.map_err(failed)?);
            return Ok(());
        }
    }

    let kernel = Kernel {
        plan,
        placement,
        op,
        what: &what,
    };
    let result_layouts: Vec<ValueLayout> = types.iter().map(ValueLayout::contiguous).collect();
    kernel
        .run(memory, index, &operands, &results, &result_layouts)
        .map_err(|e| match e {
            e @ Error::Graph { .. } => e,
            other => failed(other),
        })?;
    layouts.extend(results.into_iter().zip(result_layouts));
    Ok(())
}

/// Elements of `layout`'s dtype that `buffer`'s home holds.
fn capacity(placement: &Placement, buffer: usize, layout: &ValueLayout) -> usize {
    match &placement.homes[buffer] {
        Home::Region { range, .. } => range.len() / layout.dtype.size_bytes(),
        Home::Bound(tensor) => tensor.storage().len(),
    }
}

/// Where a kernel step reads an operand from.
enum Source<'m> {
    /// A copy of the operand's buffer (`.1` bytes), taken before the step writes that buffer.
    Scratch(Vec<u64>, usize),
    /// The bound tensor's storage.
    Bound(StorageRead<'m>),
    /// Bytes `range` of region `.0`: the home of buffer `.2`.
    Region(usize, std::ops::Range<usize>, usize),
}

/// One kernel step's context.
struct Kernel<'p> {
    plan: &'p Plan,
    placement: &'p Placement,
    op: &'p Op,
    what: &'p dyn Fn() -> String,
}

impl Kernel<'_> {
    fn fail(&self, reason: String) -> Error {
        plan_error(self.plan, (self.what)(), reason)
    }

    /// Runs the op's kernels with `results` laid out as `result_layouts`.
    fn run(
        &self,
        memory: &mut Memory,
        index: usize,
        operands: &[(Value, ValueLayout)],
        results: &[Value],
        result_layouts: &[ValueLayout],
    ) -> Result<()> {
        let placement = self.placement;
        let result_buffers: Vec<usize> = results.iter().map(|v| placement.buffer_of[v]).collect();
        // Where the step writes: each result's buffer, then the workspace.
        let mut writes = Vec::new();
        for (port, &buffer) in result_buffers.iter().enumerate() {
            if result_buffers[..port].contains(&buffer) {
                let reason = format!("puts two of its results in buffer {buffer}");
                return Err(self.fail(reason));
            }
            match &placement.homes[buffer] {
                Home::Region { region, range } => writes.push((*region, range.clone())),
                Home::Bound(_) => {
                    // Placement gives every buffer that holds an op result a region.
                    let reason = format!("writes result {port} into bound buffer {buffer}");
                    return Err(self.fail(reason));
                }
            }
        }
        let workspace = placement.workspace.get(&index).copied();
        if let Some(buffer) = workspace {
            if let Home::Region { region, range } = &placement.homes[buffer] {
                writes.push((*region, range.clone()));
            }
        }

        // Where each operand is read from; in-place operands from a copy taken before anything
        // is written.
        let sources: Vec<Source<'_>> = (operands.iter())
            .map(|(value, _)| {
                let buffer = placement.buffer_of[value];
                Ok(match &placement.homes[buffer] {
                    Home::Region { region, range } if result_buffers.contains(&buffer) => {
                        let mut copy = bytes::aligned_zeros(range.len());
                        let source = memory.bytes(*region, range.clone());
                        bytes::prefix_mut(&mut copy, range.len()).copy_from_slice(source);
                        Source::Scratch(copy, range.len())
                    }
                    Home::Region { region, range } => {
                        Source::Region(*region, range.clone(), buffer)
                    }
                    Home::Bound(tensor) => Source::Bound(tensor.storage().read()?),
                })
            })
            .collect::<Result<_>>()?;

        let named: Vec<usize> = result_buffers.iter().chain(&workspace).copied().collect();
        let carved = memory.carve(&writes).map_err(|(a, b)| {
            let (a, b) = (&self.plan.buffers[named[a]], &self.plan.buffers[named[b]]);
            let reason = if a.id == b.id {
                format!("writes {} past the end of its memory", describe(a))
            } else {
                format!(
                    "writes {} and {}, whose bytes overlap",
                    describe(a),
                    describe(b)
                )
            };
            self.fail(reason)
        })?;
        let mut views: Vec<TensorView<'_>> = Vec::with_capacity(operands.len());
        for (port, ((_, layout), source)) in operands.iter().zip(&sources).enumerate() {
            let view = match source {
                Source::Scratch(copy, len) => {
                    read_view(&bytemuck::cast_slice::<u64, u8>(copy)[..*len], layout)?
                }
                Source::Bound(guard) => bound_view(guard, layout)?,
                Source::Region(region, range, buffer) => {
                    let bytes = carved.shared(*region, range).ok_or_else(|| {
                        let reason = format!(
                            "reads operand {port} from {}, whose bytes overlap a buffer this \
                             step writes",
                            describe(&self.plan.buffers[*buffer])
                        );
                        self.fail(reason)
                    })?;
                    read_view(bytes, layout)?
                }
            };
            views.push(view);
        }
        let mut pieces = carved.writes.into_iter();
        let mut outs: Vec<TensorViewMut<'_>> = Vec::with_capacity(results.len());
        for layout in result_layouts {
            let piece = pieces
                .next()
                .ok_or_else(|| self.fail("lost a result".into()))?;
            outs.push(write_view(piece, layout)?);
        }
        let workspace: &mut [u8] = pieces.next().unwrap_or_default();
        run_op(self.op, &views, &mut outs, workspace)?;
        Ok(())
    }
}
