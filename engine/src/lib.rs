//! kiln-engine: what generation needs around a compiled model — choosing each next token
//! (sampling) and deciding when a request is done (stop criteria), with the defaults a model
//! directory's `generation_config.json` carries.

mod error;
pub mod generation_config;
mod regular_file;
pub mod sampler;
pub mod sampling;
pub mod stop;
#[cfg(test)]
mod testing;

pub use error::{Error, Result};
