//! The CUDA device as the [`Driver`] of the shared GPU host logic: cudarc's driver API, with
//! kernels launched through `cuLaunchKernelEx` (programmatic stream serialization and cluster
//! dimensions as launch attributes) and GEMMs on cuBLASLt.

use std::sync::Arc;

use cudarc::driver::sys::{
    self, CUevent_flags, CUfunction_attribute, CUgraphInstantiate_flags, CUpointer_attribute,
    CUstreamCaptureMode,
};
use cudarc::driver::{result, CudaEvent, CudaFunction, CudaGraph, CudaStream};
use kiln_kernels::gpu::{Gemm, MAX_PORTABLE_CLUSTER_BLOCKS};

use super::{error, gemm, gemm_tuning, CudaDevice, TimingEvent, GEMM_WORKSPACE_BYTES};
use crate::device_io::DeviceSpan;
use crate::error::{Error, Result};
use crate::gpu::{Driver, KernelCall};
use crate::lower::LowerOptions;

/// CUDA's legacy default stream, as the driver numbers it.
const LEGACY_STREAM: sys::CUstream = 1 as sys::CUstream;

fn raw(stream: Option<&Arc<CudaStream>>) -> sys::CUstream {
    stream.map_or(LEGACY_STREAM, |s| s.cu_stream())
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

impl Driver for CudaDevice {
    const BACKEND: &'static str = "cuda";
    type Stream = Arc<CudaStream>;
    type Event = CudaEvent;
    type Function = CudaFunction;
    type Gemm = gemm::PreparedGemm;
    type Graph = CudaGraph;
    type Timer = TimingEvent;

    fn describe(&self) -> String {
        CudaDevice::describe(self)
    }

    fn ordinal(&self) -> usize {
        self.context().ordinal()
    }

    fn lower_options(&self, options: LowerOptions) -> LowerOptions {
        // Clusters and the bulk L2 prefetch are sm_90's.
        let hopper = self.supports_clusters();
        LowerOptions {
            clusters: options.clusters && hopper,
            l2_prefetch_bytes: if hopper { options.l2_prefetch_bytes } else { 0 },
            ..options
        }
    }

    fn supports_programmatic_launch(&self) -> bool {
        CudaDevice::supports_programmatic_launch(self)
    }

    fn gemm_workspace_bytes(&self) -> usize {
        GEMM_WORKSPACE_BYTES
    }

    fn malloc(&self, bytes: usize) -> Result<u64> {
        (self.context().bind_to_thread()).map_err(|e| error("bind context", e))?;
        // SAFETY: a plain device allocation, freed by `free`.
        unsafe { result::malloc_sync(bytes) }
            .map_err(|e| error(format!("allocate {bytes} bytes"), e))
    }

    fn free(&self, ptr: u64) {
        // A failure is kept in the context (cudarc's `record_err`) for `check_released`.
        let ctx = self.context();
        let freed = ctx.bind_to_thread().and_then(|()| {
            // SAFETY: allocated by `malloc`, freed once (its owner's drop).
            unsafe { result::free_sync(ptr) }
        });
        ctx.record_err(freed);
    }

    fn check_released(&self) -> Result<()> {
        CudaDevice::check_released(self)
    }

    /// (`cuMemsetD8` alone runs on the legacy stream and may return before the fill is done,
    /// and kiln's streams do not wait for the legacy stream: a later copy or kernel on them
    /// could race the fill.)
    fn fill_and_wait(
        &self,
        ptr: u64,
        value: u8,
        bytes: usize,
        stream: Option<&Arc<CudaStream>>,
    ) -> Result<()> {
        let stream = raw(stream);
        // SAFETY: the caller's range; the stream is waited for before this returns.
        unsafe {
            result::memset_d8_async(ptr, value, bytes, stream)
                .and_then(|()| result::stream::synchronize(stream))
        }
        .map_err(|e| error("fill device memory", e))
    }

    fn upload(&self, dst: u64, host: &[u8], stream: &Arc<CudaStream>) -> Result<()> {
        CudaDevice::upload(self, dst, host, stream)
    }

    fn download(&self, host: &mut [u8], src: u64, stream: Option<&Arc<CudaStream>>) -> Result<()> {
        (self.context().bind_to_thread()).map_err(|e| error("bind context", e))?;
        let stream = raw(stream);
        // SAFETY: the caller's range and slice; the stream is waited for before `host` is
        // given back.
        unsafe {
            result::memcpy_dtoh_async(host, src, stream)
                .and_then(|()| result::stream::synchronize(stream))
        }
        .map_err(|e| error("copy to the host", e))
    }

    fn copy(&self, dst: u64, src: u64, bytes: usize, stream: &Arc<CudaStream>) -> Result<()> {
        // SAFETY: the caller's ranges, inside allocations it owns.
        unsafe { result::memcpy_dtod_async(dst, src, bytes, stream.cu_stream()) }
            .map_err(|e| error("device copy", e))
    }

    fn check_span(&self, span: DeviceSpan, what: &str) -> Result<()> {
        let refuse = |reason: String| Error::DeviceMemory {
            what: what.to_string(),
            reason,
        };
        let ctx = self.context();
        ctx.bind_to_thread().map_err(|e| error("bind context", e))?;
        let attribute = |attribute: CUpointer_attribute, out: *mut std::ffi::c_void| {
            // SAFETY: `out` points at a value of the size the attribute writes (a device
            // pointer, a size or an int); the driver checks the address.
            unsafe { sys::cuPointerGetAttribute(out, attribute, span.ptr) }.result()
        };
        let (mut start, mut size, mut ordinal) = (0u64, 0usize, -1i32);
        let known = attribute(
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            (&mut start as *mut u64).cast(),
        )
        .and_then(|()| {
            attribute(
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                (&mut size as *mut usize).cast(),
            )
        })
        .and_then(|()| {
            attribute(
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                (&mut ordinal as *mut i32).cast(),
            )
        });
        if let Err(e) = known {
            return Err(refuse(format!(
                "address {:#x} is not CUDA device memory the driver knows ({e:?})",
                span.ptr
            )));
        }
        if ordinal != ctx.ordinal() as i32 {
            return Err(refuse(format!(
                "is memory of device {ordinal}; the program runs on device {}",
                ctx.ordinal()
            )));
        }
        let end = (span.ptr).checked_add(span.bytes as u64);
        if end.is_none_or(|end| end > start + size as u64) {
            return Err(refuse(format!(
                "{} bytes from {:#x} run past its allocation ({size} bytes from {start:#x})",
                span.bytes, span.ptr
            )));
        }
        // A virtual-memory reservation (PyTorch's expandable segments) reports its whole
        // range, mapped or not: both ends must be mapped memory of this device.
        let last = span.ptr + (span.bytes as u64).saturating_sub(1);
        for address in [span.ptr, last] {
            let (mut mapped, mut on) = (0i32, -1i32);
            // SAFETY: each out-parameter is an int, as the two attributes write.
            let known = unsafe {
                sys::cuPointerGetAttribute(
                    (&mut mapped as *mut i32).cast(),
                    CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPED,
                    address,
                )
                .result()
                .and_then(|()| {
                    sys::cuPointerGetAttribute(
                        (&mut on as *mut i32).cast(),
                        CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                        address,
                    )
                    .result()
                })
            };
            if known.is_err() || mapped == 0 || on != ordinal {
                return Err(refuse(format!(
                    "address {address:#x} of {} bytes from {:#x} is not mapped memory of \
                     device {ordinal}",
                    span.bytes, span.ptr
                )));
            }
        }
        Ok(())
    }

    fn new_stream(&self) -> Result<Arc<CudaStream>> {
        (self.context().new_stream()).map_err(|e| error("create stream", e))
    }

    fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.synchronize().map_err(|e| error("synchronize", e))
    }

    fn stream_handle(&self, stream: &Arc<CudaStream>) -> u64 {
        stream.cu_stream() as u64
    }

    fn new_event(&self) -> Result<CudaEvent> {
        let flags = Some(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        (self.context().new_event(flags)).map_err(|e| error("create event", e))
    }

    fn record(&self, event: &CudaEvent, stream: &Arc<CudaStream>) -> Result<()> {
        event.record(stream).map_err(|e| error("record event", e))
    }

    fn wait(&self, stream: &Arc<CudaStream>, event: &CudaEvent) -> Result<()> {
        stream.wait(event).map_err(|e| error("wait event", e))
    }

    fn new_timer(&self) -> Result<TimingEvent> {
        self.timing_event()
    }

    fn record_timer(&self, timer: &TimingEvent, stream: &Arc<CudaStream>) -> Result<()> {
        timer.record(stream)
    }

    fn elapsed_ms(&self, start: &TimingEvent, end: &TimingEvent) -> Result<f32> {
        start.elapsed_ms(end)
    }

    fn record_on_handle(&self, handle: u64) -> Result<CudaEvent> {
        let event = self.new_event()?;
        // SAFETY: a live event; the stream is live by the caller's contract (`DeviceIo`).
        unsafe { result::event::record(event.cu_event(), handle as sys::CUstream) }
            .map_err(|e| error("record event on the stream", e))?;
        Ok(event)
    }

    fn handle_waits(&self, handle: u64, event: &CudaEvent) -> Result<()> {
        let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: a live event; the stream is live by the caller's contract (`DeviceIo`).
        unsafe { result::stream::wait_event(handle as sys::CUstream, event.cu_event(), flags) }
            .map_err(|e| error("wait for an event", e))
    }

    fn function(
        &self,
        module: &'static str,
        function: &'static str,
        cluster_blocks: u64,
    ) -> Result<CudaFunction> {
        let loaded = self.module_function(module, function)?;
        if cluster_blocks > MAX_PORTABLE_CLUSTER_BLOCKS {
            let allowed = CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED;
            (loaded.set_attribute(allowed, 1))
                .map_err(|e| error(format!("{function}: a cluster of {cluster_blocks}"), e))?;
        }
        Ok(loaded)
    }

    fn launch(&self, call: KernelCall<'_, CudaFunction>, stream: &Arc<CudaStream>) -> Result<()> {
        let mut params: Vec<*mut std::ffi::c_void> = (call.args.iter())
            .map(|cell| cell as *const u64 as *mut std::ffi::c_void)
            .collect();
        let mut attributes = Vec::with_capacity(2);
        if call.programmatic {
            let mut attribute = launch_attribute(
                sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            );
            attribute.value.programmaticStreamSerializationAllowed = 1;
            attributes.push(attribute);
        }
        if call.cluster != (1, 1, 1) {
            let mut attribute =
                launch_attribute(sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
            attribute.value.clusterDim.x = call.cluster.0;
            attribute.value.clusterDim.y = call.cluster.1;
            attribute.value.clusterDim.z = call.cluster.2;
            attributes.push(attribute);
        }
        let config = sys::CUlaunchConfig {
            gridDimX: call.grid.0,
            gridDimY: call.grid.1,
            gridDimZ: call.grid.2,
            blockDimX: call.block.0,
            blockDimY: call.block.1,
            blockDimZ: call.block.2,
            sharedMemBytes: call.shared,
            hStream: stream.cu_stream(),
            attrs: attributes.as_mut_ptr(),
            numAttrs: attributes.len() as u32,
        };
        // SAFETY: each parameter points at a cell holding its value's bits; the builders
        // match the kernels' signatures (checked against the sources in CI); the config and
        // its attributes live through the call.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                call.function.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| error("kernel launch", e))
    }

    fn prepare_gemm(
        &self,
        gemm: &Gemm,
        pointers: (u64, u64, u64),
        tune: bool,
    ) -> Result<gemm::PreparedGemm> {
        let candidates = if tune { gemm::MAX_CANDIDATES } else { 1 };
        let (mut prepared, algos) =
            gemm::prepare(&self.lt, gemm, pointers, GEMM_WORKSPACE_BYTES, candidates)?;
        gemm_tuning::tune(self, gemm, &mut prepared, &algos);
        Ok(prepared)
    }

    fn gemm(
        &self,
        gemm: &gemm::PreparedGemm,
        workspace: (u64, usize),
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        gemm::issue(&self.lt, gemm, workspace, stream.cu_stream() as _)
    }

    fn begin_capture(&self, stream: &Arc<CudaStream>) -> Result<()> {
        (stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL))
            .map_err(|e| error("begin capture", e))
    }

    fn end_capture(&self, stream: &Arc<CudaStream>) -> Result<CudaGraph> {
        let graph = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH)
            .map_err(|e| error("end capture", e))?
            .ok_or_else(|| error("end capture", "the capture recorded nothing"))?;
        graph.upload().map_err(|e| error("graph upload", e))?;
        stream.synchronize().map_err(|e| error("synchronize", e))?;
        Ok(graph)
    }

    fn abandon_capture(&self, stream: &Arc<CudaStream>) {
        // The capture is invalid; ending it discards the partial graph (an error about the
        // invalidated capture is expected and cleared here) and frees the stream.
        let _ = stream
            .end_capture(CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    }

    fn replay(&self, graph: &CudaGraph, _stream: &Arc<CudaStream>) -> Result<()> {
        // A cudarc graph launches on the stream it was captured on, stream 0.
        graph.launch().map_err(|e| error("graph launch", e))
    }

    #[cfg(feature = "nccl")]
    fn communicator(&self) -> Result<(usize, usize)> {
        match self.nccl.get() {
            Some(nccl) => Ok(nccl.rank_and_size()),
            None => Err(crate::Error::Unsupported {
                backend: "cuda",
                op: "all_reduce".to_string(),
                reason: "the device has joined no NCCL communicator: run the ranks under \
                         `kiln launch`"
                    .to_string(),
            }),
        }
    }

    #[cfg(feature = "nccl")]
    fn all_reduce(&self, buffers: &[(u64, u64, usize)], stream: &Arc<CudaStream>) -> Result<()> {
        self.communicator()?;
        match self.nccl.get() {
            Some(nccl) => nccl.all_reduce(buffers, stream),
            None => Ok(()),
        }
    }

    #[cfg(not(feature = "nccl"))]
    fn communicator(&self) -> Result<(usize, usize)> {
        Err(crate::Error::Unsupported {
            backend: "cuda",
            op: "all_reduce".to_string(),
            reason: "this kiln was built without NCCL: build it with `cargo build --release \
                     --features nccl` and run the ranks under `kiln launch`"
                .to_string(),
        })
    }

    #[cfg(not(feature = "nccl"))]
    fn all_reduce(&self, _: &[(u64, u64, usize)], _: &Arc<CudaStream>) -> Result<()> {
        self.communicator().map(|_| ())
    }
}
