//! One planned program on a CUDA device: slots allocated once (the arena at a fixed base
//! address, every param, state, input and output slot), every launch resolved once to device
//! addresses, then run eagerly (each launch issued now) or captured into a CUDA graph,
//! instantiated, uploaded and replayed. Nothing is allocated or freed while a capture is open:
//! the capture runs in global mode, where the driver refuses such calls from any thread, and
//! the code that issues launches allocates nothing on the device. An abandoned capture (a
//! failing launch) is ended by a guard, so the stream can run eagerly again.
//!
//! Streams and events come from the plan: step `i` waits for its events on its stream, issues
//! its launches there and records its events. Each stream has its own GEMM workspace: GEMMs on
//! one stream run in order, so no two that may overlap share scratch memory.
//!
//! Kernels are launched with programmatic stream serialization where the device supports it
//! (sm_90 and later; [`CudaExecutable::set_programmatic_launch`]): a kernel is scheduled while
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
//! member captures its own CUDA graph over those addresses. Their runs are ordered on the one
//! stream 0, and a group-wide lock is held while any member issues work (eagerly, a graph
//! launch, a capture) or copies to or from its slots, so the work of two members never
//! interleaves, whichever threads drive them. A lone executable is the group of one.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use cudarc::driver::sys::{
    self, CUfunction_attribute, CUgraphInstantiate_flags, CUstreamCaptureMode,
};
use cudarc::driver::{CudaEvent, CudaFunction, CudaGraph, CudaStream};
use kiln_ir::Graph;
use kiln_kernels::gpu::{Addr, Arg, Kernel, Launch, MAX_PORTABLE_CLUSTER_BLOCKS};
use kiln_planner::Plan;

use super::gemm::{self, PreparedGemm};
use super::{error, CudaDevice, DeviceAlloc, GEMM_WORKSPACE_BYTES};
use crate::backend::RunMode;
use crate::derived::Derived;
use crate::error::Result;
use crate::index_inputs::IndexRules;
use crate::lower::LowerOptions;
use crate::program::DeviceProgram;

enum Resolved {
    Kernel {
        function: CudaFunction,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        shared: u32,
        cluster: (u32, u32, u32),
        /// Each argument's bits in an 8-byte cell (the driver reads each parameter's size).
        args: Vec<u64>,
    },
    Gemm(PreparedGemm),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
}

struct ResolvedStep {
    stream: usize,
    waits: Vec<usize>,
    records: Vec<usize>,
    launches: Vec<Resolved>,
}

/// A planned program bound to a CUDA device (see the module doc).
pub struct CudaExecutable {
    device: Arc<CudaDevice>,
    program: DeviceProgram,
    /// The group's first `program.streams` streams: stream 0 is every member's.
    streams: Vec<Arc<CudaStream>>,
    events: Vec<CudaEvent>,
    fork: CudaEvent,
    joins: Vec<CudaEvent>,
    /// By the program's slot index: the group's arena and shared input slots, this member's
    /// per-run input, output and fault slots.
    slots: Vec<Arc<DeviceAlloc>>,
    /// One cuBLASLt workspace per stream, the group's.
    gemm_workspaces: Vec<Arc<DeviceAlloc>>,
    /// The group's: held while work is issued or slots are copied, so that the work of two
    /// members never interleaves.
    issue: Arc<Mutex<()>>,
    index_rules: IndexRules,
    /// Copies set with their params (`Graph::derive`).
    derived: Derived,
    steps: Vec<ResolvedStep>,
    write_backs: Vec<Resolved>,
    graph: Option<CudaGraph>,
    capture_seconds: Option<f64>,
    /// Kernels launched with programmatic stream serialization (see
    /// [`set_programmatic_launch`](Self::set_programmatic_launch)).
    programmatic: bool,
}

/// A launch attribute `id` with a zeroed value, for the caller to fill in.
fn launch_attribute(id: sys::CUlaunchAttributeID) -> sys::CUlaunchAttribute {
    sys::CUlaunchAttribute {
        id,
        pad: [0; 4],
        // SAFETY: a plain-data union; zero is a valid value of every field.
        value: unsafe { std::mem::zeroed() },
    }
}

/// Ends an open capture when dropped before `finish` (a launch failed inside it).
struct CaptureGuard<'s> {
    stream: &'s Arc<CudaStream>,
    open: bool,
}

impl Drop for CaptureGuard<'_> {
    fn drop(&mut self) {
        if self.open {
            // The capture is invalid; ending it discards the partial graph (an error about the
            // invalidated capture is expected and cleared here) and frees the stream.
            let _ = self.stream.end_capture(
                CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
            );
        }
    }
}

impl CudaExecutable {
    /// Lowers `plan` of `graph`, allocates every slot (arena and output slots poisoned with
    /// 0xFF bytes, a NaN in every float dtype, so a value read before it is written shows) and
    /// resolves every launch: the group of one ([`group`](Self::group)).
    pub fn new(device: &Arc<CudaDevice>, graph: &Graph, plan: &Plan) -> Result<Self> {
        Self::with_options(device, graph, plan, LowerOptions::default())
    }

    /// As [`new`](Self::new), with the lowering's `options` (which kernels take the fused
    /// linears; the defaults are measured: BENCHMARKS.md).
    pub fn with_options(
        device: &Arc<CudaDevice>,
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

    /// `kernel`'s function, allowed a cluster past the portable size where it asks for one.
    fn kernel_function(&self, kernel: &Kernel) -> Result<CudaFunction> {
        let function = self.device.function(kernel.module, kernel.function)?;
        let (x, y, z) = kernel.cluster;
        if u64::from(x * y * z) > MAX_PORTABLE_CLUSTER_BLOCKS {
            let allowed = CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
            (function.set_attribute(allowed, 1)).map_err(|e| {
                error(
                    format!("{}: a cluster of {}", kernel.function, x * y * z),
                    e,
                )
            })?;
        }
        Ok(function)
    }

    fn resolve(&self, launch: &Launch) -> Result<Resolved> {
        Ok(match launch {
            Launch::Kernel(k) => Resolved::Kernel {
                function: self.kernel_function(k)?,
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
            },
            Launch::Gemm(g) => {
                let pointers = (self.address(g.a), self.address(g.b), self.address(g.c));
                let prepared = gemm::prepare(&self.device.lt, g, pointers, GEMM_WORKSPACE_BYTES)?;
                Resolved::Gemm(prepared)
            }
            Launch::Copy { dst, src, bytes } => Resolved::Copy {
                dst: self.address(*dst),
                src: self.address(*src),
                bytes: *bytes as usize,
            },
        })
    }

    /// Issues `launch` on stream `stream_index`.
    fn issue(&self, launch: &Resolved, stream_index: usize) -> Result<()> {
        let stream: &CudaStream = &self.streams[stream_index];
        match launch {
            Resolved::Kernel {
                function,
                grid,
                block,
                shared,
                cluster,
                args,
            } => {
                let mut params: Vec<*mut std::ffi::c_void> = (args.iter())
                    .map(|cell| cell as *const u64 as *mut std::ffi::c_void)
                    .collect();
                let mut attributes = Vec::with_capacity(2);
                if self.programmatic {
                    let mut attribute = launch_attribute(
                        sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                    );
                    attribute.value.programmaticStreamSerializationAllowed = 1;
                    attributes.push(attribute);
                }
                if *cluster != (1, 1, 1) {
                    let mut attribute = launch_attribute(
                        sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
                    );
                    attribute.value.clusterDim.x = cluster.0;
                    attribute.value.clusterDim.y = cluster.1;
                    attribute.value.clusterDim.z = cluster.2;
                    attributes.push(attribute);
                }
                let config = sys::CUlaunchConfig {
                    gridDimX: grid.0,
                    gridDimY: grid.1,
                    gridDimZ: grid.2,
                    blockDimX: block.0,
                    blockDimY: block.1,
                    blockDimZ: block.2,
                    sharedMemBytes: *shared,
                    hStream: stream.cu_stream(),
                    attrs: attributes.as_mut_ptr(),
                    numAttrs: attributes.len() as u32,
                };
                // SAFETY: each parameter points at a cell holding its value's bits; the
                // builders match the kernels' signatures (checked against the sources in CI);
                // the config and its attributes live through the call.
                unsafe {
                    sys::cuLaunchKernelEx(
                        &config,
                        function.cu_function(),
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                }
                .result()
                .map_err(|e| error("kernel launch", e))
            }
            Resolved::Gemm(g) => {
                let workspace = &self.gemm_workspaces[stream_index];
                let scratch = (workspace.ptr, workspace.bytes);
                gemm::issue(&self.device.lt, g, scratch, stream.cu_stream() as _)
            }
            Resolved::Copy { dst, src, bytes } => {
                // SAFETY: both ranges lie inside slots this executable owns (checked when
                // the program was lowered).
                unsafe {
                    cudarc::driver::result::memcpy_dtod_async(
                        *dst,
                        *src,
                        *bytes,
                        stream.cu_stream(),
                    )
                }
                .map_err(|e| error("device copy", e))
            }
        }
    }

    /// Issues the whole program (fork, steps with their events, join, write-backs).
    fn issue_all(&self) -> Result<()> {
        let main = &self.streams[0];
        if self.streams.len() > 1 {
            self.fork
                .record(main)
                .map_err(|e| error("record fork", e))?;
            for side in &self.streams[1..] {
                side.wait(&self.fork).map_err(|e| error("wait fork", e))?;
            }
        }
        for step in &self.steps {
            let stream = &self.streams[step.stream];
            for &event in &step.waits {
                stream
                    .wait(&self.events[event])
                    .map_err(|e| error("wait event", e))?;
            }
            for launch in &step.launches {
                self.issue(launch, step.stream)?;
            }
            for &event in &step.records {
                self.events[event]
                    .record(stream)
                    .map_err(|e| error("record event", e))?;
            }
        }
        for (side, join) in self.streams[1..].iter().zip(&self.joins) {
            join.record(side).map_err(|e| error("record join", e))?;
            main.wait(join).map_err(|e| error("wait join", e))?;
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
        let _issuing = issuing(&self.issue)?;
        match mode {
            RunMode::Eager => self.issue_all(),
            RunMode::Graph => {
                let graph = self.graph.as_ref().expect("captured above");
                graph.launch().map_err(|e| error("graph launch", e))
            }
        }
    }

    /// Runs the program once eagerly with a timing event around every step (on one stream,
    /// so the events measure each step alone); returns each step's IR node index, op text and
    /// milliseconds. For finding where a step's time goes, not for step timings (the events
    /// add gaps).
    pub fn profile(&self) -> Result<Vec<(usize, String, f32)>> {
        if self.streams.len() != 1 {
            let reason = "profiling times steps on one stream; plan with --streams 1";
            return Err(error("profile", reason));
        }
        let _issuing = issuing(&self.issue)?;
        let stream = &self.streams[0];
        let marks = (0..=self.steps.len())
            .map(|_| self.device.timing_event())
            .collect::<Result<Vec<_>>>()?;
        marks[0].record(stream)?;
        for (index, step) in self.steps.iter().enumerate() {
            for launch in &step.launches {
                self.issue(launch, 0)?;
            }
            marks[index + 1].record(stream)?;
        }
        (self.program.steps.iter().enumerate())
            .map(|(index, step)| {
                let ms = marks[index].elapsed_ms(&marks[index + 1])?;
                Ok((step.node, step.op.clone(), ms))
            })
            .collect()
    }

    /// Captures the program into a CUDA graph, instantiates and uploads it (replacing any
    /// earlier capture).
    pub fn capture(&mut self) -> Result<()> {
        self.capture_with(|_| Ok(()))
    }

    /// [`capture`](Self::capture), with `inside` run first inside the open capture (tests use
    /// it to make a call the capture must refuse).
    pub(crate) fn capture_with(&mut self, inside: impl FnOnce(&Self) -> Result<()>) -> Result<()> {
        let start = Instant::now();
        self.graph = None;
        let issue = self.issue.clone();
        let _issuing = issuing(&issue)?;
        let main = self.streams[0].clone();
        self.synchronize()?;
        main.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL)
            .map_err(|e| error("begin capture", e))?;
        let mut guard = CaptureGuard {
            stream: &main,
            open: true,
        };
        inside(self)?;
        self.issue_all()?;
        guard.open = false;
        let graph = main
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(|e| error("end capture", e))?
            .ok_or_else(|| error("end capture", "the capture recorded nothing"))?;
        graph.upload().map_err(|e| error("graph upload", e))?;
        main.synchronize().map_err(|e| error("synchronize", e))?;
        self.graph = Some(graph);
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
fn issuing(issue: &Mutex<()>) -> Result<MutexGuard<'_, ()>> {
    issue
        .lock()
        .map_err(|_| error("issue lock", "a thread of the group panicked while issuing"))
}

mod device_io;
mod group;
mod host;
#[cfg(test)]
mod tests;
