//! kiln-trainer: training as a job around the compiled train step — tokenized data and its
//! windows ([`data`]), learning-rate schedules ([`schedule`]), checkpoints that resume bit for
//! bit ([`checkpoint`]), the run itself ([`run`]), its metrics file and loss curves
//! ([`metrics`]).

pub mod checkpoint;
pub mod data;
mod error;
pub mod metrics;
pub mod run;
pub mod run_dir;
pub mod schedule;

pub use data::{Sampling, Split, Stream, TokenDType, TokenData};
pub use error::{Error, Result};
pub use run::{Observer, Outcome, RunOptions, Session, StepRecord};
pub use run_dir::RunDir;
pub use schedule::{Decay, Schedule};
