//! Every GPU kernel module compiles with NVRTC to a cubin for sm_90 — exactly as the CUDA
//! backend compiles it (`Compiler::Nvrtc.compile`), PTX assembled to machine code —
//! without warnings.
//!
//! NVRTC needs no GPU, only libnvrtc (CI installs the `nvidia-cuda-nvrtc` wheel and puts its
//! directory on `LD_LIBRARY_PATH`). Without libnvrtc the test prints `SKIPPED` and passes, unless
//! `KILN_REQUIRE_NVRTC=1`, when it fails.

use cudarc::nvrtc::sys;
use kiln_kernels::gpu::SOURCES;
use kiln_runtime::kernel_cache::Compiler;

#[test]
fn every_module_compiles_for_sm_90() {
    let required = std::env::var("KILN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    // SAFETY: only probes whether the library can be loaded.
    if !unsafe { sys::is_culib_present() } {
        assert!(
            !required,
            "KILN_REQUIRE_NVRTC=1 but libnvrtc could not be loaded (LD_LIBRARY_PATH?)"
        );
        println!("SKIPPED: NVRTC compile test (libnvrtc is not present)");
        return;
    }
    let mut failures = Vec::new();
    for (name, source) in SOURCES {
        match Compiler::Nvrtc.compile(name, source, "sm_90") {
            Ok((cubin, log)) if log.is_empty() => {
                println!("{name}: {} bytes of cubin", cubin.len())
            }
            Ok((cubin, log)) => {
                println!("{name}: {} bytes of cubin, with warnings", cubin.len());
                failures.push(format!("{name}: warnings:\n{log}"));
            }
            Err(e) => failures.push(format!("{name}: failed:\n{e}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(!SOURCES.is_empty());
}
