//! The CPU backend's executable: a planned program that owns its memory for its whole life and
//! runs either eagerly or from a captured recording — the contract a CUDA graph keeps, on the
//! CPU, so that CI tests it without a GPU.
//!
//! Memory (one [`Memory`], every region one 8-byte aligned allocation, made once when the
//! executable is made and never moved; `executable/slots.rs` lays it out):
//! - region 0, the arena of `plan.arena_bytes`, at the plan's offsets;
//! - one region per output-class buffer of the plan (as in `execute`);
//! - one slot per graph input (param, input, state), contiguous, of the input's type: bound by
//!   [`CpuExecutable::set`]; an input the plan writes in place (AdamW's params and moments,
//!   kv_cache_write's caches) also gets a working copy that each run starts from its slot;
//! - one slot per graph output, contiguous, of the output's type;
//! - one scratch region for the copies of in-place operands and staged writes.
//!
//! An executable group's members share one such memory (`executable/group.rs`): one arena of
//! the largest plan's bytes, one slot (and working copy) per param and state name, the other
//! regions each member's own. It sits behind a mutex that `set`, `get` and every run hold, so
//! members' runs never overlap. A lone executable is the group of one.
//!
//! Invariants:
//! 1. A run computes exactly what [`execute`](super::execute) computes on the slots' contents:
//!    the same layouts, the same kernels through the one op table, in schedule order (a serial
//!    run respects every stream and event), with the same poison rule.
//! 2. Input slots change only by `set` and by write-back at the end of a run: after the last
//!    step, every output is copied into its slot, then every write into its input's slot, so
//!    the next run (of any member, for a shared slot) sees updated params, moments and caches.
//!    Per-run inputs keep what was set.
//! 3. [`CpuExecutable::run`] resolves each step (`executable/record.rs`) and runs it at once;
//!    [`CpuExecutable::capture`] resolves the whole run into launches with bound spans and
//!    runs nothing; [`CpuExecutable::replay`] runs those launches and nothing else
//!    (`executable/launch.rs`). Both run the same launches, so they give the same bits.
//! 4. The plan is checked against the graph when the executable is made; a step that does not
//!    fit is refused when it is resolved. Mismatches are errors, never panics.

mod group;
mod launch;
mod record;
mod slots;

use std::sync::{Arc, Mutex, MutexGuard};

use kiln_ir::Graph;
use kiln_planner::Plan;

use super::memory::Memory;
use super::placement::Placement;
use crate::collective::Communicator;
use crate::derived::Derived;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::index_inputs::IndexRules;
use crate::interpret::type_of;
use crate::placed::bytes::{read_view, write_view};
use crate::placed::ValueLayout;
use crate::tensor::Tensor;
use launch::Launch;
use record::Recorder;
use slots::{InputSlot, OutputSlot};

/// The memory of a group of executables (one executable alone is a group of one), and which
/// of its input slots `set` has bound, by region.
struct GroupRegions {
    memory: Memory,
    set: Vec<bool>,
}

/// A planned program with its memory, run eagerly or captured and replayed (see the module
/// doc).
pub struct CpuExecutable {
    graph: Graph,
    plan: Plan,
    placement: Placement,
    memory: Arc<Mutex<GroupRegions>>,
    inputs: Vec<InputSlot>,
    outputs: Vec<OutputSlot>,
    scratch: usize,
    poison: bool,
    recording: Option<Vec<Launch>>,
    index_rules: IndexRules,
    /// Where the program's `all_reduce` ops sum: a world of one until [`CpuExecutable::join`].
    communicator: Arc<dyn Communicator>,
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
        let (mut executables, _) = Self::group(&[(graph, plan)], poison)?;
        Ok(executables
            .pop()
            .expect("a group has one executable per program"))
    }

    /// Copies `tensor` into the slot of graph input `name` (param, input or state), after
    /// checking its dtype and shape against the input's and its indices against the ranges
    /// of the ops that read them (as the CUDA backend does; in a group, those of every member
    /// that shares the slot).
    ///
    /// Setting a param also sets its derived copies ([`kiln_ir::Graph::derive`]); a copy is
    /// not set directly.
    pub fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let derived = Derived::of(&self.graph);
        derived.refuse_direct(name, "set")?;
        self.write_input(name, tensor)?;
        for (copy, cast) in derived.casts(name, tensor)? {
            self.write_input(&copy, &cast)?;
        }
        Ok(())
    }

    /// Copies `tensor` into input `name`'s slot (see [`CpuExecutable::set`]).
    fn write_input(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let input = (self.inputs.iter().find(|i| i.name == name)).ok_or_else(|| Error::Graph {
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
        let mut regions = self.lock()?;
        let span = (input.slot.region, input.slot.range.clone());
        let mut carved = (regions.memory.carve(std::slice::from_ref(&span)))
            .map_err(|_| slot_error(name, "lies outside its region"))?;
        let piece = carved.writes.pop().unwrap_or_default();
        let mut slot = write_view(piece, &ValueLayout::contiguous(&input.ty))?;
        tensor.read_with(|source| kiln_kernels::copy::copy(&source, &mut slot))??;
        regions.set[input.slot.region] = true;
        Ok(())
    }

    /// Fills graph input `name` (and a param's derived copies) with zeros (see
    /// [`CpuExecutable::set`]).
    pub fn zero(&mut self, name: &str) -> Result<()> {
        let ty = (self.inputs.iter().find(|i| i.name == name))
            .map(|input| input.ty.clone())
            .ok_or_else(|| Error::Graph {
                what: format!("zero `{name}`"),
                reason: format!("graph `{}` has no input of that name", self.graph.name()),
            })?;
        self.set(name, &Tensor::zeros(ty.shape, ty.dtype, crate::Device::Cpu))
    }

    /// One eager run: each step is resolved and run at once; then the outputs are copied into
    /// their slots and the writes into their inputs' slots.
    pub fn run(&mut self) -> Result<()> {
        let mut regions = self.lock()?;
        self.check_set(&regions)?;
        let memory = &mut regions.memory;
        let mut recorder = self.recorder();
        for launch in recorder.prologue() {
            launch.run(memory, &*self.communicator)?;
        }
        for index in 0..self.plan.schedule.len() {
            for launch in recorder.step(index)? {
                launch.run(memory, &*self.communicator)?;
            }
        }
        // Resolved whole before any runs: a write that does not fit changes no slot.
        for launch in recorder.epilogue()? {
            launch.run(memory, &*self.communicator)?;
        }
        Ok(())
    }

    /// Records one run as launches with bound spans (see the module doc), without running
    /// it; replaces any earlier recording.
    pub fn capture(&mut self) -> Result<()> {
        self.check_set(&*self.lock()?)?;
        let mut recorder = self.recorder();
        let mut launches = recorder.prologue();
        for index in 0..self.plan.schedule.len() {
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
        let mut regions = self.lock()?;
        for launch in launches {
            launch.run(&mut regions.memory, &*self.communicator)?;
        }
        Ok(())
    }

    /// Makes the program's `all_reduce` ops sum over `communicator`'s ranks (this executable
    /// being one of them) instead of a world of one.
    pub fn join(&mut self, communicator: Arc<dyn Communicator>) {
        self.communicator = communicator;
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
        let regions = self.lock()?;
        let source = read_view(
            regions.memory.bytes(slot.region, slot.range.clone()),
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

    /// A recorder of one run.
    fn recorder(&self) -> Recorder<'_> {
        Recorder::new(
            &self.graph,
            &self.plan,
            &self.placement,
            (&self.inputs, &self.outputs),
            self.scratch,
            self.poison,
        )
    }

    /// The group's memory, held until the guard drops: no other member runs meanwhile.
    fn lock(&self) -> Result<MutexGuard<'_, GroupRegions>> {
        self.memory.lock().map_err(|_| Error::Graph {
            what: format!("memory of `{}`", self.plan.program),
            reason: "a run of its group panicked while holding it".to_string(),
        })
    }

    /// Refuses to run while some input was never set (through this executable or, for a
    /// shared slot, another member of its group), naming them all.
    fn check_set(&self, regions: &GroupRegions) -> Result<()> {
        let missing: Vec<String> = (self.inputs.iter())
            .filter(|i| !regions.set[i.slot.region])
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

#[cfg(test)]
pub(crate) mod tests;
