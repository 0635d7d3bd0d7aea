//! `kiln cache fill`: every kernel module compiled for an architecture into the on-disk kernel
//! cache, ahead of the first start on such a device. Neither compiler needs a GPU, so a
//! machine image or a CI job can fill the cache that the GPU machines then read.

use std::time::Instant;

use anyhow::{bail, Result};
use kiln_runtime::kernel_cache::{Compiled, Compiler, KernelCache, Origin};

/// Fills `cache` with every module of `kiln_kernels::gpu::SOURCES` for `arch` (`sm_90`,
/// `gfx90a`); returns what it did (the caller names the cache). Modules already there are
/// read and checked, not compiled again; a module that fails to compile or to be stored is
/// named, and fails the command after the others are done.
pub fn fill_cache(cache: &KernelCache, arch: &str) -> Result<String> {
    let compiler = Compiler::of_arch(arch)?;
    if let Some(reason) = compiler.unavailable() {
        bail!("cannot compile for {arch}: {reason}");
    }
    let version = compiler.describe()?;
    let sources = kiln_kernels::gpu::SOURCES;
    let start = Instant::now();
    let (mut compiled, mut present, mut failures) = (0, 0, Vec::new());
    for ((name, _), module) in sources.iter().zip(cache.modules(compiler, arch, sources)) {
        match module {
            Ok(Compiled {
                write_error: Some(reason),
                ..
            }) => failures.push(format!("`{name}`: compiled but not stored: {reason}")),
            Ok(module) => match module.origin {
                Origin::Hit => present += 1,
                Origin::Compiled | Origin::Rebuilt(_) => compiled += 1,
            },
            Err(e) => failures.push(format!("`{name}`: {e}")),
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    if !failures.is_empty() {
        bail!(
            "{} of {} modules for {arch} ({version}) failed:\n  {}",
            failures.len(),
            sources.len(),
            failures.join("\n  ")
        );
    }
    Ok(format!(
        "{} modules for {arch} ({version}): {compiled} compiled, {present} already there, in \
         {seconds:.1} s",
        sources.len()
    ))
}
