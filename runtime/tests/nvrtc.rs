//! Every GPU kernel module compiles with NVRTC to PTX for sm_90, without warnings.
//!
//! NVRTC needs no GPU, only libnvrtc (CI installs the `nvidia-cuda-nvrtc` wheel and puts its
//! directory on `LD_LIBRARY_PATH`). Without libnvrtc the test prints `SKIPPED` and passes, unless
//! `KILN_REQUIRE_NVRTC=1`, when it fails.

use std::ffi::{CStr, CString};

use cudarc::nvrtc::{result, sys};
use kiln_kernels::gpu::SOURCES;

/// The options the CUDA backend compiles with (besides the device's arch).
const OPTIONS: &[&str] = &["--gpu-architecture=compute_90", "--std=c++17"];

/// Compiles `source`; returns the PTX size and the compile log, or the log as the error.
fn compile(name: &str, source: &str) -> Result<(usize, String), String> {
    let source = CString::new(source).map_err(|e| format!("{name}: {e}"))?;
    let file = CString::new(format!("{name}.cu")).map_err(|e| format!("{name}: {e}"))?;
    let program = result::create_program(&source, Some(&file)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `program` was just created and is destroyed once below; every pointer passed
    // lives across each call.
    unsafe {
        let compiled = result::compile_program(program, OPTIONS);
        let log = result::get_program_log(program)
            .map(|raw| {
                CStr::from_ptr(raw.as_ptr())
                    .to_string_lossy()
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        let ptx = compiled.and_then(|()| result::get_ptx(program));
        let _ = result::destroy_program(program);
        match ptx {
            Ok(ptx) => Ok((ptx.len(), log)),
            Err(e) => Err(format!("{e:?}\n{log}")),
        }
    }
}

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
        match compile(name, source) {
            Ok((bytes, log)) if log.is_empty() => println!("{name}: {bytes} bytes of PTX"),
            Ok((bytes, log)) => {
                println!("{name}: {bytes} bytes of PTX, with warnings");
                failures.push(format!("{name}: warnings:\n{log}"));
            }
            Err(log) => failures.push(format!("{name}: failed:\n{log}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(!SOURCES.is_empty());
}
