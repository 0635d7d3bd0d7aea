//! One program's memory layout inside an executable: its [`Placement`] plus the static slots
//! of its inputs and outputs and its scratch region, each region numbered as the program's own
//! memory would number them (region 0 the arena) until [`Slots::renumber`] moves them into a
//! group's memory.

use kiln_ir::{Graph, TensorType};
use kiln_planner::Plan;

use super::super::placement::{Home, Placement};
use super::launch::Span;
use super::record::{aligned, span_of};
use crate::device::Device;
use crate::error::Result;
use crate::placed::Value;
use crate::tensor::Tensor;

/// A graph input's static slot.
pub(super) struct InputSlot {
    pub name: String,
    pub ty: TensorType,
    pub slot: Span,
    /// Where the steps see the input when the plan writes its buffer in place.
    pub working: Option<Span>,
}

/// A graph output's static slot.
pub(super) struct OutputSlot {
    pub name: String,
    pub ty: TensorType,
    pub value: Value,
    pub slot: Span,
}

/// A program's placement and slots (see the module doc).
pub(super) struct Slots {
    pub placement: Placement,
    pub inputs: Vec<InputSlot>,
    pub outputs: Vec<OutputSlot>,
    /// The region that holds in-place operands' copies and staged writes.
    pub scratch: usize,
}

impl Slots {
    /// Places `plan` for `graph`: the plan's regions (arena, output buffers, working copies of
    /// inputs written in place), then one slot per graph input and per output, contiguous, of
    /// its type, then the scratch region.
    pub fn read(graph: &Graph, plan: &Plan) -> Result<Self> {
        // Placement reads the inputs' layouts from bound tensors: contiguous ones of their
        // types, which is what the slots hold.
        let bound: Vec<_> = (graph.inputs().into_iter())
            .map(|(value, _, _, ty)| {
                (
                    value,
                    Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu),
                )
            })
            .collect();
        let mut placement = Placement::read(graph, plan, &bound)?;
        // Working copies are filled from the slots at each run, not from these tensors.
        placement.copies.clear();
        let region = |placement: &mut Placement, bytes: usize| {
            placement.region_bytes.push(bytes);
            Span {
                region: placement.region_bytes.len() - 1,
                range: 0..bytes,
            }
        };

        let mut inputs = Vec::new();
        for (value, name, _, ty) in graph.inputs() {
            let slot = region(&mut placement, ty.size_bytes());
            let buffer = placement.buffer_of[&(value.node.index(), 0)];
            let working = match &placement.homes[buffer] {
                Home::Bound(_) => {
                    placement.homes[buffer] = Home::Region {
                        region: slot.region,
                        range: slot.range.clone(),
                    };
                    None
                }
                Home::Region { .. } => span_of(&placement, buffer),
            };
            inputs.push(InputSlot {
                name: name.to_string(),
                ty: ty.clone(),
                slot,
                working,
            });
        }
        let mut outputs = Vec::new();
        for (name, value) in graph.outputs() {
            let ty = graph.value_type(*value)?.clone();
            outputs.push(OutputSlot {
                name: name.clone(),
                slot: region(&mut placement, ty.size_bytes()),
                ty,
                value: (value.node.index(), value.port),
            });
        }
        let scratch_bytes = scratch_bytes(graph, plan, &placement, &inputs);
        let scratch = region(&mut placement, scratch_bytes).region;
        Ok(Slots {
            placement,
            inputs,
            outputs,
            scratch,
        })
    }

    /// Moves every region into a memory of `region_bytes`: region `r` becomes `region_of[r]`
    /// (one entry per region of this program, each at least as large as the region it takes).
    pub fn renumber(&mut self, region_of: &[usize], region_bytes: &[usize]) {
        let span = |span: &mut Span| span.region = region_of[span.region];
        for home in &mut self.placement.homes {
            if let Home::Region { region, .. } = home {
                *region = region_of[*region];
            }
        }
        for input in &mut self.inputs {
            span(&mut input.slot);
            if let Some(working) = &mut input.working {
                span(working);
            }
        }
        for output in &mut self.outputs {
            span(&mut output.slot);
        }
        self.scratch = region_of[self.scratch];
        self.placement.region_bytes = region_bytes.to_vec();
    }
}

/// Bytes of scratch a run needs: the most any step copies of its in-place operands, or the
/// writes staged at the end, whichever is larger.
fn scratch_bytes(graph: &Graph, plan: &Plan, placement: &Placement, inputs: &[InputSlot]) -> usize {
    let len = |buffer: usize| span_of(placement, buffer).map_or(0, |s| aligned(s.range.len()));
    let mut most = 0;
    for step in &plan.schedule {
        let node = petgraph::stable_graph::NodeIndex::new(step.node);
        let ports = graph.node(node).map_or(0, |n| n.outputs.len());
        let results: Vec<usize> = (0..ports)
            .filter_map(|port| placement.buffer_of.get(&(step.node, port)).copied())
            .collect();
        let mut in_place: Vec<usize> = (graph.operands(node).iter())
            .filter_map(|v| placement.buffer_of.get(&(v.node.index(), v.port)).copied())
            .filter(|b| results.contains(b))
            .collect();
        in_place.sort_unstable();
        in_place.dedup();
        most = most.max(in_place.into_iter().map(len).sum());
    }
    let staged: usize = (graph.writes().iter())
        .filter_map(|(name, value)| {
            let buffer = *placement.buffer_of.get(&(value.node.index(), value.port))?;
            let span = span_of(placement, buffer)?;
            let in_slot = inputs.iter().any(|i| i.slot.overlaps(&span));
            let target = inputs.iter().find(|i| i.name == *name)?;
            in_slot.then(|| aligned(target.slot.range.len()))
        })
        .sum();
    most.max(staged)
}
