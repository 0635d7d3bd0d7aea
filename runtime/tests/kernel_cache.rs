//! The on-disk kernel cache with NVRTC (no GPU needed): a second compile hits; a changed
//! source or architecture misses; a truncated, garbage or foreign entry is rebuilt, never
//! loaded; two processes filling one cache at once both succeed and leave valid entries only.
//!
//! Without libnvrtc each test prints `SKIPPED` and returns, unless `KILN_REQUIRE_NVRTC=1`
//! (as CI sets), when it fails.

use std::path::Path;
use std::process::Command;

use cudarc::nvrtc::sys;
use kiln_kernels::gpu::SOURCES;
use kiln_runtime::kernel_cache::{Compiler, KernelCache, Origin};

/// Modules small enough to compile quickly.
const SMALL: [&str; 3] = ["copy", "embedding", "activation"];

fn nvrtc(test: &str) -> bool {
    // SAFETY: only probes whether the library can be loaded.
    if unsafe { sys::is_culib_present() } {
        return true;
    }
    let required = std::env::var("KILN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "KILN_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded"
    );
    println!("SKIPPED: {test}: libnvrtc is not present");
    false
}

fn source(name: &str) -> &'static str {
    SOURCES.iter().find(|(n, _)| *n == name).unwrap().1
}

/// The one entry file in `dir` whose name starts with `module-`.
fn entry(dir: &Path, module: &str) -> std::path::PathBuf {
    let mut found: Vec<_> = (std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()))
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with(&format!("{module}-")) && name.ends_with(".kcubin")
        })
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found.pop().unwrap()
}

#[test]
fn a_second_compile_hits_and_any_change_misses() {
    if !nvrtc("kernel cache hits and misses") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path().join("kernels"));
    let first = cache
        .module(Compiler::Nvrtc, "copy", source("copy"), "sm_90")
        .unwrap();
    assert_eq!(first.origin, Origin::Compiled);
    assert!(first.write_error.is_none());
    assert!(
        first.code.starts_with(b"\x7fELF"),
        "a cubin is an ELF image"
    );
    let second = cache
        .module(Compiler::Nvrtc, "copy", source("copy"), "sm_90")
        .unwrap();
    assert_eq!(second.origin, Origin::Hit);
    assert_eq!(second.code, first.code);
    let changed = format!("{}\n// changed\n", source("copy"));
    let miss = cache
        .module(Compiler::Nvrtc, "copy", &changed, "sm_90")
        .unwrap();
    assert_eq!(miss.origin, Origin::Compiled);
    let other_arch = cache
        .module(Compiler::Nvrtc, "copy", source("copy"), "sm_80")
        .unwrap();
    assert_eq!(other_arch.origin, Origin::Compiled);
    assert_ne!(other_arch.code, first.code);
    let info = cache.info().unwrap();
    assert_eq!(info.entries, 3);
    assert!(info.bytes > first.code.len() as u64 * 2);
    assert_eq!(cache.clear().unwrap(), 3);
    assert_eq!(cache.info().unwrap().entries, 0);
    let again = cache
        .module(Compiler::Nvrtc, "copy", source("copy"), "sm_90")
        .unwrap();
    assert_eq!((again.origin, again.code), (Origin::Compiled, first.code));
}

#[test]
fn a_truncated_garbage_or_foreign_entry_is_rebuilt() {
    if !nvrtc("kernel cache rebuilds") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let good = cache
        .module(Compiler::Nvrtc, "copy", source("copy"), "sm_90")
        .unwrap()
        .code;
    cache
        .module(Compiler::Nvrtc, "embedding", source("embedding"), "sm_90")
        .unwrap();
    let path = entry(dir.path(), "copy");
    let whole = std::fs::read(&path).unwrap();
    let rebuilt = |what: &str, expect: &str| {
        let got = cache
            .module(Compiler::Nvrtc, "copy", source("copy"), "sm_90")
            .unwrap();
        match &got.origin {
            Origin::Rebuilt(reason) => assert!(reason.contains(expect), "{what}: {reason}"),
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(got.code, good, "{what}");
        // The rebuilt entry is whole again.
        let hit = cache
            .module(Compiler::Nvrtc, "copy", source("copy"), "sm_90")
            .unwrap();
        assert_eq!(hit.origin, Origin::Hit, "{what}");
    };
    std::fs::write(&path, &whole[..whole.len() - 100]).unwrap();
    rebuilt("truncated", "truncated");
    std::fs::write(&path, b"not a kernel at all").unwrap();
    rebuilt("garbage", "without the entry header");
    let mut flipped = whole.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0xFF;
    std::fs::write(&path, &flipped).unwrap();
    rebuilt("a flipped byte", "checksum");
    std::fs::copy(entry(dir.path(), "embedding"), &path).unwrap();
    rebuilt("foreign", "another compile");
}

/// Run by `two_processes_filling_one_cache_leave_valid_entries` (twice at once), not alone:
/// fills the cache that `KILN_CACHE_TEST_DIR` names.
#[test]
#[ignore = "a child process of two_processes_filling_one_cache_leave_valid_entries"]
fn fill_the_cache_named_by_the_environment() {
    let Ok(dir) = std::env::var("KILN_CACHE_TEST_DIR") else {
        println!(
            "not a child of two_processes_filling_one_cache_leave_valid_entries: nothing to do"
        );
        return;
    };
    let cache = KernelCache::at(dir);
    for name in SMALL {
        cache
            .module(Compiler::Nvrtc, name, source(name), "sm_90")
            .unwrap();
    }
}

#[test]
fn two_processes_filling_one_cache_leave_valid_entries() {
    if !nvrtc("kernel cache filled by two processes") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..2)
        .map(|_| {
            Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    "fill_the_cache_named_by_the_environment",
                ])
                .env("KILN_CACHE_TEST_DIR", dir.path())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let names: Vec<String> = (std::fs::read_dir(dir.path()).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names.len(),
        SMALL.len(),
        "only whole entries remain: {names:?}"
    );
    let cache = KernelCache::at(dir.path());
    for name in SMALL {
        let got = cache
            .module(Compiler::Nvrtc, name, source(name), "sm_90")
            .unwrap();
        assert_eq!(got.origin, Origin::Hit, "{name}");
    }
}

/// Records (no compiler needed): read back under their kind and key, replaced by a later
/// store; another key or kind has none; a record whose bytes changed is refused with its
/// file named, never read; `info` counts records and `clear` removes them; no cache keeps
/// nothing.
#[test]
fn records_read_back_and_a_changed_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    assert_eq!(cache.record("gemm", "a key"), Ok(None));
    cache.store_record("gemm", "a key", b"first").unwrap();
    cache.store_record("gemm", "a key", b"second").unwrap();
    cache.store_record("gemm", "another", b"other").unwrap();
    assert_eq!(cache.record("gemm", "a key"), Ok(Some(b"second".to_vec())));
    assert_eq!(cache.record("gemm", "another"), Ok(Some(b"other".to_vec())));
    assert_eq!(cache.record("gemm", "a third"), Ok(None));
    assert_eq!(cache.record("other kind", "a key"), Ok(None));
    assert_eq!(cache.info().unwrap().entries, 2);

    let files: Vec<_> = (std::fs::read_dir(dir.path()).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        files.iter().all(|p| p.extension().unwrap() == "krecord"),
        "{files:?}"
    );
    for file in &files {
        let mut bytes = std::fs::read(file).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        std::fs::write(file, bytes).unwrap();
    }
    let refused = cache.record("gemm", "a key").unwrap_err();
    assert!(refused.contains("checksum"), "{refused}");
    assert!(refused.contains(".krecord"), "{refused}");
    for file in &files {
        std::fs::write(file, b"garbage").unwrap();
    }
    for key in ["a key", "another"] {
        let refused = cache.record("gemm", key).unwrap_err();
        assert!(refused.contains("without the entry header"), "{refused}");
    }

    assert_eq!(cache.clear().unwrap(), 2);
    assert_eq!(cache.record("gemm", "a key"), Ok(None));
    let none = KernelCache::disabled();
    none.store_record("gemm", "a key", b"value").unwrap();
    assert_eq!(none.record("gemm", "a key"), Ok(None));
}

/// Several modules through the cache at once (`kiln cache fill`, a device's first kernel):
/// each in its place in the list, compiled the first time and read back the second.
#[test]
fn modules_compile_in_parallel_and_hit_after() {
    if !nvrtc("modules in parallel") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let sources: Vec<(&'static str, &'static str)> =
        SMALL.iter().map(|&name| (name, source(name))).collect();
    let first = cache.modules(Compiler::Nvrtc, "sm_90", &sources);
    let second = cache.modules(Compiler::Nvrtc, "sm_90", &sources);
    for ((name, source), (first, second)) in sources.iter().zip(first.into_iter().zip(second)) {
        let (first, second) = (first.unwrap(), second.unwrap());
        assert_eq!(first.origin, Origin::Compiled, "{name}");
        assert_eq!(second.origin, Origin::Hit, "{name}");
        assert_eq!(first.code, second.code, "{name}");
        let (alone, _) = Compiler::Nvrtc.compile(name, source, "sm_90").unwrap();
        assert_eq!(first.code, alone, "{name}: not the module at its place");
    }
    assert_eq!(cache.info().unwrap().entries, SMALL.len());
}

/// The compiler an architecture names; anything else is refused with the forms it takes.
#[test]
fn an_architecture_names_its_compiler() {
    for arch in ["sm_90", "sm_80", "sm_90a", "sm_100"] {
        assert_eq!(Compiler::of_arch(arch).unwrap(), Compiler::Nvrtc, "{arch}");
    }
    for arch in ["gfx90a", "gfx942", "gfx1100"] {
        assert_eq!(Compiler::of_arch(arch).unwrap(), Compiler::Hiprtc, "{arch}");
    }
    for arch in [
        "",
        "sm90",
        "sm_",
        "sm_9x",
        "sm_90ab",
        "gfx",
        "gfx-90",
        "compute_90",
        "SM_90",
    ] {
        let error = Compiler::of_arch(arch).unwrap_err().to_string();
        assert!(error.contains(&format!("`{arch}`")), "{arch}: {error}");
        assert!(
            error.contains("sm_NN") && error.contains("gfxNNN"),
            "{error}"
        );
    }
}
