//! A planned program lowered for a device: every buffer of the plan given a home in one of a
//! fixed set of slots (the arena, one slot per graph input, one per output buffer), every step
//! lowered to launches with symbolic addresses ([`Addr`]), and the copies that carry the
//! graph's writes back into their inputs' slots.
//!
//! Backend independent (no device is touched), so CI lowers every program and checks every
//! address against its slot. A backend allocates the slots once, resolves the addresses once
//! and issues the launches — eagerly, or into a captured graph that replays them.
//!
//! In-place state updates: a graph write `name ← value` that the plan lists in
//! `in_place_writes` (the planner decides, the plan verifier checks: AdamW's param and
//! moments, a KV cache write) is computed directly in the input's slot — no output buffer, no
//! copy back. Every other write goes to an output slot of its own and is copied back after
//! the last step; [`DeviceProgram::copied_writes`] names those.

use std::collections::BTreeMap;

use kiln_ir::{Graph, InputKind, TensorType};
use kiln_kernels::gpu::{prefetch, Addr, Launch};
use kiln_planner::{BufferClass, Plan};

use crate::error::{Error, Result};
use crate::lower::{lower_op, DeviceTensor, LowerOptions};
use crate::placed::ValueLayout;
use crate::placed::{check_schedule, map_values, plan_error, Layouts, StepOperands, Value};

/// What a slot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SlotKind {
    /// The activation arena (slot 0).
    Arena,
    /// A graph input of this kind.
    Input(InputKind),
    /// An output buffer (a program output, or a write that cannot be done in place).
    Output,
    /// One i32 fault word per schedule step, zeroed at allocation: a kernel that meets an
    /// invalid index raises its step's word (kernels/cuda/common.cuh), the executable reports
    /// the step.
    Faults,
}

/// One device allocation a program needs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Slot {
    pub name: String,
    pub kind: SlotKind,
    pub bytes: u64,
}

/// One schedule step, lowered, or a step the lowering adds (an L2 prefetch on a side stream).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StepLaunches {
    /// The plan's schedule index (its fault word), `None` for a step the lowering adds.
    pub schedule: Option<usize>,
    pub node: usize,
    pub op: String,
    pub stream: usize,
    pub waits: Vec<usize>,
    pub records: Vec<usize>,
    pub launches: Vec<Launch>,
}

/// A plan lowered for a device (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct DeviceProgram {
    pub name: String,
    pub slots: Vec<Slot>,
    pub steps: Vec<StepLaunches>,
    /// Copies of writes that could not be done in place, run after every step.
    pub write_backs: Vec<Launch>,
    /// Streams: the plan's, then a side stream for L2 prefetches where the lowering adds them.
    pub streams: usize,
    /// The first `plan_streams` streams are the plan's; only they run GEMMs.
    pub plan_streams: usize,
    pub events: usize,
    /// Graph inputs by name: slot and type.
    pub inputs: BTreeMap<String, (u32, TensorType)>,
    /// Graph outputs by name, as they lie after the last step.
    pub outputs: BTreeMap<String, DeviceTensor>,
    /// Writes computed in their input's slot, and writes copied back.
    pub in_place_writes: Vec<String>,
    pub copied_writes: Vec<String>,
    /// The plan's arena and lower bound, bytes.
    pub arena_bytes: u64,
    pub lower_bound_bytes: u64,
    /// The slot of the steps' fault words (word `i` at byte `4 i` belongs to the step of
    /// schedule index `i`).
    pub fault_slot: u32,
    /// Whether the vendor GEMMs' algorithms are chosen by timing (`LowerOptions::tune_gemms`).
    pub tune_gemms: bool,
}

impl DeviceProgram {
    /// Lowers `plan` of `graph`; every mismatch between them is an error.
    pub fn new(graph: &Graph, plan: &Plan, options: LowerOptions) -> Result<Self> {
        Builder::new(graph, plan)?.build(options)
    }

    /// The number of launches one run issues.
    pub fn launch_count(&self) -> usize {
        self.steps.iter().map(|s| s.launches.len()).sum::<usize>() + self.write_backs.len()
    }

    /// Checks that every address of every launch lies inside its slot (its whole extent for
    /// copies and GEMMs, its start for kernel pointers).
    pub fn check_addresses(&self) -> Result<()> {
        let launches = (self.steps.iter().flat_map(|s| &s.launches)).chain(&self.write_backs);
        for launch in launches {
            for (addr, bytes) in extents(launch) {
                let Some(slot) = self.slots.get(addr.slot as usize) else {
                    return Err(self.error(format!("{launch:?} uses slot {}", addr.slot)));
                };
                if addr.offset + bytes > slot.bytes || (bytes == 0 && addr.offset > slot.bytes) {
                    return Err(self.error(format!(
                        "{launch:?} reaches byte {} of slot `{}` ({} bytes)",
                        addr.offset + bytes,
                        slot.name,
                        slot.bytes
                    )));
                }
            }
        }
        Ok(())
    }

    /// Checks the steps' events: each of `events` recorded once, and each wait after its
    /// event's record, on another stream (so issuing the steps in order is a valid order, in
    /// a capture and eagerly); GEMMs only on the plan's streams (they alone have workspaces).
    pub fn check_events(&self) -> Result<()> {
        let mut recorded = vec![None; self.events];
        for (index, step) in self.steps.iter().enumerate() {
            let what = || format!("step {index} (`{}`, stream {})", step.op, step.stream);
            if step.stream >= self.streams {
                return Err(self.error(format!("{} has no stream", what())));
            }
            let events = step.waits.iter().chain(&step.records);
            if let Some(event) = events.copied().find(|&e| e >= self.events) {
                let reason = format!("{} names event {event} of {}", what(), self.events);
                return Err(self.error(reason));
            }
            for &event in &step.waits {
                let reason = match recorded[event] {
                    Some(stream) if stream != step.stream => continue,
                    Some(_) => format!("{} waits for event {event} of its own stream", what()),
                    None => format!("{} waits for event {event} before it is recorded", what()),
                };
                return Err(self.error(reason));
            }
            for &event in &step.records {
                if recorded[event].replace(step.stream).is_some() {
                    return Err(self.error(format!("{} records event {event} again", what())));
                }
            }
            let gemm = step.launches.iter().any(|l| matches!(l, Launch::Gemm(_)));
            if gemm && step.stream >= self.plan_streams {
                return Err(self.error(format!("{} runs a GEMM on a side stream", what())));
            }
        }
        Ok(())
    }

    fn error(&self, reason: String) -> Error {
        Error::Graph {
            what: format!("device program `{}`", self.name),
            reason,
        }
    }
}

/// The byte extents a launch touches, as far as the descriptor says.
fn extents(launch: &Launch) -> Vec<(Addr, u64)> {
    match launch {
        Launch::Copy { dst, src, bytes } => vec![(*dst, *bytes), (*src, *bytes)],
        Launch::Gemm(g) => {
            let [a, b, c] = g.spans();
            vec![(g.a, a), (g.b, b), (g.c, c)]
        }
        Launch::Kernel(kernel) => (launch.addresses().into_iter().map(|a| (a, 0)))
            .chain(prefetch::ranges(kernel))
            .collect(),
        Launch::AllReduce { buffers } => (buffers.iter())
            .flat_map(|&(src, dst, n)| [(src, n * 4), (dst, n * 4)])
            .collect(),
    }
}

struct Builder<'g> {
    graph: &'g Graph,
    plan: &'g Plan,
    buffer_of: BTreeMap<Value, usize>,
    slots: Vec<Slot>,
    /// Home of each buffer: its slot's base address.
    homes: Vec<Option<Addr>>,
    /// Input slot by input node.
    input_slot: BTreeMap<usize, u32>,
}

impl<'g> Builder<'g> {
    fn new(graph: &'g Graph, plan: &'g Plan) -> Result<Self> {
        let buffer_of = map_values(graph, plan)?;
        check_schedule(graph, plan)?;
        Ok(Builder {
            graph,
            plan,
            buffer_of,
            slots: vec![Slot {
                name: "arena".to_string(),
                kind: SlotKind::Arena,
                bytes: plan.arena_bytes,
            }],
            homes: vec![None; plan.buffers.len()],
            input_slot: BTreeMap::new(),
        })
    }

    fn add_slot(&mut self, name: &str, kind: SlotKind, bytes: u64) -> u32 {
        self.slots.push(Slot {
            name: name.to_string(),
            kind,
            bytes,
        });
        (self.slots.len() - 1) as u32
    }

    fn fail(&self, what: impl std::fmt::Display, reason: String) -> Error {
        plan_error(self.plan, what, reason)
    }

    fn build(mut self, options: LowerOptions) -> Result<DeviceProgram> {
        let (graph, plan) = (self.graph, self.plan);
        // Inputs: one slot each; their buffers live there.
        let mut inputs = BTreeMap::new();
        for (value, name, kind, ty) in graph.inputs() {
            let slot = self.add_slot(name, SlotKind::Input(kind), ty.size_bytes() as u64);
            self.input_slot.insert(value.node.index(), slot);
            inputs.insert(name.to_string(), (slot, ty.clone()));
            if let Some(&buffer) = self.buffer_of.get(&(value.node.index(), 0)) {
                self.homes[buffer] = Some(Addr { slot, offset: 0 });
            }
        }
        // Writes: in place where safe, else an output slot and a copy back.
        let mut write_backs = Vec::new();
        let (mut in_place_writes, mut copied_writes) = (Vec::new(), Vec::new());
        for (name, value) in graph.writes() {
            let key = (value.node.index(), value.port);
            let Some(&buffer) = self.buffer_of.get(&key) else {
                return Err(self.fail(format!("write `{name}`"), "has no buffer".to_string()));
            };
            let input = graph.input_named(name).ok_or_else(|| {
                self.fail(format!("write `{name}`"), "names no input".to_string())
            })?;
            let input_slot = self.input_slot[&input.node.index()];
            if self.homes[buffer].is_some() {
                // Already the input's own buffer (the plan placed the write in place).
                in_place_writes.push(name.clone());
            } else if plan.in_place_writes.contains(name) {
                self.homes[buffer] = Some(Addr {
                    slot: input_slot,
                    offset: 0,
                });
                in_place_writes.push(name.clone());
            } else {
                let bytes = plan.buffers[buffer].size;
                let slot = self.add_slot(&format!("write {name}"), SlotKind::Output, bytes);
                self.homes[buffer] = Some(Addr { slot, offset: 0 });
                let ty = graph.value_type(*value)?;
                write_backs.push(Launch::Copy {
                    dst: Addr {
                        slot: input_slot,
                        offset: 0,
                    },
                    src: Addr { slot, offset: 0 },
                    bytes: ty.size_bytes() as u64,
                });
                copied_writes.push(name.clone());
            }
        }
        // Every other buffer: arena bytes or an output slot.
        for buffer in &plan.buffers {
            if self.homes[buffer.id].is_some() {
                continue;
            }
            let home = match buffer.class {
                BufferClass::Activation | BufferClass::Workspace => {
                    let offset = buffer.offset.ok_or_else(|| {
                        self.fail(
                            &buffer.name,
                            "is in the arena without an offset".to_string(),
                        )
                    })?;
                    if offset + buffer.size > plan.arena_bytes {
                        let reason = format!("ends past the arena ({} bytes)", plan.arena_bytes);
                        return Err(self.fail(&buffer.name, reason));
                    }
                    Addr { slot: 0, offset }
                }
                BufferClass::Output => {
                    let slot = self.add_slot(&buffer.name, SlotKind::Output, buffer.size);
                    Addr { slot, offset: 0 }
                }
                BufferClass::Param | BufferClass::Input | BufferClass::State => {
                    let reason = "is an input buffer that holds no graph input".to_string();
                    return Err(self.fail(&buffer.name, reason));
                }
            };
            self.homes[buffer.id] = Some(home);
        }

        let workspace: BTreeMap<usize, usize> = (plan.buffers.iter())
            .filter(|b| b.class == BufferClass::Workspace)
            .map(|b| (b.start, b.id))
            .collect();
        let mut layouts: Layouts = graph
            .inputs()
            .into_iter()
            .map(|(v, _, _, ty)| ((v.node.index(), 0), ValueLayout::contiguous(ty)))
            .collect();
        let fault_bytes = 4 * plan.schedule.len().max(1) as u64;
        let fault_slot = self.add_slot("faults", SlotKind::Faults, fault_bytes);
        let mut steps = Vec::with_capacity(plan.schedule.len());
        for (index, step) in plan.schedule.iter().enumerate() {
            let StepOperands {
                op,
                operands,
                types,
                ..
            } = StepOperands::read(graph, plan, &layouts, index)?;
            let mut launches = Vec::new();
            let view = match operands.first() {
                Some((key, layout)) => {
                    let capacity = self.plan.buffers[self.buffer_of[key]].size as usize
                        / layout.dtype.size_bytes().max(1);
                    layout.view(op, capacity)
                }
                None => None,
            };
            if let Some(view) = view {
                layouts.insert((step.node, 0), view?);
            } else {
                let results: Vec<ValueLayout> = types.iter().map(ValueLayout::contiguous).collect();
                let i = (operands.iter())
                    .map(|(key, layout)| self.tensor(*key, layout))
                    .collect::<Result<Vec<_>>>()?;
                let o = (results.iter().enumerate())
                    .map(|(port, layout)| self.tensor((step.node, port), layout))
                    .collect::<Result<Vec<_>>>()?;
                let ws = workspace.get(&index).map(|&b| {
                    let addr = self.homes[b].expect("every buffer has a home");
                    (addr, plan.buffers[b].size)
                });
                let fault = Addr {
                    slot: fault_slot,
                    offset: 4 * index as u64,
                };
                launches =
                    lower_op(op, &i, &o, ws, fault, options).map_err(|source| Error::Node {
                        node: step.node,
                        op: op.to_string(),
                        source: Box::new(source),
                    })?;
                for (port, layout) in results.into_iter().enumerate() {
                    layouts.insert((step.node, port), layout);
                }
            }
            steps.push(StepLaunches {
                schedule: Some(index),
                node: step.node,
                op: step.op.clone(),
                stream: step.stream,
                waits: step.waits.clone(),
                records: step.records.clone(),
                launches,
            });
        }

        let plan_streams = plan.streams().max(1);
        let (mut streams, mut events) = (plan_streams, plan.events);
        if options.l2_prefetch_bytes > 0 {
            let side = (streams, events);
            let added = crate::lower::prefetch::assign(&mut steps, &self.slots, &options, side)?;
            if added > 0 {
                streams += 1;
                events += added;
            }
        }
        let mut outputs = BTreeMap::new();
        for (name, value) in graph.outputs() {
            let key = (value.node.index(), value.port);
            let layout = layouts.get(&key).ok_or_else(|| {
                self.fail(format!("output `{name}`"), "is never computed".to_string())
            })?;
            outputs.insert(name.clone(), self.tensor(key, layout)?);
        }
        let program = DeviceProgram {
            name: plan.program.clone(),
            slots: self.slots,
            steps,
            write_backs,
            streams,
            plan_streams,
            events,
            inputs,
            outputs,
            in_place_writes,
            copied_writes,
            arena_bytes: plan.arena_bytes,
            lower_bound_bytes: plan.lower_bound_bytes,
            fault_slot,
            tune_gemms: options.tune_gemms,
        };
        program.check_addresses()?;
        program.check_events()?;
        Ok(program)
    }

    /// Value `key` with `layout`, placed at its buffer's home.
    fn tensor(&self, key: Value, layout: &ValueLayout) -> Result<DeviceTensor> {
        let buffer = *self.buffer_of.get(&key).ok_or_else(|| {
            self.fail(format!("value {}.{}", key.0, key.1), "has no buffer".into())
        })?;
        let base = self.homes[buffer].expect("every buffer has a home");
        Ok(DeviceTensor {
            base,
            layout: layout.clone(),
        })
    }
}

/// What lowering a plan for a device gives, computed without a device: the launches one run
/// issues and how the graph's writes are made.
#[derive(Clone, Debug, PartialEq)]
pub struct LoweringSummary {
    pub kernels: usize,
    pub gemms: usize,
    pub copies: usize,
    /// Collective launches (`all_reduce` groups).
    pub collectives: usize,
    /// Device allocations: the arena, one per input, one per output slot, the fault words.
    pub slots: usize,
    pub in_place_writes: Vec<String>,
    pub copied_writes: Vec<String>,
    /// The kernel modules the launches name.
    pub modules: std::collections::BTreeSet<&'static str>,
    /// Per op name (its text before `{`): the steps that launch something, and their launches;
    /// the write-backs under `write-back`.
    pub by_op: BTreeMap<String, (usize, usize)>,
    /// Per launch: `module.function` for kernels, `gemm`, `copy`, `all_reduce`.
    pub by_launch: BTreeMap<String, usize>,
    /// Per L2 prefetch launch, in issue order: the slots it prefetches and the bytes of each
    /// (`LowerOptions::l2_prefetch_bytes`).
    pub prefetches: Vec<Vec<(String, u64)>>,
    /// Streams the program runs on: the plan's, and a side stream for the L2 prefetches.
    pub streams: usize,
}

/// What a launch is called in [`LoweringSummary::by_launch`].
fn launch_name(launch: &Launch) -> String {
    match launch {
        Launch::Kernel(kernel) => format!("{}.{}", kernel.module, kernel.function),
        Launch::Gemm(_) => "gemm".to_string(),
        Launch::Copy { .. } => "copy".to_string(),
        Launch::AllReduce { .. } => "all_reduce".to_string(),
    }
}

/// Lowers `plan` of `graph` for a device backend with `options` (no device needed) and checks
/// every address against its slot: the errors a device backend would give for this program,
/// found in CI.
pub fn lower_for_device(
    graph: &Graph,
    plan: &Plan,
    options: LowerOptions,
) -> Result<LoweringSummary> {
    let program = DeviceProgram::new(graph, plan, options)?;
    let mut by_op = BTreeMap::<String, (usize, usize)>::new();
    let steps = (program.steps.iter()).map(|s| (kiln_ir::name_of_text(&s.op), &s.launches));
    for (op, launches) in steps.chain([("write-back", &program.write_backs)]) {
        if !launches.is_empty() {
            let entry = by_op.entry(op.to_string()).or_default();
            entry.0 += usize::from(op != "write-back");
            entry.1 += launches.len();
        }
    }
    let launches = (program.steps.iter().flat_map(|s| &s.launches)).chain(&program.write_backs);
    let (mut kernels, mut gemms, mut copies, mut collectives) = (0, 0, 0, 0);
    let mut modules = std::collections::BTreeSet::new();
    let mut by_launch = BTreeMap::<String, usize>::new();
    let mut prefetches = Vec::new();
    for launch in launches {
        *by_launch.entry(launch_name(launch)).or_default() += 1;
        match launch {
            Launch::Kernel(kernel) => {
                kernels += 1;
                modules.insert(kernel.module);
                let ranges = prefetch::ranges(kernel);
                if !ranges.is_empty() {
                    let named = (ranges.into_iter())
                        .map(|(a, n)| (program.slots[a.slot as usize].name.clone(), n));
                    prefetches.push(named.collect());
                }
            }
            Launch::Gemm(_) => gemms += 1,
            Launch::Copy { .. } => copies += 1,
            Launch::AllReduce { .. } => collectives += 1,
        }
    }
    Ok(LoweringSummary {
        kernels,
        gemms,
        copies,
        collectives,
        slots: program.slots.len(),
        in_place_writes: program.in_place_writes,
        copied_writes: program.copied_writes,
        modules,
        by_op,
        by_launch,
        prefetches,
        streams: program.streams,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_kernels::gpu::{Gemm, GemmDType, Kernel};

    fn step(stream: usize, waits: &[usize], records: &[usize], launch: Launch) -> StepLaunches {
        StepLaunches {
            schedule: None,
            node: 0,
            op: "op".to_string(),
            stream,
            waits: waits.to_vec(),
            records: records.to_vec(),
            launches: vec![launch],
        }
    }

    fn kernel() -> Launch {
        Kernel::launch("copy", "copy", (1, 1, 1), (32, 1, 1), 0, Vec::new())
    }

    fn gemm() -> Launch {
        let at = Addr { slot: 0, offset: 0 };
        Launch::Gemm(Gemm {
            dtype: GemmDType::F32,
            out: GemmDType::F32,
            a: at,
            b: at,
            c: at,
            m: 1,
            n: 1,
            k: 1,
            batch: 1,
            transpose_a: false,
            transpose_b: false,
            lda: 1,
            ldb: 1,
            ldc: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            accumulate: false,
        })
    }

    /// A program of `steps` on two plan streams and a side stream, with two events.
    fn program(steps: Vec<StepLaunches>) -> DeviceProgram {
        DeviceProgram {
            name: "p".to_string(),
            slots: Vec::new(),
            steps,
            write_backs: Vec::new(),
            streams: 3,
            plan_streams: 2,
            events: 2,
            inputs: BTreeMap::new(),
            outputs: BTreeMap::new(),
            in_place_writes: Vec::new(),
            copied_writes: Vec::new(),
            arena_bytes: 0,
            lower_bound_bytes: 0,
            fault_slot: 0,
            tune_gemms: false,
        }
    }

    fn refused(steps: Vec<StepLaunches>) -> String {
        program(steps).check_events().unwrap_err().to_string()
    }

    #[test]
    fn events_are_recorded_once_and_waited_for_later_on_another_stream() {
        let valid = vec![
            step(0, &[], &[0], gemm()),
            step(1, &[0], &[1], gemm()),
            step(2, &[0], &[], kernel()),
            step(0, &[1], &[], kernel()),
        ];
        program(valid).check_events().unwrap();
        let early = vec![step(1, &[0], &[], kernel()), step(0, &[], &[0], kernel())];
        assert!(refused(early).contains("waits for event 0 before it is recorded"));
        let own = vec![step(0, &[], &[0], kernel()), step(0, &[0], &[], kernel())];
        assert!(refused(own).contains("of its own stream"));
        let twice = vec![step(0, &[], &[0], kernel()), step(1, &[], &[0], kernel())];
        assert!(refused(twice).contains("records event 0 again"));
        let unknown = vec![step(0, &[], &[2], kernel())];
        assert!(refused(unknown).contains("names event 2 of 2"));
        let nowhere = vec![step(3, &[], &[], kernel())];
        assert!(refused(nowhere).contains("has no stream"));
        let side_gemm = vec![step(2, &[], &[], gemm())];
        assert!(refused(side_gemm).contains("runs a GEMM on a side stream"));
    }
}
