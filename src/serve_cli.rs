//! The arguments of `kiln serve`.

use std::time::Duration;

use anyhow::Result;
use kiln::commands;

use crate::generate_cli::RunCli;

/// Serve a model over HTTP with the OpenAI API (see `kiln::commands::serve`).
#[derive(clap::Args)]
pub struct ServeCli {
    /// A Hugging Face model directory or a preset name.
    #[arg(long)]
    model: String,
    /// The model id clients name (default: the preset, or the directory's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Seed of a preset's random weights.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port; the address is printed once the server listens.
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Sequences decoded at once (the KV pool's slots).
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// Positions of each slot, prompt and generated tokens together (default: the model's,
    /// at most 2048).
    #[arg(long)]
    max_seq: Option<usize>,
    /// Requests that may wait for a slot; past them the server answers 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    max_waiting: usize,
    /// Seconds requests in flight may still run after SIGINT or SIGTERM.
    #[arg(long, default_value_t = 30.0)]
    drain_seconds: f64,
    #[command(flatten)]
    run: RunCli,
}

impl ServeCli {
    pub fn into_args(self) -> Result<commands::HttpArgs> {
        let drain = Duration::try_from_secs_f64(self.drain_seconds).map_err(|_| {
            anyhow::anyhow!("--drain-seconds {}: give seconds >= 0", self.drain_seconds)
        })?;
        Ok(commands::HttpArgs {
            model: self.model,
            served_model_name: self.served_model_name,
            seed: self.seed,
            host: self.host,
            port: self.port,
            slots: self.slots,
            max_seq: self.max_seq,
            max_waiting: self.max_waiting,
            drain,
            cuda: self.run.cuda()?,
            mode: self.run.mode(),
            precision: self.run.precision(),
        })
    }
}
