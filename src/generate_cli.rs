//! The arguments of `kiln generate` and their reading into the command's own.

use std::path::PathBuf;

use anyhow::Result;
use kiln::commands;

use crate::{BenchMode, EvalDeviceArg, Numerics};

/// Continue prompts on compiled programs (see `kiln::commands::generate`).
#[derive(clap::Args)]
pub struct GenerateCli {
    /// A Hugging Face model directory or a preset name.
    #[arg(long)]
    model: String,
    /// The prompt text (needs the model's tokenizer.json).
    #[arg(long, conflicts_with_all = ["prompt_ids", "prompts"])]
    prompt: Option<String>,
    /// The prompt as token ids, comma-separated (for models without a tokenizer).
    #[arg(long, value_delimiter = ',', conflicts_with = "prompts")]
    prompt_ids: Option<Vec<u32>>,
    /// Many prompts, run in order: a JSONL file of {"prompt": TEXT} or {"prompt_ids":
    /// [...]} lines, or a safetensors file of integer vectors prompt.0, prompt.1, ...
    #[arg(long)]
    prompts: Option<PathBuf>,
    /// Write every request's tokens, text, finish reason and latencies, and a P50/P95
    /// summary, to this JSON file (must not exist).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Put the prompt through the model's chat template as a user message.
    #[arg(long)]
    chat: bool,
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    /// 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    /// Seed of the sampling (and of a preset's random weights).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when this text appears (repeatable); it is not printed.
    #[arg(long)]
    stop: Vec<String>,
    #[command(flatten)]
    run: RunCli,
    /// Rows of the KV cache (default: the prompt and --max-new-tokens).
    #[arg(long)]
    max_seq: Option<usize>,
    /// reference: one request at a time, each with its own cache; continuous: batches of
    /// requests joining and leaving at step boundaries over one KV pool (--slots); bucketed:
    /// continuous batching over pools of different slot lengths (--buckets, --spill).
    #[arg(long, value_enum, default_value_t = SchedulerArg::Reference)]
    scheduler: SchedulerArg,
    /// Continuous: sequences it runs at once (its KV pool's slots).
    #[arg(long, default_value_t = 8)]
    slots: usize,
    /// The bucketed scheduler's KV pools, SLOTSxPOSITIONS each, e.g. 8x256,2x2048: a request
    /// runs in the smallest whose slots hold it.
    #[arg(long, value_delimiter = ',', value_parser = parse_bucket)]
    buckets: Vec<(usize, usize)>,
    /// Bucketed: a request whose bucket is full may take the first larger one with room.
    #[arg(long)]
    spill: bool,
}

/// Where and how the engine's programs run (`kiln generate`, `kiln serve`).
#[derive(clap::Args)]
pub(crate) struct RunCli {
    #[arg(long, value_enum, default_value_t = EvalDeviceArg::Cpu)]
    device: EvalDeviceArg,
    /// eager: every launch issued each step; graph: captured once and replayed.
    #[arg(long, value_enum, default_value_t = BenchMode::Graph)]
    mode: BenchMode,
    /// f32, or bf16: bf16 weights and KV caches, f32 activations (bf16-gemm: bf16 GEMM
    /// inputs over f32 weights; bf16-swiglu: bf16-gemm with SwiGLU's gate and up in bf16).
    #[arg(long, value_enum, default_value_t = Numerics::F32)]
    precision: Numerics,
}

impl RunCli {
    /// Whether `--device cuda` was asked for (`--device hip` is refused).
    pub fn cuda(&self) -> Result<bool> {
        self.device.cuda()
    }

    pub fn mode(&self) -> kiln_runtime::RunMode {
        self.mode.into()
    }

    pub fn precision(&self) -> kiln_frontend::model::Precision {
        self.precision.into()
    }
}

/// `SLOTSxPOSITIONS`.
pub(crate) fn parse_bucket(text: &str) -> std::result::Result<(usize, usize), String> {
    let (slots, positions) = text
        .split_once('x')
        .ok_or_else(|| format!("`{text}`: expected SLOTSxPOSITIONS, e.g. 8x256"))?;
    let number = |part: &str| {
        part.parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("`{text}`: `{part}` is not a count of at least 1"))
    };
    Ok((number(slots)?, number(positions)?))
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum SchedulerArg {
    Reference,
    Continuous,
    Bucketed,
}

impl GenerateCli {
    pub fn into_args(self) -> Result<commands::GenerateArgs> {
        let GenerateCli {
            model,
            prompt,
            prompt_ids,
            prompts,
            json,
            chat,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            seed,
            stop,
            run,
            max_seq,
            scheduler,
            slots,
            buckets,
            spill,
        } = self;
        let input = match (prompt, prompt_ids, prompts) {
            (Some(text), _, _) => commands::Input::One(commands::Prompt::Text(text)),
            (None, Some(ids), _) => commands::Input::One(commands::Prompt::Ids(ids)),
            (None, None, Some(file)) => commands::Input::File(file),
            (None, None, None) => {
                anyhow::bail!("give --prompt TEXT, --prompt-ids 1,2,3 or --prompts FILE")
            }
        };
        let backend = match (run.cuda()?, kiln::launch::Rank::from_env()?) {
            (false, _) => kiln_runtime::Backend::Cpu,
            // A launched rank owns its own GPU.
            (true, Some(rank)) => {
                kiln_runtime::Backend::Cuda(kiln_runtime::cuda::CudaDevice::open(rank.local_rank)?)
            }
            (true, None) => kiln_runtime::Backend::cuda()?,
        };
        Ok(commands::GenerateArgs {
            model,
            seed,
            input,
            chat,
            max_new_tokens,
            sampling: kiln_engine::sampling::SamplingParams {
                temperature,
                top_k,
                top_p,
                min_p,
                repetition_penalty,
                seed,
            },
            stop,
            backend,
            mode: run.mode(),
            precision: run.precision(),
            max_seq,
            scheduler: match scheduler {
                SchedulerArg::Reference => commands::SchedulerKind::Reference,
                SchedulerArg::Continuous => commands::SchedulerKind::Continuous,
                SchedulerArg::Bucketed => commands::SchedulerKind::Bucketed { spill },
            },
            slots,
            buckets,
            json,
        })
    }
}
