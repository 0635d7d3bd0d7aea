//! The CUDA backend, on cudarc with dynamic loading: the build needs no CUDA; the driver,
//! NVRTC and cuBLASLt are loaded when a device is opened, and their absence is an error that
//! says so (never a panic).
//!
//! A [`CudaDevice`] owns the context, the kernel modules and a cuBLASLt handle. The modules are
//! loaded all at once on first use: each one's cubin for the device's architecture from the
//! on-disk [`KernelCache`](crate::kernel_cache::KernelCache), the missing ones compiled by
//! NVRTC in parallel (and stored); [`CudaDevice::kernel_report`] says what that took. cudarc's automatic
//! event tracking is disabled: streams and events come from the lowered program. The device is
//! the [`Driver`] of the shared GPU host logic; a [`CudaExecutable`] runs one planned program,
//! with a GEMM workspace per plan stream (preallocated, so GEMMs can be captured; never shared
//! by GEMMs that may run at once).
//!
//! Destructors cannot return errors: a failed free or destroy is recorded (the driver's in the
//! context, cudarc's way; cuBLASLt's in [`ReleaseErrors`]) and reported by the next
//! [`CudaDevice::check_released`], which every synchronization calls.

mod driver;
mod gemm;
mod gemm_tuning;
#[cfg(feature = "nccl")]
pub mod nccl;
mod staging;

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use crate::error::{Error, Result};
pub use crate::gpu::KernelReport;
use crate::gpu::{GpuExecutable, Modules, ReleaseErrors};
use crate::kernel_cache::{Compiler, KernelCache};
pub use gemm_tuning::tuned_gemms;

/// A planned program bound to a CUDA device.
pub type CudaExecutable = GpuExecutable<CudaDevice>;

/// Bytes of the cuBLASLt workspace of each stream (NVIDIA's recommendation for Hopper).
const GEMM_WORKSPACE_BYTES: usize = 32 << 20;

pub(crate) fn error(what: impl Into<String>, e: impl std::fmt::Debug) -> Error {
    crate::gpu::error("cuda", what, e)
}

/// Why no CUDA device can be used here, or `None` when one can (driver, NVRTC and cuBLASLt
/// loadable and at least one device present).
pub fn unavailable() -> Option<String> {
    // SAFETY: these only try to dlopen the libraries.
    let libraries = unsafe {
        [
            (
                "the CUDA driver (libcuda)",
                cudarc::driver::sys::is_culib_present(),
            ),
            ("NVRTC (libnvrtc)", cudarc::nvrtc::sys::is_culib_present()),
            (
                "cuBLASLt (libcublasLt)",
                cudarc::cublaslt::sys::is_culib_present(),
            ),
        ]
    };
    if let Some((name, _)) = libraries.iter().find(|(_, present)| !present) {
        return Some(format!("{name} cannot be loaded"));
    }
    match CudaContext::device_count() {
        Ok(0) => Some("the CUDA driver reports no device".to_string()),
        Ok(_) => None,
        Err(e) => Some(format!("the CUDA driver does not start: {e:?}")),
    }
}

/// A device event that records time.
pub struct TimingEvent(cudarc::driver::CudaEvent);

impl TimingEvent {
    /// Records the event after the work issued so far on `stream`.
    pub fn record(&self, stream: &cudarc::driver::CudaStream) -> Result<()> {
        self.0.record(stream).map_err(|e| error("record event", e))
    }

    /// Milliseconds from `self` to `end`, once `end` has completed (waits for it).
    pub fn elapsed_ms(&self, end: &TimingEvent) -> Result<f32> {
        end.0
            .synchronize()
            .map_err(|e| error("wait for event", e))?;
        self.0
            .elapsed_ms(&end.0)
            .map_err(|e| error("event time", e))
    }
}

/// The driver version (12.3) from which programmatic launches are captured into graphs.
const PROGRAMMATIC_LAUNCH_DRIVER: i32 = 12030;

/// A device being opened on another thread ([`CudaDevice::open_in_background`]).
pub struct Opening(std::thread::JoinHandle<Result<Arc<CudaDevice>>>);

impl Opening {
    /// The opened device, once its thread is done.
    pub fn wait(self) -> Result<Arc<CudaDevice>> {
        (self.0.join()).unwrap_or_else(|_| Err(error("open the device", "its thread panicked")))
    }
}

/// An open CUDA device (see the module doc).
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    name: String,
    arch: &'static str,
    /// Compute capability 9.0 or later and a 12.3 driver or later: kernels may be launched
    /// with programmatic stream serialization (their `griddepcontrol` instructions exist
    /// there, and graphs capture the launches).
    programmatic_launch: bool,
    /// Compute capability 9.0 or later: kernels may be launched as thread block clusters.
    clusters: bool,
    modules: Mutex<Option<Modules<Arc<CudaModule>>>>,
    cache: KernelCache,
    staging: Mutex<Option<staging::Staging>>,
    lt: gemm::LtHandle,
    release_errors: Arc<ReleaseErrors>,
    /// The NCCL communicator the device joined ([`CudaDevice::join_nccl`]), once.
    #[cfg(feature = "nccl")]
    nccl: std::sync::OnceLock<nccl::Nccl>,
}

impl CudaDevice {
    /// Opens device `ordinal`.
    pub fn open(ordinal: usize) -> Result<Arc<Self>> {
        if let Some(reason) = unavailable() {
            return Err(Error::Device {
                backend: "cuda",
                what: "no usable device".to_string(),
                reason,
            });
        }
        let ctx =
            CudaContext::new(ordinal).map_err(|e| error(format!("open device {ordinal}"), e))?;
        // SAFETY: kiln orders its work with the plan's events; nothing relies on cudarc's.
        unsafe { ctx.disable_event_tracking() };
        let name = ctx.name().map_err(|e| error("device name", e))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| error("compute capability", e))?;
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let mut driver_version = 0;
        // SAFETY: writes one int.
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|e| error("driver version", e))?;
        let release_errors = Arc::new(ReleaseErrors::new("cuda"));
        let lt = gemm::LtHandle::new(&release_errors)?;
        Ok(Arc::new(CudaDevice {
            ctx,
            name,
            arch,
            programmatic_launch: major >= 9 && driver_version >= PROGRAMMATIC_LAUNCH_DRIVER,
            clusters: major >= 9,
            modules: Mutex::new(None),
            cache: KernelCache::from_env(),
            staging: Mutex::new(None),
            lt,
            release_errors,
            #[cfg(feature = "nccl")]
            nccl: std::sync::OnceLock::new(),
        }))
    }

    /// Joins the NCCL communicator of `size` ranks as rank `rank`, from the unique id rank 0
    /// made ([`nccl::unique_id`]) and every rank got byte for byte; waits for every rank to
    /// join. Once per device.
    #[cfg(feature = "nccl")]
    pub fn join_nccl(&self, id: &[u8; nccl::ID_BYTES], rank: usize, size: usize) -> Result<()> {
        if self.nccl.get().is_some() {
            return Err(Error::Collective {
                rank,
                reason: "the device has already joined a communicator".to_string(),
            });
        }
        let joined = nccl::Nccl::new(self, id, rank, size)?;
        // Only this call sets it, and it was empty above; a racing second join loses here.
        self.nccl.set(joined).map_err(|_| Error::Collective {
            rank,
            reason: "the device has already joined a communicator".to_string(),
        })?;
        // NCCL connects the ranks on their first collective, allocating as it goes: one
        // all-reduce now, outside any graph capture (which refuses allocations).
        use crate::gpu::Driver;
        let stream = self.new_stream()?;
        let ptr = self.malloc(4)?;
        let first = (self.fill_and_wait(ptr, 0, 4, Some(&stream)))
            .and_then(|()| self.all_reduce(&[(ptr, ptr, 1)], &stream))
            .and_then(|()| self.synchronize(&stream));
        self.free(ptr);
        first
    }

    /// Makes the device's context current on this thread.
    #[cfg(feature = "nccl")]
    fn bind(&self) -> Result<()> {
        (self.ctx.bind_to_thread()).map_err(|e| error("bind context", e))
    }

    /// Opens device `ordinal` and loads its kernel modules on another thread, so the caller
    /// can do other start-up work (reading weights, tracing) meanwhile; [`Opening::wait`]
    /// gives the device.
    pub fn open_in_background(ordinal: usize) -> Opening {
        Opening(std::thread::spawn(move || {
            let device = Self::open(ordinal)?;
            device.load_kernels()?;
            Ok(device)
        }))
    }

    /// Loads every kernel module now (from the cache, or compiled), as the first kernel asked
    /// for would.
    pub fn load_kernels(&self) -> Result<()> {
        let mut modules = (self.modules.lock()).map_err(|_| error("module cache", "poisoned"))?;
        if modules.is_none() {
            *modules = Some(self.load_modules()?);
        }
        Ok(())
    }

    /// Whether kernels can be launched with programmatic dependent launch (sm_90 and later,
    /// driver 12.3 and later).
    pub fn supports_programmatic_launch(&self) -> bool {
        self.programmatic_launch
    }

    /// Whether kernels can be launched as thread block clusters (sm_90 and later).
    pub fn supports_clusters(&self) -> bool {
        self.clusters
    }

    /// The device's name and architecture, e.g. `NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    /// Free and total device memory, bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.ctx.mem_get_info().map_err(|e| error("memory info", e))
    }

    /// An event that records time (for timing regions of a stream).
    pub fn timing_event(&self) -> Result<TimingEvent> {
        let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
        let event = self
            .ctx
            .new_event(Some(flags))
            .map_err(|e| error("create event", e))?;
        Ok(TimingEvent(event))
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Reports (and forgets) the errors destructors recorded since the last call: a failed
    /// device free, a failed cuBLASLt destroy.
    pub fn check_released(&self) -> Result<()> {
        let mut errors = self.release_errors.take();
        if let Err(e) = self.ctx.check_err() {
            errors.push(format!("a device free or destroy: {e:?}"));
        }
        match errors.is_empty() {
            true => Ok(()),
            false => Err(error("release resources", errors.join("; "))),
        }
    }

    /// Kernel `function` of module `module`; the first call loads every module.
    fn module_function(&self, module: &'static str, function: &str) -> Result<CudaFunction> {
        self.load_kernels()?;
        let modules = (self.modules.lock()).map_err(|_| error("module cache", "poisoned"))?;
        let missing = || error(format!("kernel module `{module}`"), "no such source");
        let modules = modules.as_ref().ok_or_else(missing)?;
        modules
            .get(module, missing)?
            .load_function(function)
            .map_err(|e| error(format!("kernel `{module}::{function}`"), e))
    }

    /// Copies `host` into device memory at `dst` on `stream` and waits; large copies go
    /// through pinned staging buffers (made on first use).
    pub(crate) fn upload(
        &self,
        dst: cudarc::driver::sys::CUdeviceptr,
        host: &[u8],
        stream: &cudarc::driver::CudaStream,
    ) -> Result<()> {
        if host.len() < staging::STAGED_FROM {
            // On `stream`, then waited for: `cuMemcpyHtoD` from pageable memory may return
            // before the data lands, on the legacy stream, which kiln's streams do not wait for.
            // SAFETY: the caller's range; `host` outlives the copy (the stream is waited for).
            return unsafe {
                cudarc::driver::result::memcpy_htod_async(dst, host, stream.cu_stream())
                    .and_then(|()| stream.synchronize())
            }
            .map_err(|e| error("copy to the device", e));
        }
        let mut staging = (self.staging.lock()).map_err(|_| error("staging", "poisoned"))?;
        if staging.is_none() {
            *staging = Some(staging::Staging::new(&self.ctx, &self.release_errors)?);
        }
        staging
            .as_mut()
            .expect("made above")
            .upload(dst, host, stream)
    }

    /// What loading the kernel modules took (all zero before the first kernel is asked for).
    pub fn kernel_report(&self) -> KernelReport {
        Modules::report(&self.modules)
    }

    /// Every module's cubin, from the cache or compiled by NVRTC, loaded into the context.
    fn load_modules(&self) -> Result<Modules<Arc<CudaModule>>> {
        let load = |name: &str, cubin: Vec<u8>| {
            (self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)))
                .map_err(|e| error(format!("load module `{name}`"), e))
        };
        Ok(Modules::load(&self.cache, Compiler::Nvrtc, self.arch, load))
    }
}
