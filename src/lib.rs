//! kiln: a graph-compiled execution engine for Transformer models.
//!
//! This facade re-exports kiln's crates under one name; the `kiln` binary is its command line.

pub use kiln_frontend as frontend;
pub use kiln_ir as ir;
pub use kiln_kernels as kernels;
pub use kiln_planner as planner;
pub use kiln_runtime as runtime;

pub mod commands;
pub mod demo;
pub mod launch;
pub mod memory;
pub mod signals;

/// When the process began kiln's work: the `kiln` binary marks it first thing in `main`, so
/// start-up times count from there (a library caller that never marks it counts from the first
/// call).
pub fn started() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}
