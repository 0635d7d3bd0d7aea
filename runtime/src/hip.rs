//! The HIP backend (AMD GPUs), on hip-sys: the `hip` feature, which links ROCm's
//! `libamdhip64` (the default build needs no ROCm). A [`HipDevice`] is the [`Driver`] of the
//! shared GPU host logic, so a [`HipExecutable`] binds and runs a planned program exactly as
//! the CUDA backend does — one arena at a fixed base, static slots, streams and events from the
//! plan, `hipStreamBeginCapture` → instantiate → `hipGraphLaunch` replay, a guard that ends an
//! abandoned capture — over kiln's own kernel sources compiled by hipRTC for the device's
//! `gfx` architecture (`kernels/cuda/common.cuh` maps what differs; the tensor-core modules
//! run their portable code).
//!
//! What it runs differs from CUDA in what [`Driver::lower_options`] says
//! ([`LowerOptions::portable`]): GEMMs on kiln's tiled GEMM kernel (no vendor GEMM is linked),
//! no thread block clusters, no programmatic dependent launch. Host copies are the runtime's
//! pageable ones (no pinned staging).
//!
//! CI builds it and compiles every kernel module for gfx90a with hipRTC; `tests/gpu.rs` runs
//! the same lowering on NVIDIA devices against the CPU reference. It has never run on an AMD
//! GPU.

mod driver;

use std::ffi::CStr;
use std::sync::{Arc, Mutex};

use hip_sys::hiprt as sys;

use crate::error::{Error, Result};
use crate::gpu::{GpuExecutable, KernelReport, Modules, ReleaseErrors};
use crate::kernel_cache::{Compiler, KernelCache};

/// A planned program bound to a HIP device.
pub type HipExecutable = GpuExecutable<HipDevice>;

pub(crate) fn error(what: impl Into<String>, e: impl std::fmt::Debug) -> Error {
    crate::gpu::error("hip", what, e)
}

/// `Ok` for `hipSuccess`, else the error named by the runtime.
pub(crate) fn check(rc: sys::hipError_t, what: impl Into<String>) -> Result<()> {
    if rc == sys::hipError_t::hipSuccess {
        return Ok(());
    }
    // SAFETY: returns a static string for any error code.
    let name = unsafe { CStr::from_ptr(sys::hipGetErrorName(rc)) };
    Err(error(what, name.to_string_lossy()))
}

/// Why no HIP device can be used here, or `None` when one can (hipRTC loadable and at least
/// one device present).
pub fn unavailable() -> Option<String> {
    if let Some(reason) = crate::hiprtc::unavailable() {
        return Some(reason);
    }
    let mut count = 0;
    // SAFETY: writes one int.
    let rc = unsafe { sys::hipGetDeviceCount(&mut count) };
    match (rc, count) {
        (sys::hipError_t::hipSuccess, 0) => Some("the HIP runtime reports no device".into()),
        (sys::hipError_t::hipSuccess, _) => None,
        (rc, _) => Some(format!("the HIP runtime does not start: {rc:?}")),
    }
}

/// A loaded code object, unloaded on drop.
pub(crate) struct Module {
    handle: sys::hipModule_t,
    errors: Arc<ReleaseErrors>,
}

// SAFETY: a module handle may be used from any thread (HIP's runtime is thread safe).
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: loaded by `load_modules`, unloaded once.
        if let Err(e) = check(unsafe { sys::hipModuleUnload(self.handle) }, "unload") {
            self.errors.record("unload a module".into(), e);
        }
    }
}

/// An open HIP device (see the module doc).
pub struct HipDevice {
    ordinal: i32,
    name: String,
    /// `gfx90a`, `gfx942`, ...: what hipRTC compiles for.
    arch: &'static str,
    modules: Mutex<Option<Modules<Module>>>,
    cache: KernelCache,
    release_errors: Arc<ReleaseErrors>,
}

impl HipDevice {
    /// Opens device `ordinal`.
    pub fn open(ordinal: usize) -> Result<Arc<Self>> {
        if let Some(reason) = unavailable() {
            return Err(Error::Device {
                backend: "hip",
                what: "no usable device".to_string(),
                reason,
            });
        }
        let index = i32::try_from(ordinal).map_err(|e| error("device ordinal", e))?;
        // SAFETY: plain-data out-parameters of the sizes the runtime writes; the properties
        // struct is the layout of the `hipGetDeviceProperties` symbol hip-sys binds.
        let properties = unsafe {
            check(sys::hipSetDevice(index), format!("open device {ordinal}"))?;
            let mut properties: sys::hipDeviceProp_t = std::mem::zeroed();
            check(
                sys::hipGetDeviceProperties(&mut properties, index),
                "device properties",
            )?;
            properties
        };
        let text = |chars: &[std::ffi::c_char]| {
            let bytes: Vec<u8> = (chars.iter())
                .take_while(|&&c| c != 0)
                .map(|&c| c as u8)
                .collect();
            String::from_utf8_lossy(&bytes).into_owned()
        };
        // `gfx90a:sramecc+:xnack-`: the architecture, then its target features.
        let full = text(&properties.gcnArchName);
        let arch = full.split(':').next().unwrap_or_default().to_string();
        if !arch.starts_with("gfx") {
            return Err(error(
                "device architecture",
                format!("`{full}` names no gfx target"),
            ));
        }
        Ok(Arc::new(HipDevice {
            ordinal: index,
            name: text(&properties.name),
            arch: Box::leak(arch.into_boxed_str()),
            modules: Mutex::new(None),
            cache: KernelCache::from_env(),
            release_errors: Arc::new(ReleaseErrors::new("hip")),
        }))
    }

    /// The device's name and architecture, e.g. `AMD Instinct MI300X (gfx942)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    /// Makes this device the calling thread's (HIP's current device is per thread).
    pub(crate) fn bind(&self) -> Result<()> {
        // SAFETY: a plain runtime call with an ordinal that opened.
        check(unsafe { sys::hipSetDevice(self.ordinal) }, "set the device")
    }

    /// Loads every kernel module now (from the cache, or compiled by hipRTC), as the first
    /// kernel asked for would.
    pub fn load_kernels(&self) -> Result<()> {
        let mut modules = (self.modules.lock()).map_err(|_| error("module cache", "poisoned"))?;
        if modules.is_none() {
            self.bind()?;
            let errors = &self.release_errors;
            let load = |name: &str, code: Vec<u8>| {
                let mut handle = std::ptr::null_mut();
                // SAFETY: `code` is a whole code object hipRTC produced for this device's
                // architecture; it lives through the call, which copies what it needs.
                let rc = unsafe { sys::hipModuleLoadData(&mut handle, code.as_ptr().cast()) };
                check(rc, format!("load module `{name}`"))?;
                Ok(Module {
                    handle,
                    errors: errors.clone(),
                })
            };
            *modules = Some(Modules::load(
                &self.cache,
                Compiler::Hiprtc,
                self.arch,
                load,
            ));
        }
        Ok(())
    }

    /// What loading the kernel modules took (all zero before the first kernel is asked for).
    pub fn kernel_report(&self) -> KernelReport {
        Modules::report(&self.modules)
    }

    /// Free and total device memory, bytes.
    pub fn memory(&self) -> Result<(usize, usize)> {
        self.bind()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: writes two sizes.
        check(
            unsafe { sys::hipMemGetInfo(&mut free, &mut total) },
            "memory info",
        )?;
        Ok((free, total))
    }

    /// Reports (and forgets) the errors destructors recorded since the last call.
    pub fn check_released(&self) -> Result<()> {
        let errors = self.release_errors.take();
        match errors.is_empty() {
            true => Ok(()),
            false => Err(error("release resources", errors.join("; "))),
        }
    }
}
