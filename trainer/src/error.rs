//! Errors of the training job; each names the file, flag or checkpoint at fault.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("data file {}: {reason}", path.display())]
    Data { path: PathBuf, reason: String },
    #[error("{flag}: {reason}")]
    Option { flag: &'static str, reason: String },
    #[error("checkpoint {}: {reason}", path.display())]
    Checkpoint { path: PathBuf, reason: String },
    #[error("run directory {}: {reason}", path.display())]
    RunDir { path: PathBuf, reason: String },
    #[error(transparent)]
    Frontend(#[from] kiln_frontend::Error),
    #[error(transparent)]
    Runtime(#[from] kiln_runtime::Error),
    #[error(transparent)]
    Plan(#[from] kiln_planner::Error),
    #[error(transparent)]
    Ir(#[from] kiln_ir::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
