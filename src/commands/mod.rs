//! The subcommands of `kiln` that work on model files.

mod eval;
mod init_model;

pub use eval::eval;
pub use init_model::init_model;
