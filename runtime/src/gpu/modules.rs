//! A device's kernel modules, loaded all at once on first use: each one's machine code for the
//! device's architecture from the on-disk [`KernelCache`], the missing ones compiled in
//! parallel (and stored). A module that cannot be compiled or loaded keeps its error, so an
//! architecture without an instruction one module uses still runs the others.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::kernel_cache::{Compiler, KernelCache, Origin};

/// How the kernel modules were obtained.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelReport {
    pub modules: usize,
    /// Read from the on-disk cache.
    pub hits: usize,
    /// Compiled (no entry, or an entry rebuilt).
    pub compiled: usize,
    /// Wall seconds from the first kernel asked for to every module loaded.
    pub seconds: f64,
}

/// The loaded modules (`M`, the runtime's handle) by name, and what loading them took.
pub(crate) struct Modules<M> {
    pub loaded: BTreeMap<&'static str, Result<M>>,
    pub report: KernelReport,
}

impl<M> Modules<M> {
    /// Every module of `kiln_kernels::gpu::SOURCES` compiled by `compiler` for `arch` (through
    /// `cache`) and loaded by `load`.
    pub fn load(
        cache: &KernelCache,
        compiler: Compiler,
        arch: &str,
        load: impl Fn(&str, Vec<u8>) -> Result<M>,
    ) -> Self {
        let start = Instant::now();
        let sources = kiln_kernels::gpu::SOURCES;
        let compiled = cache.modules(compiler, arch, sources);
        let mut report = KernelReport {
            modules: sources.len(),
            ..KernelReport::default()
        };
        let mut loaded = BTreeMap::new();
        for ((name, _), compiled) in sources.iter().zip(compiled) {
            let compiled = match compiled {
                Ok(compiled) => compiled,
                Err(e) => {
                    loaded.insert(*name, Err(e));
                    continue;
                }
            };
            match &compiled.origin {
                Origin::Hit => report.hits += 1,
                Origin::Compiled => report.compiled += 1,
                Origin::Rebuilt(reason) => {
                    eprintln!("warning: kernel cache: {reason}; rebuilt it");
                    report.compiled += 1;
                }
            }
            if let Some(reason) = &compiled.write_error {
                eprintln!("warning: kernel cache: could not store `{name}`: {reason}");
            }
            loaded.insert(*name, load(name, compiled.code));
        }
        report.seconds = start.elapsed().as_secs_f64();
        Modules { loaded, report }
    }

    /// What loading the modules in `slot` took (all zero before they are loaded).
    pub fn report(slot: &std::sync::Mutex<Option<Self>>) -> KernelReport {
        let modules = slot.lock().ok();
        (modules.as_deref().and_then(Option::as_ref))
            .map_or_else(KernelReport::default, |m| m.report.clone())
    }

    /// Module `name`, or why it cannot be used.
    pub fn get(&self, name: &str, missing: impl Fn() -> Error) -> Result<&M> {
        let loaded = self.loaded.get(name).ok_or_else(missing)?;
        // A module that failed fails only the kernels asked of it.
        loaded.as_ref().map_err(|e| e.clone())
    }
}
