//! The subcommands of `kiln` that work on model files.

mod bench;
mod bench_serve;
mod cache;
mod compile;
mod eval;
mod generate;
mod init_model;
mod plan;
mod planner_report;
mod serve;
mod tokenize;
mod train;

pub use bench::{bench, table as bench_table, BenchArgs};
pub use bench_serve::{bench_serve, serve_table, ServeArgs};
pub use cache::fill_cache;
pub use compile::compile;
pub use eval::{eval, EvalDevice, EvalEngine, EvalMode, Trace};
pub use generate::{generate, GenerateArgs, Input, Prompt, SchedulerKind};
pub use init_model::init_model;
pub use plan::{plan, PlanFormat, PlanView};
pub use planner_report::planner_report;
pub use serve::{serve, HttpArgs};
pub use tokenize::tokenize;
pub use train::{train, FreshRun, TrainArgs};
