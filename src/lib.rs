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
pub mod memory;
pub mod signals;
