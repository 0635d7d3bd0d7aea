//! The `kiln` command line.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand, ValueEnum};

use kiln::commands;
use kiln_frontend::model::Precision;
use kiln_frontend::programs::{ProgramKind, ProgramOptions};

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

/// Dtypes a checkpoint can be written in.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum CheckpointDType {
    F32,
    Bf16,
    F16,
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
    /// Write a preset's config.json and model.safetensors with seeded random weights, so
    /// official shapes run with no download.
    InitModel {
        /// tiny, qwen2.5-0.5b or deepseek-r1-distill-qwen-1.5b.
        #[arg(long)]
        preset: String,
        /// Seed for the random weights.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Directory to create or fill; existing model files are never overwritten.
        #[arg(long)]
        out: PathBuf,
        /// Dtype of the written weights (default: the preset's official dtype).
        #[arg(long, value_enum)]
        dtype: Option<CheckpointDType>,
    },
    /// Logits, causal-LM loss and (with --grads) every parameter's gradient for a batch of
    /// tokens, written as safetensors.
    Eval {
        /// A Hugging Face model directory or a preset name.
        #[arg(long)]
        model: String,
        /// Seed for a preset's random weights (ignored for a directory).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// safetensors file with an integer tensor `tokens` [B,T].
        #[arg(long)]
        tokens: PathBuf,
        /// Output safetensors file (logits, loss, grad.<name>); must not exist yet.
        #[arg(long)]
        out: PathBuf,
        /// Also write the gradient of the loss for every parameter.
        #[arg(long)]
        grads: bool,
        /// oracle: the eager engine with tape autograd; interpret: the traced eval program on
        /// the reference interpreter, gradients from IR autodiff.
        #[arg(long, value_enum, default_value_t = Mode::Oracle)]
        mode: Mode,
        /// f32 GEMMs, or bf16 GEMM inputs with f32 accumulation (mixed precision).
        #[arg(long, value_enum, default_value_t = Numerics::F32)]
        precision: Numerics,
    },
    /// Trace a model into a program graph and verify it; print a summary or the IR.
    Compile {
        /// A Hugging Face model directory or a preset name.
        #[arg(long)]
        model: String,
        #[arg(long, value_enum)]
        program: Program,
        /// Sequences in the batch.
        #[arg(long, default_value_t = 1)]
        batch: usize,
        /// Tokens per sequence (prefill, train).
        #[arg(long, default_value_t = 16)]
        seq: usize,
        /// Rows of the KV cache (prefill, decode).
        #[arg(long, default_value_t = 64)]
        max_seq: usize,
        /// Print the IR text instead of a summary.
        #[arg(long)]
        print_ir: bool,
        /// f32 GEMMs, or bf16 GEMM inputs with f32 accumulation (mixed precision).
        #[arg(long, value_enum, default_value_t = Numerics::F32)]
        precision: Numerics,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Numerics {
    F32,
    Bf16Gemm,
}

impl From<Numerics> for Precision {
    fn from(numerics: Numerics) -> Self {
        match numerics {
            Numerics::F32 => Precision::F32,
            Numerics::Bf16Gemm => Precision::Bf16Gemm,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Oracle,
    Interpret,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Program {
    Prefill,
    Decode,
    Train,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Demo { seed, batch, seq } => {
            let report = kiln::demo::run(seed, batch, seq)?;
            print!("{}", report.text);
        }
        Command::InitModel {
            preset,
            seed,
            out,
            dtype,
        } => {
            let dtype = dtype.map(|d| match d {
                CheckpointDType::F32 => kiln_ir::DType::F32,
                CheckpointDType::Bf16 => kiln_ir::DType::BF16,
                CheckpointDType::F16 => kiln_ir::DType::F16,
            });
            commands::init_model(&preset, seed, &out, dtype)?;
        }
        Command::Eval {
            model,
            seed,
            tokens,
            out,
            grads,
            mode,
            precision,
        } => {
            let mode = match mode {
                Mode::Oracle => commands::EvalMode::Oracle,
                Mode::Interpret => commands::EvalMode::Interpret,
            };
            commands::eval(&model, seed, &tokens, &out, grads, mode, precision.into())?
        }
        Command::Compile {
            model,
            program,
            batch,
            seq,
            max_seq,
            print_ir,
            precision,
        } => {
            let kind = match program {
                Program::Prefill => ProgramKind::Prefill,
                Program::Decode => ProgramKind::Decode,
                Program::Train => ProgramKind::Train,
            };
            anyhow::ensure!(batch >= 1 && seq >= 1, "--batch and --seq must be >= 1");
            anyhow::ensure!(
                kind == ProgramKind::Train || seq <= max_seq,
                "--seq {seq} does not fit a cache of --max-seq {max_seq}"
            );
            let options = ProgramOptions {
                batch,
                seq,
                max_seq,
                precision: precision.into(),
                ..ProgramOptions::default()
            };
            print!("{}", commands::compile(&model, kind, &options, print_ir)?);
        }
    }
    Ok(())
}
