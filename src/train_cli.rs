//! The arguments of `kiln train` and `kiln tokenize`.

use std::path::PathBuf;

use anyhow::Result;
use kiln::commands::{self, FreshRun, TrainArgs};
use kiln_trainer::{Decay, RunOptions, Sampling, Schedule, TokenDType};

use crate::{BenchMode, EvalDeviceArg};

/// Train a model on a token file: the compiled train step with AdamW, a learning-rate
/// schedule, optional clipping, validation, checkpoints that resume bit for bit.
#[derive(clap::Args)]
pub struct TrainCli {
    /// A Hugging Face model directory or a preset name (a new run).
    #[arg(long, required_unless_present = "resume")]
    model: Option<String>,
    /// Token ids: a flat little-endian file (see --data-dtype) or a safetensors file with an
    /// integer `tokens` tensor; `kiln tokenize` makes one. On a resume: the checkpoint's.
    #[arg(long, required_unless_present = "resume")]
    data: Option<PathBuf>,
    /// Ids of a flat data file: u16 or u32 (default: u16 when the vocabulary fits, else u32,
    /// as `kiln tokenize` writes them).
    #[arg(long, value_enum)]
    data_dtype: Option<DataDType>,
    /// Optimizer steps of the run.
    #[arg(long, required_unless_present = "resume", conflicts_with = "resume")]
    steps: Option<u64>,
    /// Rows of each micro-batch.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "resume")]
    batch: u32,
    /// Micro-batches per step whose gradients are summed before the update (gradient
    /// accumulation: a step sees --accumulate × --batch rows).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "resume")]
    accumulate: u64,
    /// Tokens per row (each window holds --seq + 1: every position predicts the next).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..), conflicts_with = "resume")]
    seq: u32,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-4, value_parser = positive, conflicts_with = "resume")]
    lr: f64,
    /// Steps of linear warmup from 0 (transformers' schedules: the first step's rate is 0).
    #[arg(long, default_value_t = 0, conflicts_with = "resume")]
    warmup: u64,
    #[arg(long, value_enum, default_value_t = ScheduleArg::Cosine, conflicts_with = "resume")]
    schedule: ScheduleArg,
    /// Clip the global gradient norm to this (Hugging Face's Trainer uses 1.0); off when left
    /// out. Every gradient then exists at once before the first update.
    #[arg(long, value_parser = positive, conflicts_with = "resume")]
    clip_grad_norm: Option<f64>,
    /// The most arena bytes a train step's plan may take (e.g. 3.3GiB): values the backward
    /// reads are recomputed there, the cheapest per byte first, until it fits. The same bits
    /// as without it; a resumed run keeps its own.
    #[arg(long, value_parser = kiln::memory::parse_bytes, conflicts_with = "resume")]
    memory_budget: Option<u64>,
    /// AdamW's decoupled weight decay (norm weights and biases exempt unless
    /// --decay-vectors).
    #[arg(long, default_value_t = 0.01, value_parser = non_negative, conflicts_with = "resume")]
    weight_decay: f64,
    /// Decay norm weights and biases too.
    #[arg(long, conflicts_with = "resume")]
    decay_vectors: bool,
    #[arg(long, default_value_t = 0.9, value_parser = beta, conflicts_with = "resume")]
    beta1: f64,
    #[arg(long, default_value_t = 0.999, value_parser = beta, conflicts_with = "resume")]
    beta2: f64,
    #[arg(long, default_value_t = 1e-8, value_parser = non_negative, conflicts_with = "resume")]
    eps: f64,
    /// f32; bf16-gemm: bf16 GEMM inputs over f32 master weights; bf16-swiglu: bf16-gemm with
    /// the MLP's gate and up products kept in bf16.
    #[arg(long, value_enum, default_value_t = TrainPrecision::F32, conflicts_with = "resume")]
    precision: TrainPrecision,
    /// The fraction of the data (its end) held out for validation; 0 for none.
    #[arg(long, default_value_t = 0.05, conflicts_with = "resume")]
    val_fraction: f64,
    /// Validation loss every this many steps (and at the end); 0 for never.
    #[arg(long, default_value_t = 100, conflicts_with = "resume")]
    val_every: u64,
    /// Batches of the validation loss (the same windows every time).
    #[arg(long, default_value_t = 4, conflicts_with = "resume")]
    val_batches: u64,
    /// A checkpoint every this many steps (and at the end; 0: only at the end).
    #[arg(long, default_value_t = 0, conflicts_with = "resume")]
    save_every: u64,
    /// Checkpoints kept (the oldest go).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..), conflicts_with = "resume")]
    keep: u64,
    /// Seed of random windows (and of a preset's weights).
    #[arg(long, default_value_t = 0, conflicts_with = "resume")]
    seed: u64,
    /// random: each row a window drawn by --seed; sequential: the data in order, B·T ids a
    /// batch (llm.c's loader), wrapping around.
    #[arg(long, value_enum, default_value_t = SamplingArg::Random, conflicts_with = "resume")]
    sampling: SamplingArg,
    /// The run directory (new or empty): checkpoints step-NNNNNN/, metrics.jsonl, loss.svg.
    /// On a resume: the checkpoint's run directory unless given.
    #[arg(long, required_unless_present = "resume")]
    out: Option<PathBuf>,
    /// Continue a run from a checkpoint directory, or from the newest checkpoint of a run
    /// directory, with the options it was started with.
    #[arg(long, conflicts_with = "model")]
    resume: Option<PathBuf>,
    /// cpu or cuda (default: cpu for a new run; a resumed run's own device).
    #[arg(long, value_enum)]
    device: Option<EvalDeviceArg>,
    /// eager: every launch issued each step; graph: captured once and replayed.
    #[arg(long, value_enum, default_value_t = BenchMode::Graph)]
    mode: BenchMode,
    /// Streams of the train step: 2 (the default on one GPU) runs the weight gradients'
    /// GEMMs and their updates beside the rest of the backward, with the same bits; 1 (the
    /// default on the CPU and in a data-parallel run) runs every op in one order.
    #[arg(long)]
    streams: Option<usize>,
}

fn non_negative(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a finite number >= 0")),
    }
}

fn beta(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..1.0).contains(&v) => Ok(v),
        _ => Err(format!("`{text}` is not in [0, 1)")),
    }
}

fn positive(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!("`{text}` is not a finite number > 0")),
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum DataDType {
    U16,
    U32,
}

impl From<DataDType> for TokenDType {
    fn from(d: DataDType) -> Self {
        match d {
            DataDType::U16 => TokenDType::U16,
            DataDType::U32 => TokenDType::U32,
        }
    }
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum ScheduleArg {
    Cosine,
    Linear,
    Constant,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum SamplingArg {
    Random,
    Sequential,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum TrainPrecision {
    F32,
    Bf16Gemm,
    Bf16Swiglu,
}

impl TrainCli {
    pub fn into_args(self) -> Result<TrainArgs> {
        let cuda = self.device.map(EvalDeviceArg::cuda).transpose()?;
        let fresh = match (&self.model, self.steps) {
            (Some(model), Some(steps)) => Some(FreshRun {
                options: RunOptions {
                    model: model.clone(),
                    batch: self.batch as usize,
                    seq: self.seq as usize,
                    seed: self.seed,
                    sampling: match self.sampling {
                        SamplingArg::Random => Sampling::Random,
                        SamplingArg::Sequential => Sampling::Sequential,
                    },
                    schedule: Schedule {
                        lr: self.lr,
                        warmup: self.warmup,
                        steps,
                        decay: match self.schedule {
                            ScheduleArg::Cosine => Decay::Cosine,
                            ScheduleArg::Linear => Decay::Linear,
                            ScheduleArg::Constant => Decay::Constant,
                        },
                    },
                    accumulate: self.accumulate,
                    clip_grad_norm: self.clip_grad_norm,
                    memory_budget: self.memory_budget,
                    weight_decay: self.weight_decay,
                    beta1: self.beta1,
                    beta2: self.beta2,
                    eps: self.eps,
                    decay_vectors: self.decay_vectors,
                    precision: match self.precision {
                        TrainPrecision::F32 => "f32".into(),
                        TrainPrecision::Bf16Gemm => "bf16-gemm".into(),
                        TrainPrecision::Bf16Swiglu => "bf16-swiglu".into(),
                    },
                    device: match cuda {
                        Some(true) => "cuda".into(),
                        _ => "cpu".into(),
                    },
                    val_fraction: self.val_fraction,
                    val_every: self.val_every,
                    val_batches: self.val_batches,
                    save_every: self.save_every,
                    keep: self.keep as usize,
                    // Under `kiln launch`, the world's size (`commands::train`).
                    ranks: 1,
                },
            }),
            _ => None,
        };
        Ok(TrainArgs {
            fresh,
            resume: self.resume,
            data: self.data,
            data_dtype: self.data_dtype.map(Into::into),
            out: self.out,
            cuda,
            mode: self.mode.into(),
            streams: self.streams,
        })
    }
}

/// Tokenize a text file into token ids for `kiln train`.
#[derive(clap::Args)]
pub struct TokenizeCli {
    /// A tokenizer.json, or a model directory holding one.
    #[arg(long)]
    tokenizer: PathBuf,
    /// The text to tokenize (UTF-8).
    #[arg(long = "in")]
    input: PathBuf,
    /// The token file to write (must not exist): flat ids, or a safetensors file with a
    /// `tokens` tensor when the name ends in .safetensors.
    #[arg(long)]
    out: PathBuf,
    /// Ids of a flat file (default: u16 when the vocabulary fits, else u32).
    #[arg(long, value_enum)]
    dtype: Option<DataDType>,
}

impl TokenizeCli {
    pub fn run(self) -> Result<()> {
        commands::tokenize(
            &self.tokenizer,
            &self.input,
            &self.out,
            self.dtype.map(Into::into),
        )
    }
}
