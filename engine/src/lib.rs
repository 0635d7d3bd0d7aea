//! kiln-engine: what serving and generation need around a compiled model — the tokenizer with
//! streaming detokenization and the chat template.

pub mod chat;
mod error;
mod files;
pub mod tokenizer;

pub use error::{Error, Result};
