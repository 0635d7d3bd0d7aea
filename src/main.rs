//! The `kiln` command line.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use kiln::commands;

mod bench_cli;
mod generate_cli;
mod serve_cli;
mod train_cli;
use bench_cli::BenchCli;
use generate_cli::GenerateCli;
use kiln_frontend::model::Precision;
use kiln_frontend::programs::{ProgramKind, ProgramOptions};
use serve_cli::ServeCli;
use train_cli::{TokenizeCli, TrainCli};

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
        /// the reference interpreter, gradients from IR autodiff; planned: the eval program
        /// planned into one arena and run on --device; graph: the same, captured once and
        /// replayed.
        #[arg(long, value_enum, default_value_t = Mode::Oracle)]
        mode: Mode,
        /// Where planned and graph modes run.
        #[arg(long, value_enum, default_value_t = EvalDeviceArg::Cpu)]
        device: EvalDeviceArg,
        /// f32; bf16-gemm: bf16 GEMM inputs (mixed precision); bf16-swiglu: bf16-gemm with the
        /// MLP's gate and up products in bf16; bf16: bf16 weights and caches (inference).
        #[arg(long, value_enum, default_value_t = Numerics::F32)]
        precision: Numerics,
        /// Also write these intermediate values as trace.<name>: value names or globs (`*`,
        /// `?`), e.g. `layers.*.attn.out`; repeat the flag or give a comma list. `--trace
        /// list` prints the names there are and computes nothing.
        #[arg(long, value_name = "PATTERN")]
        trace: Vec<String>,
    },
    /// Continue a prompt: text streamed to standard output as it is generated (compiled
    /// prefill and decode programs, replayed per token).
    Generate(GenerateCli),
    /// Serve a model over HTTP with the OpenAI API: /v1/completions, /v1/chat/completions
    /// (streamed as server-sent events with "stream": true), /v1/models, /health, /metrics.
    Serve(ServeCli),
    /// Train a model on a token file: AdamW on the compiled train step, a learning-rate
    /// schedule, validation, checkpoints (Hugging Face model directories with the optimizer
    /// state) that resume bit for bit, metrics.jsonl and loss.svg. Ctrl-C stops at the next
    /// step and saves.
    Train(Box<TrainCli>),
    /// Encode a text file with a tokenizer into the token file `kiln train` reads.
    Tokenize(TokenizeCli),
    /// The on-disk cache of compiled kernel modules ($KILN_CACHE_DIR, else
    /// $XDG_CACHE_HOME/kiln, else ~/.cache/kiln; in its kernels/ directory).
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Trace a model into a program graph and verify it; print a summary or the IR.
    Compile {
        #[command(flatten)]
        program: ProgramArgs,
        /// Print the IR text instead of a summary.
        #[arg(long)]
        print_ir: bool,
    },
    /// Run a command as N ranks, one process per GPU, as torchrun does: `kiln launch --nproc 2
    /// -- kiln train --device cuda ...` trains data-parallel over NCCL (a build with
    /// --features nccl). Each rank gets KILN_RANK, KILN_WORLD_SIZE, KILN_LOCAL_RANK (its GPU)
    /// and the NCCL id through a rendezvous file; NCCL_NVLS_ENABLE=0. The first rank that
    /// fails stops the others.
    Launch {
        /// Ranks to start (one per GPU).
        #[arg(long)]
        nproc: usize,
        /// Seconds the ranks may take to meet (rank 0 publishes the NCCL id, the others wait
        /// for it).
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
        rendezvous_timeout: u64,
        /// The command each rank runs, after `--` (a first word `kiln` is this kiln).
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Plan a program: schedule, buffers, one arena, streams; dump it as text, JSON, CSV or SVG.
    Plan {
        #[command(flatten)]
        program: ProgramArgs,
        /// Streams (1 = serial).
        #[arg(long, default_value_t = 1)]
        streams: usize,
        #[arg(long, value_enum, default_value_t = Format::Text)]
        format: Format,
        /// Write the dump to this file (must not exist) instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Check the plan with the independent plan verifier.
        #[arg(long)]
        verify: bool,
        /// Whose kernels the workspaces are sized for: the CPU reference, CUDA (what `kiln
        /// bench` plans for), or any (the larger need: the plan runs on either).
        #[arg(long, value_enum, default_value_t = PlanBackend::Any)]
        backend: PlanBackend,
        /// Train: the most arena bytes the plan may take (e.g. 3.3GiB); values the backward
        /// reads are recomputed there, the cheapest per byte first, until it fits.
        #[arg(long, value_parser = kiln::memory::parse_bytes)]
        memory_budget: Option<u64>,
        /// source: instead of the plan, the arena bytes live at the peak and over the
        /// schedule by layer and category (saved activation, gradient, optimizer update,
        /// logits/loss, workspace); text, json or svg (stacked over the schedule).
        /// launches: the launches one run issues on a CUDA device (lowered here, no device
        /// needed), by op and by kernel; text or json.
        #[arg(long, value_enum)]
        by: Option<PlanBy>,
    },
    /// Time one program on a device: median and p95 per step (device events), tokens/s,
    /// arena vs lower bound, device memory, capture time, launches per step.
    Bench(BenchCli),
    /// The planner quality table for the official presets (prefill, decode B=1 and B=8, train):
    /// arena, lower bound, ratio, naive sum of activations, planning time. Markdown.
    PlannerReport {
        /// Streams (1 = serial).
        #[arg(long, default_value_t = 1)]
        streams: usize,
        /// Plan each program this many times and report the fastest.
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
}

/// Shapes and numerics of a program, shared by `compile` and `plan`.
#[derive(clap::Args)]
struct ProgramArgs {
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
    /// Rows of the KV cache (default: prefill --seq; decode 1024, or the model's positions
    /// when fewer).
    #[arg(long)]
    max_seq: Option<usize>,
    /// f32; bf16-gemm: bf16 GEMM inputs (mixed precision); bf16-swiglu: bf16-gemm with the
    /// MLP's gate and up products in bf16; bf16: bf16 weights and caches (inference).
    #[arg(long, value_enum, default_value_t = Numerics::F32)]
    precision: Numerics,
    /// The fusion pass: on, or off for the unfused reference program.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    fusion: Switch,
    /// Train: clip the global gradient norm in the graph (as `kiln train --clip-grad-norm`;
    /// every gradient then lives until the updates, which the plan shows).
    #[arg(long)]
    clip_grad_norm: Option<f64>,
    /// Prefill, decode: the program of one rank of this many tensor-parallel ranks (its
    /// share of the heads and MLP columns; an all_reduce after o_proj and down_proj).
    #[arg(long)]
    tensor_parallel: Option<usize>,
    /// Train: the step of one data-parallel rank, its gradients all-reduced in buckets of at
    /// most this many bytes (e.g. 25MiB, PyTorch DDP's default) before the updates.
    #[arg(long, value_parser = kiln::memory::parse_bytes)]
    data_parallel: Option<u64>,
}

impl ProgramArgs {
    /// The program and its options, unchecked: building it checks them against the model.
    fn program(&self) -> (ProgramKind, ProgramOptions) {
        let options = ProgramOptions {
            batch: self.batch,
            seq: self.seq,
            max_seq: self.max_seq,
            precision: self.precision.into(),
            fusion: self.fusion == Switch::On,
            clip_grad_norm: self.clip_grad_norm,
            tensor_parallel: self.tensor_parallel,
            data_parallel: (self.data_parallel)
                .map(|bucket_bytes| kiln_frontend::programs::DataParallel { bucket_bytes }),
            ..ProgramOptions::default()
        };
        (self.program.into(), options)
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Numerics {
    /// f32 weights, activations and GEMMs.
    F32,
    /// Mixed precision: bf16 GEMM inputs, f32 accumulation and master weights.
    Bf16Gemm,
    /// Mixed precision with the MLP's gate and up products kept in bf16 (as autocast keeps them).
    Bf16Swiglu,
    /// Inference: bf16 weights and KV caches, f32 activations and accumulation.
    Bf16,
}

impl From<Numerics> for Precision {
    fn from(numerics: Numerics) -> Self {
        match numerics {
            Numerics::F32 => Precision::F32,
            Numerics::Bf16Gemm => Precision::Bf16Gemm,
            Numerics::Bf16Swiglu => Precision::Bf16Swiglu,
            Numerics::Bf16 => Precision::Bf16,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
    Csv,
    Svg,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Oracle,
    Interpret,
    Planned,
    Graph,
}

#[derive(Subcommand)]
enum CacheAction {
    /// Where the cache is, its entries and their bytes.
    Info,
    /// Remove every entry (nothing else in the directory).
    Clear,
    /// Compile every kernel module for an architecture into the cache, no GPU needed (NVRTC
    /// for sm_NN, hipRTC for gfxNNN), so that the first start on such a device loads them
    /// instead of compiling. Entries are keyed by the compiler's version too: fill with the
    /// version the GPU machine has.
    Fill {
        /// The device architecture: sm_90 (H100, H200), sm_80 (A100), gfx90a (MI200), ...
        #[arg(long, default_value = "sm_90")]
        arch: String,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum EvalDeviceArg {
    Cpu,
    Cuda,
    /// AMD GPUs, where kiln is built with the `hip` feature (`kiln eval` only, so far).
    Hip,
}

impl EvalDeviceArg {
    /// Whether the device is CUDA's (else the CPU); `hip` is refused, as only `kiln eval`
    /// runs there.
    fn cuda(self) -> anyhow::Result<bool> {
        match self {
            EvalDeviceArg::Cpu => Ok(false),
            EvalDeviceArg::Cuda => Ok(true),
            EvalDeviceArg::Hip => {
                anyhow::bail!("--device hip: only `kiln eval` runs on HIP so far; use cpu or cuda")
            }
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PlanBy {
    Source,
    Launches,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum PlanBackend {
    Any,
    Cpu,
    Cuda,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BenchDevice {
    Cuda,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum BenchMode {
    Eager,
    Graph,
}

impl From<BenchMode> for kiln_runtime::RunMode {
    fn from(mode: BenchMode) -> Self {
        match mode {
            BenchMode::Eager => kiln_runtime::RunMode::Eager,
            BenchMode::Graph => kiln_runtime::RunMode::Graph,
        }
    }
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Program {
    Prefill,
    Decode,
    Train,
}

impl From<Program> for ProgramKind {
    fn from(program: Program) -> Self {
        match program {
            Program::Prefill => ProgramKind::Prefill,
            Program::Decode => ProgramKind::Decode,
            Program::Train => ProgramKind::Train,
        }
    }
}

fn main() -> Result<()> {
    kiln::started();
    let cli = Cli::parse();
    if let Some(rank) = kiln::launch::Rank::from_env()? {
        // Only these run as ranks of a world; anything else would run N times over.
        if !matches!(
            cli.command,
            Command::Train(_) | Command::Bench(_) | Command::Generate(_) | Command::Serve(_)
        ) {
            anyhow::bail!(
                "rank {} of {}: under `kiln launch` kiln runs `train` (data-parallel), \
                 `generate` and `serve` (tensor-parallel) and `bench` (a rank's program)",
                rank.rank,
                rank.world_size
            );
        }
    }
    if let Command::Serve(args) = cli.command {
        // The server handles SIGINT and SIGTERM itself (it drains), and writes no files.
        return commands::serve(args.into_args()?);
    }
    if let Command::Launch {
        nproc,
        rendezvous_timeout,
        command,
    } = cli.command
    {
        // The launcher passes SIGINT and SIGTERM on to its ranks itself.
        return kiln::launch::launch(&kiln::launch::LaunchOptions {
            nproc,
            rendezvous_timeout: std::time::Duration::from_secs(rendezvous_timeout),
            grace: std::time::Duration::from_secs(30),
            command,
        });
    }
    if let Command::Train(args) = cli.command {
        let stop = kiln::signals::install_graceful()?;
        return commands::train(args.into_args()?, stop);
    }
    kiln::signals::install()?;
    match cli.command {
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
            device,
            precision,
            trace,
        } => {
            let trace = commands::Trace::parse(&trace)?;
            let mode = match mode {
                Mode::Oracle => commands::EvalMode::Oracle,
                Mode::Interpret => commands::EvalMode::Interpret,
                Mode::Planned => commands::EvalMode::Planned,
                Mode::Graph => commands::EvalMode::Graph,
            };
            let device = match device {
                EvalDeviceArg::Cpu => commands::EvalDevice::Cpu,
                EvalDeviceArg::Cuda => commands::EvalDevice::Cuda,
                EvalDeviceArg::Hip => commands::EvalDevice::Hip,
            };
            let engine = commands::EvalEngine {
                mode,
                device,
                precision: precision.into(),
            };
            commands::eval(&model, seed, &tokens, (&out, &trace), grads, engine)?
        }
        Command::Generate(args) => commands::generate(args.into_args()?)?,
        Command::Serve(_) => unreachable!("served above"),
        Command::Train(_) => unreachable!("trained above"),
        Command::Launch { .. } => unreachable!("launched above"),
        Command::Tokenize(args) => args.run()?,
        Command::Cache { action } => {
            let cache = kiln_runtime::kernel_cache::KernelCache::from_env();
            let Some(dir) = cache.dir().map(|d| d.display().to_string()) else {
                anyhow::bail!("no cache directory: set KILN_CACHE_DIR, XDG_CACHE_HOME or HOME");
            };
            match action {
                CacheAction::Info => {
                    let info = cache.info()?;
                    println!(
                        "kernel cache {dir}: {} entries, {} bytes",
                        info.entries, info.bytes
                    );
                }
                CacheAction::Clear => {
                    println!("kernel cache {dir}: removed {} entries", cache.clear()?);
                }
                CacheAction::Fill { arch } => {
                    let filled = commands::fill_cache(&cache, &arch)
                        .with_context(|| format!("kernel cache {dir}"))?;
                    println!("kernel cache {dir}: {filled}");
                }
            }
        }
        Command::Compile { program, print_ir } => {
            let (kind, options) = program.program();
            print!(
                "{}",
                commands::compile(&program.model, kind, &options, print_ir)?
            );
        }
        Command::Bench(args) => args.run()?,
        Command::PlannerReport { streams, repeats } => {
            print!("{}", commands::planner_report(streams, repeats)?);
        }
        Command::Plan {
            program,
            streams,
            format,
            out,
            verify,
            backend,
            memory_budget,
            by,
        } => {
            let (kind, options) = program.program();
            let workspaces = match backend {
                PlanBackend::Any => kiln_runtime::Workspaces::Any,
                PlanBackend::Cpu => kiln_runtime::Workspaces::Cpu,
                PlanBackend::Cuda => kiln_runtime::Workspaces::Cuda,
            };
            let format = match format {
                Format::Text => commands::PlanFormat::Text,
                Format::Json => commands::PlanFormat::Json,
                Format::Csv => commands::PlanFormat::Csv,
                Format::Svg => commands::PlanFormat::Svg,
            };
            let view = match by {
                None => commands::PlanView::Plan,
                Some(PlanBy::Source) => commands::PlanView::BySource,
                Some(PlanBy::Launches) => commands::PlanView::Launches,
            };
            let plan_options = kiln_planner::PlanOptions {
                streams,
                ..kiln_planner::PlanOptions::default()
            };
            if let Some(text) = commands::plan(
                &program.model,
                kind,
                &options,
                (&plan_options, workspaces, memory_budget),
                (view, format),
                out.as_deref(),
                verify,
            )? {
                print!("{text}");
            }
        }
    }
    Ok(())
}
