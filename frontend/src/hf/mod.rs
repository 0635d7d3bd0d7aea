//! Hugging Face model directories: `config.json`, `model.safetensors` (or a sharded
//! `model.safetensors.index.json`), and kiln's built-in presets.

pub mod config;
mod files;
pub mod presets;
pub mod safetensors_io;
pub mod source;
pub mod weights_io;
