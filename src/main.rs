//! The `kiln` command line.

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kiln",
    version,
    about = "Graph-compiled execution engine for Transformer models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the embedded tiny model through the eager oracle: forward, backward, loss and
    /// gradient norms.
    Demo {
        /// Seed for the random weights and tokens.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Sequences in the batch.
        #[arg(long, default_value_t = 2)]
        batch: usize,
        /// Tokens per sequence.
        #[arg(long, default_value_t = 16)]
        seq: usize,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Demo { seed, batch, seq } => {
            let report = kiln::demo::run(seed, batch, seq)?;
            print!("{}", report.text);
        }
    }
    Ok(())
}
