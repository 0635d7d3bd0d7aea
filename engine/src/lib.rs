//! kiln-engine: what generation needs around a compiled model — the tokenizer with streaming
//! detokenization and the chat template, choosing each next token (sampling), deciding when a
//! request is done (stop criteria), with the defaults a model directory's
//! `generation_config.json` carries.

pub mod chat;
pub mod engine;
mod error;
pub mod generate;
pub mod generation_config;
mod regular_file;
pub mod sampler;
pub mod sampling;
pub mod scheduler;
pub mod stop;
#[cfg(test)]
mod testing;
pub mod tokenizer;

pub use error::{Error, Result};
