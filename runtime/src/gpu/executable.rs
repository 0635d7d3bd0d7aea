//! One planned program on a GPU (any [`Driver`]): slots allocated once (the arena at a fixed base
//! address, every param, state, input and output slot), every launch resolved once to device
//! addresses, then run eagerly (each launch issued now) or captured into a device graph,
//! instantiated, uploaded and replayed. Nothing is allocated or freed while a capture is open:
//! the capture runs in global mode, where the driver refuses such calls from any thread, and
//! the code that issues launches allocates nothing on the device. An abandoned capture (a
//! failing launch) is ended by a guard, so the stream can run eagerly again.
//!
//! Streams and events come from the program (the plan's, and a side stream where the lowering
//! adds L2 prefetches): step `i` waits for its events on its stream, issues its launches there
//! and records its events. Each of the plan's streams has its own GEMM workspace: GEMMs on one
//! stream run in order, so no two that may overlap share scratch memory; a side stream runs
//! no GEMM (`DeviceProgram::check_events`).
//!
//! Kernels are launched with programmatic stream serialization where the device supports it
//! (sm_90 and later; [`GpuExecutable::set_programmatic_launch`]): a kernel is scheduled while
//! the one before it on its stream finishes, and waits at its first instruction for the
//! grids it depends on (kernels/cuda/common.cuh), so the launch gap is hidden; the edges
//! survive stream capture into the graph.
//!
//! Invalid indices: [`set`](CudaExecutable::set) checks every index input against the ranges
//! its readers accept (the CPU reference's rules, so both backends refuse the same inputs); a
//! kernel that still meets one raises its step's fault word, and the next synchronization
//! reports the op. Every run starts by forking the side streams
//! from stream 0 and ends by joining them back into it, so a run (or a replay) is ordered
//! after what came before and before what follows on stream 0 — also inside a capture, where
//! the fork brings the side streams into the graph.
//!
//! Groups (`executable/group.rs`): the members of an executable group share the arena
//! allocation, the slots of params and state, the streams and their GEMM workspaces; each
//! member captures its own graph over those addresses. Their runs are ordered on the one
//! stream 0, and a group-wide lock is held while any member issues work (eagerly, a graph
//! launch, a capture) or copies to or from its slots, so the work of two members never
//! interleaves, whichever threads drive them. A lone executable is the group of one.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use kiln_ir::Graph;
use kiln_kernels::gpu::{Addr, Arg, Launch};
use kiln_planner::Plan;

use super::{DeviceAlloc, Driver, KernelCall};
use crate::backend::RunMode;
use crate::derived::Derived;
use crate::error::Result;
use crate::index_inputs::IndexRules;
use crate::lower::LowerOptions;
use crate::program::DeviceProgram;

enum Resolved<D: Driver> {
    Kernel {
        function: D::Function,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        cluster: (u32, u32, u32),
        /// Each argument's bits in an 8-byte cell (the runtime reads each parameter's size).
        args: Vec<u64>,
    },
    Gemm(D::Gemm),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    AllReduce(Vec<(u64, u64, usize)>),
}

struct ResolvedStep<D: Driver> {
    stream: usize,
    waits: Vec<usize>,
    records: Vec<usize>,
    launches: Vec<Resolved<D>>,
}

/// One step of [`GpuExecutable::timeline`].
#[derive(Clone, Debug, PartialEq)]
pub struct TimedStep {
    /// The step's IR node index and op text.
    pub node: usize,
    pub op: String,
    pub stream: usize,
    /// Milliseconds from the program's start.
    pub start_ms: f32,
    pub end_ms: f32,
}

/// A planned program bound to a GPU (see the module doc).
pub struct GpuExecutable<D: Driver> {
    device: Arc<D>,
    program: DeviceProgram,
    /// The group's first `program.streams` streams: stream 0 is every member's.
    streams: Vec<D::Stream>,
    events: Vec<D::Event>,
    fork: D::Event,
    joins: Vec<D::Event>,
    /// By the program's slot index: the group's arena and shared input slots, this member's
    /// per-run input, output and fault slots.
    slots: Vec<Arc<DeviceAlloc<D>>>,
    /// One vendor GEMM workspace per plan stream, the group's (side streams run no GEMM).
    gemm_workspaces: Vec<Arc<DeviceAlloc<D>>>,
    /// The group's: held while work is issued or slots are copied, so that the work of two
    /// members never interleaves.
    issue: Arc<Mutex<()>>,
    index_rules: IndexRules,
    /// Copies set with their params (`Graph::derive`).
    derived: Derived,
    steps: Vec<ResolvedStep<D>>,
    write_backs: Vec<Resolved<D>>,
    graph: Option<D::Graph>,
    capture_seconds: Option<f64>,
    /// Kernels launched with programmatic stream serialization (see
    /// [`set_programmatic_launch`](Self::set_programmatic_launch)).
    programmatic: bool,
}

/// Ends an open capture when dropped before `finish` (a launch failed inside it).
struct CaptureGuard<'s, D: Driver> {
    device: &'s D,
    stream: &'s D::Stream,
    open: bool,
}

impl<D: Driver> Drop for CaptureGuard<'_, D> {
    fn drop(&mut self) {
        if self.open {
            self.device.abandon_capture(self.stream);
        }
    }
}

impl<D: Driver> GpuExecutable<D> {
    /// Lowers `plan` of `graph`, allocates every slot (arena and output slots poisoned with
    /// 0xFF bytes, a NaN in every float dtype, so a value read before it is written shows) and
    /// resolves every launch: the group of one ([`group`](Self::group)).
    pub fn new(device: &Arc<D>, graph: &Graph, plan: &Plan) -> Result<Self> {
        Self::with_options(device, graph, plan, LowerOptions::default())
    }

    /// As [`new`](Self::new), with the lowering's `options` (which kernels take the fused
    /// linears; the defaults are measured: BENCHMARKS.md).
    pub fn with_options(
        device: &Arc<D>,
        graph: &Graph,
        plan: &Plan,
        options: LowerOptions,
    ) -> Result<Self> {
        let (mut executables, _) = Self::group_with_options(device, &[(graph, plan)], options)?;
        Ok(executables
            .pop()
            .expect("a group has one executable per program"))
    }

    /// Resolves every launch of the program to device addresses (slots allocated).
    fn resolve_launches(&mut self) -> Result<()> {
        let mut steps = Vec::with_capacity(self.program.steps.len());
        for step in &self.program.steps {
            let launches = (step.launches.iter())
                .map(|l| self.resolve(l))
                .collect::<Result<Vec<_>>>()?;
            steps.push(ResolvedStep {
                stream: step.stream,
                waits: step.waits.clone(),
                records: step.records.clone(),
                launches,
            });
        }
        let write_backs = (self.program.write_backs.iter())
            .map(|l| self.resolve(l))
            .collect::<Result<Vec<_>>>()?;
        self.steps = steps;
        self.write_backs = write_backs;
        Ok(())
    }

    fn address(&self, addr: Addr) -> u64 {
        self.slots[addr.slot as usize].ptr + addr.offset
    }

    fn resolve(&self, launch: &Launch) -> Result<Resolved<D>> {
        Ok(match launch {
            Launch::Kernel(k) => {
                let (x, y, z) = k.cluster;
                Resolved::Kernel {
                    function: (self.device).function(k.module, k.function, u64::from(x * y * z))?,
                    grid: k.grid,
                    block: k.block,
                    shared: k.shared_bytes,
                    cluster: k.cluster,
                    args: (k.args.iter())
                        .map(|arg| match *arg {
                            Arg::Ptr(addr) => self.address(addr),
                            Arg::Null => 0,
                            Arg::I64(v) => v as u64,
                            Arg::I32(v) => v as u32 as u64,
                            Arg::F32(v) => v.to_bits() as u64,
                            Arg::F64(v) => v.to_bits(),
                        })
                        .collect(),
                }
            }
            Launch::Gemm(g) => {
                let pointers = (self.address(g.a), self.address(g.b), self.address(g.c));
                Resolved::Gemm((self.device).prepare_gemm(g, pointers, self.program.tune_gemms)?)
            }
            Launch::Copy { dst, src, bytes } => Resolved::Copy {
                dst: self.address(*dst),
                src: self.address(*src),
                bytes: *bytes as usize,
            },
            Launch::AllReduce { buffers } => {
                self.device.communicator()?;
                let buffers = (buffers.iter())
                    .map(|&(src, dst, n)| (self.address(src), self.address(dst), n as usize))
                    .collect();
                Resolved::AllReduce(buffers)
            }
        })
    }

    /// Issues `launch` on stream `stream_index`.
    fn issue(&self, launch: &Resolved<D>, stream_index: usize) -> Result<()> {
        let stream = &self.streams[stream_index];
        match launch {
            Resolved::Kernel {
                function,
                grid,
                block,
                shared,
                cluster,
                args,
            } => {
                let call = KernelCall {
                    function,
                    grid: *grid,
                    block: *block,
                    shared: *shared,
                    cluster: *cluster,
                    args,
                    programmatic: self.programmatic,
                };
                self.device.launch(call, stream)
            }
            Resolved::Gemm(g) => {
                let workspace = &self.gemm_workspaces[stream_index];
                self.device
                    .gemm(g, (workspace.ptr, workspace.bytes), stream)
            }
            // Both ranges lie inside slots this executable owns (checked when the program was
            // lowered).
            Resolved::Copy { dst, src, bytes } => self.device.copy(*dst, *src, *bytes, stream),
            Resolved::AllReduce(buffers) => self.device.all_reduce(buffers, stream),
        }
    }

    /// Issues the whole program (fork, steps with their events, join, write-backs).
    fn issue_all(&self) -> Result<()> {
        self.issue_all_with(|_, _| Ok(()))
    }

    /// [`issue_all`](Self::issue_all) with `after(step, stream)` called once each step's work
    /// is issued on its stream.
    fn issue_all_with(&self, mut after: impl FnMut(usize, &D::Stream) -> Result<()>) -> Result<()> {
        let device = &*self.device;
        let main = &self.streams[0];
        if self.streams.len() > 1 {
            device.record(&self.fork, main)?;
            for side in &self.streams[1..] {
                device.wait(side, &self.fork)?;
            }
        }
        for (index, step) in self.steps.iter().enumerate() {
            let stream = &self.streams[step.stream];
            for &event in &step.waits {
                device.wait(stream, &self.events[event])?;
            }
            for launch in &step.launches {
                self.issue(launch, step.stream)?;
            }
            after(index, stream)?;
            for &event in &step.records {
                device.record(&self.events[event], stream)?;
            }
        }
        for (side, join) in self.streams[1..].iter().zip(&self.joins) {
            device.record(join, side)?;
            device.wait(main, join)?;
        }
        for launch in &self.write_backs {
            self.issue(launch, 0)?;
        }
        Ok(())
    }

    /// Runs the program once, asynchronously on stream 0 (eagerly, or by replaying the
    /// captured graph, capturing it first if needed).
    pub fn run(&mut self, mode: RunMode) -> Result<()> {
        if mode == RunMode::Graph && self.graph.is_none() {
            self.capture()?;
        }
        let _issuing = issuing::<D>(&self.issue)?;
        match mode {
            RunMode::Eager => self.issue_all(),
            RunMode::Graph => {
                let graph = self.graph.as_ref().expect("captured above");
                self.device.replay(graph, &self.streams[0])
            }
        }
    }

    /// Runs the program once eagerly with a timing event around every step (on one stream,
    /// so the events measure each step alone); returns each step's IR node index, op text and
    /// milliseconds. For finding where a step's time goes, not for step timings (the events
    /// add gaps).
    pub fn profile(&self) -> Result<Vec<(usize, String, f32)>> {
        // Every step is issued on stream 0 in order (the L2 prefetches on a side stream too:
        // they wait for a step before them).
        if self.program.plan_streams != 1 {
            let reason = "profiling times steps on one stream; plan with one stream";
            return Err(super::error(D::BACKEND, "profile", reason));
        }
        let _issuing = issuing::<D>(&self.issue)?;
        let (device, stream) = (&*self.device, &self.streams[0]);
        let marks = (0..=self.steps.len())
            .map(|_| device.new_timer())
            .collect::<Result<Vec<_>>>()?;
        device.record_timer(&marks[0], stream)?;
        for (index, step) in self.steps.iter().enumerate() {
            for launch in &step.launches {
                self.issue(launch, 0)?;
            }
            device.record_timer(&marks[index + 1], stream)?;
        }
        (self.program.steps.iter().enumerate())
            .map(|(index, step)| {
                let ms = device.elapsed_ms(&marks[index], &marks[index + 1])?;
                Ok((step.node, step.op.clone(), ms))
            })
            .collect()
    }

    /// Runs the program once eagerly on its streams with a timing event after every step;
    /// returns each step's IR node, op text, stream, and start and end (ms from the program's
    /// start; a step starts once the step before it on its stream and the steps it waits for
    /// have ended). For seeing how the streams overlap and what the end waits on, not for
    /// step timings (the events add gaps).
    pub fn timeline(&self) -> Result<Vec<TimedStep>> {
        let _issuing = issuing::<D>(&self.issue)?;
        let device = &*self.device;
        let start = device.new_timer()?;
        let ends = (0..self.steps.len())
            .map(|_| device.new_timer())
            .collect::<Result<Vec<_>>>()?;
        device.record_timer(&start, &self.streams[0])?;
        self.issue_all_with(|index, stream| device.record_timer(&ends[index], stream))?;
        let mut timed: Vec<TimedStep> = Vec::with_capacity(self.steps.len());
        let mut stream_end = vec![0f32; self.streams.len()];
        let mut event_end = vec![0f32; self.events.len()];
        for ((step, planned), end) in self.steps.iter().zip(&self.program.steps).zip(&ends) {
            let end_ms = device.elapsed_ms(&start, end)?;
            let ready =
                (step.waits.iter()).fold(stream_end[step.stream], |t, &e| t.max(event_end[e]));
            stream_end[step.stream] = end_ms;
            for &event in &step.records {
                event_end[event] = end_ms;
            }
            timed.push(TimedStep {
                node: planned.node,
                op: planned.op.clone(),
                stream: step.stream,
                start_ms: ready.min(end_ms),
                end_ms,
            });
        }
        Ok(timed)
    }

    /// Captures the program into a graph, instantiates and uploads it (replacing any earlier
    /// capture).
    pub fn capture(&mut self) -> Result<()> {
        self.capture_with(|_| Ok(()))
    }

    /// [`capture`](Self::capture), with `inside` run first inside the open capture (tests use
    /// it to make a call the capture must refuse).
    pub(crate) fn capture_with(&mut self, inside: impl FnOnce(&Self) -> Result<()>) -> Result<()> {
        let start = Instant::now();
        self.graph = None;
        let issue = self.issue.clone();
        let _issuing = issuing::<D>(&issue)?;
        self.synchronize()?;
        let device = self.device.clone();
        let main = self.streams[0].clone();
        device.begin_capture(&main)?;
        let mut guard = CaptureGuard {
            device: &*device,
            stream: &main,
            open: true,
        };
        inside(self)?;
        self.issue_all()?;
        guard.open = false;
        self.graph = Some(device.end_capture(&main)?);
        self.capture_seconds = Some(start.elapsed().as_secs_f64());
        Ok(())
    }

    /// Launches kernels with programmatic dependent launch (`on`, the default where the
    /// device supports it) or in plain stream order; returns whether it is on. Each kernel
    /// starts with `griddepcontrol.wait` (kernels/cuda/common.cuh), so results are the same
    /// either way; a recorded graph is dropped and captured again on the next replay.
    pub fn set_programmatic_launch(&mut self, on: bool) -> bool {
        self.programmatic = on && self.device.supports_programmatic_launch();
        self.graph = None;
        self.programmatic
    }

    /// Seconds the last capture + instantiate + upload took.
    pub fn capture_seconds(&self) -> Option<f64> {
        self.capture_seconds
    }
}

/// The group's issue lock, held (see [`CudaExecutable`]'s `issue`).
fn issuing<D: Driver>(issue: &Mutex<()>) -> Result<MutexGuard<'_, ()>> {
    let why = "a thread of the group panicked while issuing";
    (issue.lock()).map_err(|_| super::error(D::BACKEND, "issue lock", why))
}

mod device_io;
mod group;
mod host;
#[cfg(test)]
mod tests;
