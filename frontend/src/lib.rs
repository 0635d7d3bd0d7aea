//! kiln-frontend: the eager oracle and the models.
//!
//! The eager oracle runs every op immediately on the CPU reference kernels and records a tape
//! ([`autograd`]) so `backward()` can compute gradients; every compiled result of kiln is
//! checked against it. Models (Qwen2 and Llama families), Hugging Face configs and safetensors
//! weights, tracing into the IR and the prefill/decode/train programs will live here too.

pub mod autograd;
mod error;
pub mod eval;
pub mod hf;
mod launch;
pub mod memory_sources;
pub mod model;
pub mod ops;
pub mod programs;
pub mod trace;
pub mod value_trace;

pub use autograd::Var;
pub use error::{Error, Result};
