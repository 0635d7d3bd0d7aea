//! kiln-capi: kiln's stable C ABI, and the session layer it shares with the Python package.
//!
//! [`session`] is plain Rust: a loaded [`session::Model`], its compiled
//! [`session::Program`]s, evaluation and plans, each a call into the same library functions the
//! CLI uses. [`abi`] puts it behind `extern "C"` functions (header: `include/kiln.h`, made by
//! cbindgen): opaque handles, non-owning tensor descriptors, an explicit stream, status codes
//! and a thread-local last-error message. No call infers ownership from a pointer, and no
//! panic crosses the boundary.

pub mod abi;
mod error;
pub mod generation;
mod program;
pub mod session;

pub use error::{Error, Result};
