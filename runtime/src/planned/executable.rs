//! The CPU backend's executable: a planned program that owns its memory for its whole life and
//! runs either eagerly or from a captured recording — the contract a CUDA graph keeps, on the
//! CPU, so that CI tests it without a GPU.
//!
//! Memory (one [`Memory`], every region one 8-byte aligned allocation, made once in
//! [`CpuExecutable::new`] and never moved):
//! - region 0, the arena of `plan.arena_bytes`, at the plan's offsets;
//! - one region per output-class buffer of the plan (as in `execute`);
//! - one slot per graph input (param, input, state), contiguous, of the input's type: bound by
//!   [`CpuExecutable::set`]; an input the plan writes in place (AdamW's params and moments,
//!   kv_cache_write's caches) also gets a working copy that each run starts from its slot;
//! - one slot per graph output, contiguous, of the output's type;
//! - one scratch region for the copies of in-place operands and staged writes.
//!
//! Invariants:
//! 1. A run computes exactly what [`execute`](super::execute) computes on the slots' contents:
//!    the same layouts, the same kernels through the one op table, in schedule order (a serial
//!    run respects every stream and event), with the same poison rule.
//! 2. Input slots change only by `set` and by write-back at the end of a run: after the last
//!    step, every output is copied into its slot, then every write into its input's slot, so
//!    the next run sees updated params, moments and caches. Per-run inputs keep what was set.
//! 3. [`CpuExecutable::run`] resolves each step (`executable/record.rs`) and runs it at once;
//!    [`CpuExecutable::capture`] resolves the whole run into launches with bound spans and
//!    runs nothing; [`CpuExecutable::replay`] runs those launches and nothing else
//!    (`executable/launch.rs`). Both run the same launches, so they give the same bits.
//! 4. The plan is checked against the graph in `new`; a step that does not fit is refused when
//!    it is resolved. Mismatches are errors, never panics.

mod launch;
mod record;

use kiln_ir::{Graph, TensorType};
use kiln_planner::Plan;

use super::memory::Memory;
use super::placement::{Home, Placement};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::index_inputs::{index_rules, IndexRules};
use crate::interpret::type_of;
use crate::placed::bytes::{read_view, write_view};
use crate::placed::Value;
use crate::placed::ValueLayout;
use crate::tensor::Tensor;
use launch::{Launch, Span};
use record::{aligned, span_of, Recorder};

/// A graph input's static slot.
pub(super) struct InputSlot {
    name: String,
    ty: TensorType,
    slot: Span,
    /// Where the steps see the input when the plan writes its buffer in place.
    working: Option<Span>,
    /// Whether `set` bound it yet.
    set: bool,
}

/// A graph output's static slot.
pub(super) struct OutputSlot {
    name: String,
    ty: TensorType,
    value: Value,
    slot: Span,
}

/// A planned program with its memory, run eagerly or captured and replayed (see the module
/// doc).
pub struct CpuExecutable {
    graph: Graph,
    plan: Plan,
    placement: Placement,
    memory: Memory,
    inputs: Vec<InputSlot>,
    outputs: Vec<OutputSlot>,
    scratch: usize,
    poison: bool,
    recording: Option<Vec<Launch>>,
    index_rules: IndexRules,
}

impl CpuExecutable {
    /// Places `plan` for `graph` and allocates everything once: the arena (`plan.arena_bytes`,
    /// 8-byte aligned), one slot per graph input and per output, zeroed. Nothing is computed.
    pub fn new(graph: &Graph, plan: &Plan) -> Result<Self> {
        Self::new_with_poison(graph, plan, false)
    }

    /// [`CpuExecutable::new`], where each run first fills the arena and output buffers with
    /// 0xFF and refills every buffer's arena bytes after its last step (as `execute` with
    /// `poison`), so a plan with wrong lifetimes or offsets gives different bits.
    pub fn new_with_poison(graph: &Graph, plan: &Plan, poison: bool) -> Result<Self> {
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
                set: false,
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
        let memory = Memory::new(&placement, false)?;
        Ok(CpuExecutable {
            graph: graph.clone(),
            plan: plan.clone(),
            placement,
            memory,
            inputs,
            outputs,
            scratch,
            poison,
            recording: None,
            index_rules: index_rules(graph),
        })
    }

    /// Copies `tensor` into the slot of graph input `name` (param, input or state), after
    /// checking its dtype and shape against the input's and its indices against the ranges
    /// of the ops that read them (as the CUDA backend does).
    pub fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let input =
            (self.inputs.iter_mut().find(|i| i.name == name)).ok_or_else(|| Error::Graph {
                what: format!("set `{name}`"),
                reason: format!("graph `{}` has no input of that name", self.graph.name()),
            })?;
        let found = type_of(tensor);
        if found != input.ty {
            return Err(Error::InputType {
                name: name.to_string(),
                expected: Box::new(input.ty.clone()),
                found: Box::new(found),
            });
        }
        self.index_rules.check(name, tensor)?;
        let span = (input.slot.region, input.slot.range.clone());
        let mut carved = (self.memory.carve(std::slice::from_ref(&span)))
            .map_err(|_| slot_error(name, "lies outside its region"))?;
        let piece = carved.writes.pop().unwrap_or_default();
        let mut slot = write_view(piece, &ValueLayout::contiguous(&input.ty))?;
        tensor.read_with(|source| kiln_kernels::copy::copy(&source, &mut slot))??;
        input.set = true;
        Ok(())
    }

    /// One eager run: each step is resolved and run at once; then the outputs are copied into
    /// their slots and the writes into their inputs' slots.
    pub fn run(&mut self) -> Result<()> {
        self.check_set()?;
        let steps = self.plan.schedule.len();
        let (mut recorder, memory) = self.recorder();
        for launch in recorder.prologue() {
            launch.run(memory)?;
        }
        for index in 0..steps {
            for launch in recorder.step(index)? {
                launch.run(memory)?;
            }
        }
        // Resolved whole before any runs: a write that does not fit changes no slot.
        for launch in recorder.epilogue()? {
            launch.run(memory)?;
        }
        Ok(())
    }

    /// Records one run as launches with bound spans (see the module doc), without running
    /// it; replaces any earlier recording.
    pub fn capture(&mut self) -> Result<()> {
        self.check_set()?;
        let steps = self.plan.schedule.len();
        let (mut recorder, _) = self.recorder();
        let mut launches = recorder.prologue();
        for index in 0..steps {
            launches.extend(recorder.step(index)?);
        }
        launches.extend(recorder.epilogue()?);
        self.recording = Some(launches);
        Ok(())
    }

    /// Runs the recording; an error if nothing was captured. Gives the same bits as `run`.
    pub fn replay(&mut self) -> Result<()> {
        let launches = self.recording.as_ref().ok_or_else(|| Error::Graph {
            what: format!("replay of `{}`", self.plan.program),
            reason: "nothing was captured; call capture first".to_string(),
        })?;
        for launch in launches {
            launch.run(&mut self.memory)?;
        }
        Ok(())
    }

    /// A fresh tensor with the contents of output `name`'s slot, or else of input `name`'s
    /// slot (a param or state as the last run left it).
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let outputs = self.outputs.iter().map(|o| (&o.name, &o.ty, &o.slot));
        let inputs = self.inputs.iter().map(|i| (&i.name, &i.ty, &i.slot));
        let (_, ty, slot) =
            (outputs.chain(inputs).find(|(n, _, _)| *n == name)).ok_or_else(|| Error::Graph {
                what: format!("get `{name}`"),
                reason: format!(
                    "graph `{}` has no output or input of that name",
                    self.graph.name()
                ),
            })?;
        let source = read_view(
            self.memory.bytes(slot.region, slot.range.clone()),
            &ValueLayout::contiguous(ty),
        )?;
        let out = Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu);
        out.write_with(|mut target| kiln_kernels::copy::copy(&source, &mut target))??;
        Ok(out)
    }

    /// How many launches the recording holds; `None` before the first capture.
    pub fn captured_launches(&self) -> Option<usize> {
        self.recording.as_ref().map(Vec::len)
    }

    /// A recorder of one run, and the memory it runs on.
    fn recorder(&mut self) -> (Recorder<'_>, &mut Memory) {
        let recorder = Recorder::new(
            &self.graph,
            &self.plan,
            &self.placement,
            (&self.inputs, &self.outputs),
            self.scratch,
            self.poison,
        );
        (recorder, &mut self.memory)
    }

    /// Refuses to run while some input was never set, naming them all.
    fn check_set(&self) -> Result<()> {
        let missing: Vec<String> = (self.inputs.iter())
            .filter(|i| !i.set)
            .map(|i| format!("`{}` ({})", i.name, i.ty))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::Graph {
            what: format!("executable of `{}`", self.plan.program),
            reason: format!("inputs never set: {}", missing.join(", ")),
        })
    }
}

fn slot_error(name: &str, reason: &str) -> Error {
    Error::Graph {
        what: format!("slot of `{name}`"),
        reason: reason.to_string(),
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

#[cfg(test)]
mod tests;
