//! The HIP device as the [`Driver`] of the shared GPU host logic: HIP's runtime API through
//! hip-sys. Every call that does not name a stream first makes the device the thread's.

use std::sync::Arc;

use hip_sys::hiprt as sys;
use kiln_kernels::gpu::Gemm;

use super::{check, error, HipDevice};
use crate::device_io::DeviceSpan;
use crate::error::{Error, Result};
use crate::gpu::{Driver, KernelCall, ReleaseErrors};
use crate::lower::LowerOptions;

/// A HIP handle of type `H`, destroyed once when dropped; a failed destroy is recorded for
/// [`HipDevice::check_released`].
pub struct Owned<H: Copy> {
    handle: H,
    destroy: unsafe extern "C" fn(H) -> sys::hipError_t,
    what: &'static str,
    errors: Arc<ReleaseErrors>,
}

// SAFETY: HIP's streams, events, functions and graphs may be used from any thread (its runtime
// is thread safe); kiln orders their use with the group's issue lock.
unsafe impl<H: Copy> Send for Owned<H> {}
unsafe impl<H: Copy> Sync for Owned<H> {}

impl<H: Copy> Drop for Owned<H> {
    fn drop(&mut self) {
        // SAFETY: `handle` was created for `destroy` and is destroyed only here.
        if let Err(e) = check(unsafe { (self.destroy)(self.handle) }, self.what) {
            self.errors.record(format!("destroy a {}", self.what), e);
        }
    }
}

/// A kernel of a loaded module (the module outlives it: the device keeps its modules).
#[derive(Clone, Copy)]
pub struct Function(sys::hipFunction_t);

// SAFETY: a function handle may be used from any thread.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

/// No vendor GEMM is linked on HIP: every GEMM is lowered to kiln's tiled kernel.
pub enum NoGemm {}

/// An instantiated graph and the graph it was made from.
pub struct Graph {
    exec: Owned<sys::hipGraphExec_t>,
    _graph: Owned<sys::hipGraph_t>,
}

fn stream_of(stream: Option<&Arc<Owned<sys::hipStream_t>>>) -> sys::hipStream_t {
    stream.map_or(std::ptr::null_mut(), |s| s.handle)
}

impl HipDevice {
    fn owned<H: Copy>(
        &self,
        handle: H,
        destroy: unsafe extern "C" fn(H) -> sys::hipError_t,
        what: &'static str,
    ) -> Owned<H> {
        Owned {
            handle,
            destroy,
            what,
            errors: self.release_errors.clone(),
        }
    }

    fn event(&self, flags: u32) -> Result<Owned<sys::hipEvent_t>> {
        self.bind()?;
        let mut event = std::ptr::null_mut();
        // SAFETY: writes one handle, owned below.
        check(
            unsafe { sys::hipEventCreateWithFlags(&mut event, flags) },
            "create event",
        )?;
        Ok(self.owned(event, sys::hipEventDestroy, "event"))
    }
}

impl Driver for HipDevice {
    const BACKEND: &'static str = "hip";
    type Stream = Arc<Owned<sys::hipStream_t>>;
    type Event = Owned<sys::hipEvent_t>;
    type Function = Function;
    type Gemm = NoGemm;
    type Graph = Graph;
    type Timer = Owned<sys::hipEvent_t>;

    fn describe(&self) -> String {
        HipDevice::describe(self)
    }

    fn ordinal(&self) -> usize {
        self.ordinal as usize
    }

    fn lower_options(&self, options: LowerOptions) -> LowerOptions {
        LowerOptions {
            linear_rows: options.linear_rows,
            ..LowerOptions::portable()
        }
    }

    fn supports_programmatic_launch(&self) -> bool {
        false
    }

    fn gemm_workspace_bytes(&self) -> usize {
        0
    }

    fn malloc(&self, bytes: usize) -> Result<u64> {
        self.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a plain device allocation, freed by `free`.
        check(
            unsafe { sys::hipMalloc(&mut ptr, bytes) },
            format!("allocate {bytes} bytes"),
        )?;
        Ok(ptr as u64)
    }

    fn free(&self, ptr: u64) {
        // SAFETY: allocated by `malloc`, freed once (its owner's drop).
        let freed = self
            .bind()
            .and_then(|()| check(unsafe { sys::hipFree(ptr as *mut _) }, "free"));
        if let Err(e) = freed {
            self.release_errors.record("free device memory".into(), e);
        }
    }

    fn check_released(&self) -> Result<()> {
        HipDevice::check_released(self)
    }

    fn fill_and_wait(
        &self,
        ptr: u64,
        value: u8,
        bytes: usize,
        stream: Option<&Self::Stream>,
    ) -> Result<()> {
        self.bind()?;
        let stream = stream_of(stream);
        // SAFETY: the caller's range; the stream is waited for before this returns.
        unsafe {
            check(
                sys::hipMemsetD8Async(ptr as _, value, bytes, stream),
                "fill",
            )?;
            check(sys::hipStreamSynchronize(stream), "synchronize")
        }
    }

    fn upload(&self, dst: u64, host: &[u8], stream: &Self::Stream) -> Result<()> {
        let (src, bytes) = (host.as_ptr() as *mut _, host.len());
        // SAFETY: the caller's range; `host` outlives the copy (the stream is waited for).
        unsafe {
            let rc = sys::hipMemcpyHtoDAsync(dst as _, src, bytes, stream.handle);
            check(rc, "copy to the device")?;
            check(sys::hipStreamSynchronize(stream.handle), "synchronize")
        }
    }

    fn download(&self, host: &mut [u8], src: u64, stream: Option<&Self::Stream>) -> Result<()> {
        self.bind()?;
        let stream = stream_of(stream);
        let (dst, bytes) = (host.as_mut_ptr().cast(), host.len());
        // SAFETY: the caller's range and slice; the stream is waited for before `host` is
        // given back.
        unsafe {
            check(
                sys::hipMemcpyDtoHAsync(dst, src as _, bytes, stream),
                "copy to the host",
            )?;
            check(sys::hipStreamSynchronize(stream), "synchronize")
        }
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize, stream: &Self::Stream) -> Result<()> {
        // SAFETY: the caller's ranges, inside allocations it owns.
        let rc = unsafe { sys::hipMemcpyDtoDAsync(dst as _, src as _, bytes, stream.handle) };
        check(rc, "device copy")
    }

    fn check_span(&self, span: DeviceSpan, what: &str) -> Result<()> {
        let refuse = |reason: String| Error::DeviceMemory {
            what: what.to_string(),
            reason,
        };
        self.bind()?;
        // SAFETY: plain-data out-parameters; the runtime checks the address.
        let (attributes, base, size) = unsafe {
            let mut attributes: sys::hipPointerAttribute_t = std::mem::zeroed();
            let known = sys::hipPointerGetAttributes(&mut attributes, span.ptr as *const _);
            let (mut base, mut size) = (std::ptr::null_mut(), 0usize);
            let ranged = sys::hipMemGetAddressRange(&mut base, &mut size, span.ptr as _);
            if known != sys::hipError_t::hipSuccess || ranged != sys::hipError_t::hipSuccess {
                return Err(refuse(format!(
                    "address {:#x} is not HIP device memory the runtime knows",
                    span.ptr
                )));
            }
            (attributes, base as u64, size as u64)
        };
        if attributes.memoryType != sys::hipMemoryType::hipMemoryTypeDevice {
            return Err(refuse(format!(
                "address {:#x} is not device memory",
                span.ptr
            )));
        }
        if attributes.device != self.ordinal {
            return Err(refuse(format!(
                "is memory of device {}; the program runs on device {}",
                attributes.device, self.ordinal
            )));
        }
        let end = (span.ptr).checked_add(span.bytes as u64);
        if end.is_none_or(|end| end > base + size) {
            return Err(refuse(format!(
                "{} bytes from {:#x} run past its allocation ({size} bytes from {base:#x})",
                span.bytes, span.ptr
            )));
        }
        Ok(())
    }

    fn new_stream(&self) -> Result<Self::Stream> {
        self.bind()?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: writes one handle, owned below. Non-blocking: kiln's streams do not wait
        // for the default stream (as on CUDA).
        let rc = unsafe { sys::hipStreamCreateWithFlags(&mut stream, sys::hipStreamNonBlocking) };
        check(rc, "create stream")?;
        Ok(Arc::new(self.owned(
            stream,
            sys::hipStreamDestroy,
            "stream",
        )))
    }

    fn synchronize(&self, stream: &Self::Stream) -> Result<()> {
        // SAFETY: a live stream.
        check(
            unsafe { sys::hipStreamSynchronize(stream.handle) },
            "synchronize",
        )
    }

    fn stream_handle(&self, stream: &Self::Stream) -> u64 {
        stream.handle as u64
    }

    fn new_event(&self) -> Result<Self::Event> {
        self.event(sys::hipEventDisableTiming)
    }

    fn record(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()> {
        // SAFETY: live handles.
        check(
            unsafe { sys::hipEventRecord(event.handle, stream.handle) },
            "record event",
        )
    }

    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()> {
        // SAFETY: live handles.
        let rc = unsafe { sys::hipStreamWaitEvent(stream.handle, event.handle, 0) };
        check(rc, "wait event")
    }

    fn new_timer(&self) -> Result<Self::Timer> {
        self.event(sys::hipEventDefault)
    }

    fn record_timer(&self, timer: &Self::Timer, stream: &Self::Stream) -> Result<()> {
        self.record(timer, stream)
    }

    fn elapsed_ms(&self, start: &Self::Timer, end: &Self::Timer) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: live events; writes one float.
        unsafe {
            check(sys::hipEventSynchronize(end.handle), "wait for event")?;
            check(
                sys::hipEventElapsedTime(&mut ms, start.handle, end.handle),
                "event time",
            )?;
        }
        Ok(ms)
    }

    fn record_on_handle(&self, handle: u64) -> Result<Self::Event> {
        let event = self.new_event()?;
        // SAFETY: a live event; the stream is live by the caller's contract (`DeviceIo`).
        let rc = unsafe { sys::hipEventRecord(event.handle, handle as sys::hipStream_t) };
        check(rc, "record event on the stream")?;
        Ok(event)
    }

    fn handle_waits(&self, handle: u64, event: &Self::Event) -> Result<()> {
        // SAFETY: a live event; the stream is live by the caller's contract (`DeviceIo`).
        let rc = unsafe { sys::hipStreamWaitEvent(handle as sys::hipStream_t, event.handle, 0) };
        check(rc, "wait for an event")
    }

    fn function(
        &self,
        module: &'static str,
        function: &'static str,
        cluster_blocks: u64,
    ) -> Result<Function> {
        if cluster_blocks > 1 {
            let reason = "HIP has no thread block clusters (lower with `clusters` off)";
            return Err(error(format!("kernel `{function}`"), reason));
        }
        self.load_kernels()?;
        let modules = (self.modules.lock()).map_err(|_| error("module cache", "poisoned"))?;
        let missing = || error(format!("kernel module `{module}`"), "no such source");
        let loaded = modules.as_ref().ok_or_else(missing)?.get(module, missing)?;
        let name = std::ffi::CString::new(function).map_err(|e| error("kernel name", e))?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: a loaded module; writes one handle, valid while the module is loaded.
        let rc = unsafe { sys::hipModuleGetFunction(&mut handle, loaded.handle, name.as_ptr()) };
        check(rc, format!("kernel `{module}::{function}`"))?;
        Ok(Function(handle))
    }

    fn launch(&self, call: KernelCall<'_, Function>, stream: &Self::Stream) -> Result<()> {
        if call.cluster != (1, 1, 1) {
            return Err(error("kernel launch", "HIP has no thread block clusters"));
        }
        let mut params: Vec<*mut std::ffi::c_void> = (call.args.iter())
            .map(|cell| cell as *const u64 as *mut std::ffi::c_void)
            .collect();
        let ((gx, gy, gz), (bx, by, bz)) = (call.grid, call.block);
        // SAFETY: each parameter points at a cell holding its value's bits (the runtime reads
        // each parameter's size from the kernel's metadata); the builders match the kernels'
        // signatures (checked against the sources in CI).
        let rc = unsafe {
            sys::hipModuleLaunchKernel(
                call.function.0,
                gx,
                gy,
                gz,
                bx,
                by,
                bz,
                call.shared,
                stream.handle,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(rc, "kernel launch")
    }

    fn prepare_gemm(&self, _gemm: &Gemm, _: (u64, u64, u64), _: bool) -> Result<NoGemm> {
        let reason = "no vendor GEMM on HIP: lower with `vendor_gemm` off (kiln's tiled GEMM)";
        Err(error("GEMM", reason))
    }

    fn gemm(&self, gemm: &NoGemm, _workspace: (u64, usize), _stream: &Self::Stream) -> Result<()> {
        match *gemm {}
    }

    fn begin_capture(&self, stream: &Self::Stream) -> Result<()> {
        let mode = sys::hipStreamCaptureMode::hipStreamCaptureModeGlobal;
        // SAFETY: a live stream, not capturing.
        check(
            unsafe { sys::hipStreamBeginCapture(stream.handle, mode) },
            "begin capture",
        )
    }

    fn end_capture(&self, stream: &Self::Stream) -> Result<Graph> {
        let mut graph = std::ptr::null_mut();
        // SAFETY: a capturing stream; writes one handle, owned below.
        let rc = unsafe { sys::hipStreamEndCapture(stream.handle, &mut graph) };
        check(rc, "end capture")?;
        if graph.is_null() {
            return Err(error("end capture", "the capture recorded nothing"));
        }
        let graph = self.owned(graph, sys::hipGraphDestroy, "graph");
        let mut exec = std::ptr::null_mut();
        let (node, log) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a whole captured graph; writes one handle, owned below.
        let rc = unsafe { sys::hipGraphInstantiate(&mut exec, graph.handle, node, log, 0) };
        check(rc, "instantiate the graph")?;
        Ok(Graph {
            exec: self.owned(exec, sys::hipGraphExecDestroy, "graph executable"),
            _graph: graph,
        })
    }

    fn abandon_capture(&self, stream: &Self::Stream) {
        let mut graph = std::ptr::null_mut();
        // SAFETY: ends the invalidated capture (its error is expected and dropped) and
        // destroys whatever graph it gives back.
        unsafe {
            let _ = sys::hipStreamEndCapture(stream.handle, &mut graph);
            if !graph.is_null() {
                let _ = sys::hipGraphDestroy(graph);
            }
            let _ = sys::hipGetLastError();
        }
    }

    fn replay(&self, graph: &Graph, stream: &Self::Stream) -> Result<()> {
        // SAFETY: an instantiated graph and a live stream.
        check(
            unsafe { sys::hipGraphLaunch(graph.exec.handle, stream.handle) },
            "graph launch",
        )
    }

    fn communicator(&self) -> Result<(usize, usize)> {
        Err(crate::Error::Unsupported {
            backend: "hip",
            op: "all_reduce".to_string(),
            reason: "the HIP backend has no RCCL communicator: several ranks run on CUDA \
                     devices through NCCL"
                .to_string(),
        })
    }

    fn all_reduce(&self, _: &[(u64, u64, usize)], _: &Self::Stream) -> Result<()> {
        self.communicator().map(|_| ())
    }
}
