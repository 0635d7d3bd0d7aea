//! What every GPU backend shares: the host logic that binds a planned program to one device
//! memory and runs it (slots, launches resolved once, streams and events from the plan, the
//! capture guard, groups, copies in and out, fault words: [`GpuExecutable`]), written once over
//! a [`Driver`], the few calls a vendor runtime makes. CUDA ([`crate::cuda::CudaDevice`], on
//! cudarc) and HIP (`crate::hip::HipDevice`, on hip-sys, behind the `hip` feature) implement the
//! driver; nothing above it names a vendor.

mod executable;
mod modules;

use std::sync::{Arc, Mutex};

use kiln_kernels::gpu::Gemm;

use crate::device_io::DeviceSpan;
use crate::error::{Error, Result};
use crate::lower::LowerOptions;

pub use executable::{GpuExecutable, TimedStep};
pub use modules::KernelReport;
pub(crate) use modules::Modules;

/// A kernel launch's shape and arguments, resolved to device addresses.
pub struct KernelCall<'a, F> {
    pub function: &'a F,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared: u32,
    pub cluster: (u32, u32, u32),
    /// Each argument's bits in an 8-byte cell (the runtime reads each parameter's size).
    pub args: &'a [u64],
    /// Launched with programmatic stream serialization (sm_90 and later).
    pub programmatic: bool,
}

/// The calls a GPU runtime makes for [`GpuExecutable`]: memory, streams, events, kernels, the
/// vendor GEMM, graph capture and replay. Streams are the driver's handles; "the default
/// stream" is the legacy one, which kiln's streams do not wait for (so no call below leaves
/// work on it unfinished).
pub trait Driver: Send + Sync + Sized + 'static {
    /// The backend's name in errors and reports: `cuda`, `hip`.
    const BACKEND: &'static str;
    type Stream: Clone + Send + Sync;
    /// An event that records no time.
    type Event: Send + Sync;
    type Function: Clone + Send + Sync;
    /// A vendor GEMM with its pointers bound and its algorithm chosen.
    type Gemm;
    /// An instantiated graph, uploaded, launched on the stream it was captured on.
    type Graph;
    /// An event that records time.
    type Timer;

    /// The device's name and architecture.
    fn describe(&self) -> String;
    fn ordinal(&self) -> usize;
    /// `options` as this device can run them (clusters where it has them, ...).
    fn lower_options(&self, options: LowerOptions) -> LowerOptions;
    fn supports_programmatic_launch(&self) -> bool;
    /// Bytes of the vendor GEMM's workspace, one per plan stream.
    fn gemm_workspace_bytes(&self) -> usize;

    /// `bytes` bytes (at least 1) of device memory.
    fn malloc(&self, bytes: usize) -> Result<u64>;
    /// Frees memory from [`malloc`](Self::malloc); a failure is kept for
    /// [`check_released`](Self::check_released).
    fn free(&self, ptr: u64);
    /// Reports (and forgets) what failed in destructors since the last call.
    fn check_released(&self) -> Result<()>;
    /// Fills `bytes` bytes at `ptr` with `value` on `stream` (the default stream when `None`)
    /// and waits for it.
    fn fill_and_wait(
        &self,
        ptr: u64,
        value: u8,
        bytes: usize,
        stream: Option<&Self::Stream>,
    ) -> Result<()>;
    /// Copies `host` to `dst` on `stream` and waits.
    fn upload(&self, dst: u64, host: &[u8], stream: &Self::Stream) -> Result<()>;
    /// Copies `host.len()` bytes from `src` into `host` on `stream` (the default stream when
    /// `None`) and waits.
    fn download(&self, host: &mut [u8], src: u64, stream: Option<&Self::Stream>) -> Result<()>;
    fn copy(&self, dst: u64, src: u64, bytes: usize, stream: &Self::Stream) -> Result<()>;
    /// Fails unless `span` lies inside one mapped allocation of this device.
    fn check_span(&self, span: DeviceSpan, what: &str) -> Result<()>;

    fn new_stream(&self) -> Result<Self::Stream>;
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;
    /// The stream's handle as a number (DLPack's convention).
    fn stream_handle(&self, stream: &Self::Stream) -> u64;
    fn new_event(&self) -> Result<Self::Event>;
    fn record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;
    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;
    fn new_timer(&self) -> Result<Self::Timer>;
    fn record_timer(&self, timer: &Self::Timer, stream: &Self::Stream) -> Result<()>;
    /// Milliseconds from `start` to `end`, once `end` has completed (waits for it).
    fn elapsed_ms(&self, start: &Self::Timer, end: &Self::Timer) -> Result<f32>;
    /// A fresh event recorded on the raw stream `handle` (the caller's, or one of kiln's).
    fn record_on_handle(&self, handle: u64) -> Result<Self::Event>;
    /// Makes the raw stream `handle` wait for `event`.
    fn handle_waits(&self, handle: u64, event: &Self::Event) -> Result<()>;

    /// Kernel `function` of module `module`, allowed a cluster of `cluster_blocks` blocks.
    fn function(
        &self,
        module: &'static str,
        function: &'static str,
        cluster_blocks: u64,
    ) -> Result<Self::Function>;
    fn launch(&self, call: KernelCall<'_, Self::Function>, stream: &Self::Stream) -> Result<()>;
    /// `gemm` bound to the addresses of A, B and C; with `tune`, its algorithm the fastest of
    /// the vendor's candidates, timed on scratch memory (nothing at the addresses is written).
    fn prepare_gemm(
        &self,
        gemm: &Gemm,
        pointers: (u64, u64, u64),
        tune: bool,
    ) -> Result<Self::Gemm>;
    fn gemm(&self, gemm: &Self::Gemm, workspace: (u64, usize), stream: &Self::Stream)
        -> Result<()>;

    /// Starts capturing `stream` in global mode (allocations refused from any thread).
    fn begin_capture(&self, stream: &Self::Stream) -> Result<()>;
    /// Ends the capture, instantiates and uploads the graph and waits for the upload.
    fn end_capture(&self, stream: &Self::Stream) -> Result<Self::Graph>;
    /// Ends a capture abandoned by a failure, discarding it and clearing its error.
    fn abandon_capture(&self, stream: &Self::Stream);
    fn replay(&self, graph: &Self::Graph, stream: &Self::Stream) -> Result<()>;

    /// The rank and world size of the communicator this device belongs to, which runs
    /// [`all_reduce`](Self::all_reduce); an error saying why where there is none (asked when
    /// a program with collectives is bound).
    fn communicator(&self) -> Result<(usize, usize)>;
    /// Sums each `(src, dst, count)` f32 buffer over the ranks of the device's communicator
    /// into `dst`, as one group, on `stream`.
    fn all_reduce(&self, buffers: &[(u64, u64, usize)], stream: &Self::Stream) -> Result<()>;
}

/// A device error of backend `backend`.
pub(crate) fn error(
    backend: &'static str,
    what: impl Into<String>,
    e: impl std::fmt::Debug,
) -> Error {
    Error::Device {
        backend,
        what: what.into(),
        reason: format!("{e:?}"),
    }
}

/// Errors of destructors, kept until a driver's `check_released` reports them; any still
/// unreported when the device goes are printed then.
pub(crate) struct ReleaseErrors {
    backend: &'static str,
    errors: Mutex<Vec<String>>,
}

impl ReleaseErrors {
    pub fn new(backend: &'static str) -> Self {
        ReleaseErrors {
            backend,
            errors: Mutex::default(),
        }
    }

    pub fn record(&self, what: String, e: impl std::fmt::Debug) {
        if let Ok(mut errors) = self.errors.lock() {
            errors.push(format!("{what}: {e:?}"));
        }
    }

    pub fn take(&self) -> Vec<String> {
        self.errors
            .lock()
            .map(|mut e| std::mem::take(&mut *e))
            .unwrap_or_default()
    }
}

impl Drop for ReleaseErrors {
    fn drop(&mut self) {
        for error in self.take() {
            eprintln!(
                "kiln: releasing a {} resource failed: {error}",
                self.backend
            );
        }
    }
}

/// Device memory kiln allocated, as the callers of [`crate::DeviceBuffer`] see it.
pub(crate) trait Memory: Send + Sync {
    fn ptr(&self) -> u64;
    fn bytes(&self) -> usize;
    /// Its bytes, copied to the host (after nothing).
    fn to_host(&self) -> Result<Vec<u8>>;
}

/// One device allocation, freed on drop.
pub(crate) struct DeviceAlloc<D: Driver> {
    device: Arc<D>,
    pub ptr: u64,
    pub bytes: usize,
}

impl<D: Driver> DeviceAlloc<D> {
    /// `bytes` bytes (at least 1), filled with `fill` before this returns.
    pub fn new(device: &Arc<D>, bytes: usize, fill: u8) -> Result<Self> {
        let alloc = Self::unfilled(device, bytes)?;
        device.fill_and_wait(alloc.ptr, fill, bytes.max(1), None)?;
        Ok(alloc)
    }

    /// `bytes` bytes (at least 1) of whatever the device left there: for memory written whole
    /// before it is read.
    pub fn unfilled(device: &Arc<D>, bytes: usize) -> Result<Self> {
        let ptr = device.malloc(bytes.max(1))?;
        Ok(DeviceAlloc {
            device: device.clone(),
            ptr,
            bytes,
        })
    }
}

impl<D: Driver> Memory for DeviceAlloc<D> {
    fn ptr(&self) -> u64 {
        self.ptr
    }

    fn bytes(&self) -> usize {
        self.bytes
    }

    fn to_host(&self) -> Result<Vec<u8>> {
        let mut host = vec![0u8; self.bytes];
        self.device.download(&mut host, self.ptr, None)?;
        Ok(host)
    }
}

impl<D: Driver> Drop for DeviceAlloc<D> {
    fn drop(&mut self) {
        self.device.free(self.ptr);
    }
}
