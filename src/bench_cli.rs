//! `kiln bench`: its flags and the choice between one program's step timings and the serve
//! workload.

use anyhow::Result;
use clap::ValueEnum;
use kiln::commands;
use kiln_frontend::programs::{ProgramKind, ProgramOptions};

use crate::{BenchDevice, BenchMode, Numerics, Switch};

/// What `kiln bench` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchProgram {
    Prefill,
    Decode,
    Train,
    /// A workload of requests through the reference, continuous and (with --buckets)
    /// length-bucketed schedulers.
    Serve,
}

#[derive(clap::Args)]
pub struct BenchCli {
    /// A Hugging Face model directory or a preset name.
    #[arg(long)]
    model: String,
    #[arg(long, value_enum)]
    program: BenchProgram,
    /// Sequences in the batch.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Tokens per sequence (prefill, train); serve: the longest prompt (prompts of --seq / 2
    /// to --seq tokens).
    #[arg(long, default_value_t = 512)]
    seq: usize,
    /// Decode: tokens already in the KV cache (the position decoded).
    #[arg(long, default_value_t = 512)]
    context: usize,
    /// Rows of the KV cache (default: prefill --seq; decode 1024, or the model's positions
    /// when fewer).
    #[arg(long)]
    max_seq: Option<usize>,
    /// f32; bf16-gemm: bf16 GEMM inputs (mixed precision); bf16-swiglu: bf16-gemm with the
    /// MLP's gate and up products in bf16; bf16: bf16 weights and caches (inference).
    #[arg(long, value_enum, default_value_t = Numerics::F32)]
    precision: Numerics,
    #[arg(long, value_enum, default_value_t = BenchDevice::Cuda)]
    device: BenchDevice,
    /// eager: every launch issued each step; graph: a captured CUDA graph replayed.
    #[arg(long, value_enum, default_value_t = BenchMode::Graph)]
    mode: BenchMode,
    /// Streams (1 = serial). Default: 2 for a one-GPU train step (its weight gradients'
    /// GEMMs and updates overlap the rest of the backward), 1 otherwise and with --profile.
    #[arg(long)]
    streams: Option<usize>,
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    #[arg(long, default_value_t = 30)]
    steps: usize,
    /// Fused linears of at most this many rows run the skinny kernel, larger ones
    /// cuBLASLt (0: all on cuBLASLt; default 32, the most it takes). Past 16 rows a linear
    /// whose SwiGLU or norm output feeds the next GEMM writes it rounded, on cuBLASLt.
    #[arg(long)]
    linear_rows: Option<u64>,
    /// The fusion pass: on, or off for the unfused reference program.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    fusion: Switch,
    /// Programmatic dependent launch (sm_90 and later): on, or off for plain stream order.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pdl: Switch,
    /// Split skinny linears finished inside thread block clusters (sm_90 and later): on, or
    /// off for a reduce launch each.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    clusters: Switch,
    /// The HIP backend's code on this device: kiln's tiled GEMM instead of cuBLASLt, the
    /// portable tensor-core modules, no clusters (on), or the CUDA defaults (off).
    #[arg(long, value_enum, default_value_t = Switch::Off)]
    portable: Switch,
    /// Each cuBLASLt GEMM on the fastest of the library's candidate algorithms, timed when
    /// the program is bound (on), or on its heuristic's first choice (off). No effect with
    /// `--portable on`, which has no cuBLASLt.
    #[arg(long, value_enum, default_value_t = Switch::On)]
    gemm_tune: Switch,
    /// Beside each cached attention's split of at least 8 rows, a launch on a side stream
    /// prefetches into L2 up to this many bytes (e.g. 32MiB) of the weights of the linears
    /// after it (default 32MiB; 0: none).
    #[arg(long, value_parser = kiln::memory::parse_bytes)]
    l2_prefetch: Option<u64>,
    /// The prefetching launch waits for the step this many steps before the split's (default
    /// 1: after the RoPE and cache write).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    l2_prefetch_lead: Option<u16>,
    /// Splits of fewer rows fork no prefetch (default 8).
    #[arg(long)]
    l2_prefetch_min_rows: Option<u64>,
    /// Also time each step alone once and list the costliest ops (a plan of one stream, the
    /// default with it; the L2 prefetches are timed as steps of their own).
    #[arg(long)]
    profile: bool,
    /// Also run once eagerly on the program's streams with an event after every step: where the
    /// run ends, each stream's busy time, how long more than one stream is busy and how long
    /// none is, how long stream 0 waits for the others, the ops of the last 5% (--json lists
    /// every step).
    #[arg(long)]
    timeline: bool,
    /// Train: the most arena bytes the plan may take (e.g. 3.3GiB); values the backward
    /// reads are recomputed there, the cheapest per byte first, until it fits.
    #[arg(long, value_parser = kiln::memory::parse_bytes)]
    memory_budget: Option<u64>,
    /// Train: one data-parallel rank's step, its gradients all-reduced over NCCL in buckets
    /// of at most this many bytes (e.g. 25MiB); under `kiln launch --nproc N`, over N GPUs,
    /// else a world of one (a build with --features nccl).
    #[arg(long, value_parser = kiln::memory::parse_bytes)]
    data_parallel: Option<u64>,
    /// Prefill, decode: one rank of this many tensor-parallel ranks, under `kiln launch
    /// --nproc N` (1: a world of one on this GPU, through NCCL).
    #[arg(long)]
    tensor_parallel: Option<usize>,
    /// Seed for a preset's random weights and the tokens.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
    /// Serve: requests in the workload.
    #[arg(long, default_value_t = 32)]
    requests: usize,
    /// Serve: tokens each request generates.
    #[arg(long, default_value_t = 64)]
    new_tokens: usize,
    /// Serve: a request arrives every this many scheduler steps (0: all at once).
    #[arg(long, default_value_t = 0)]
    arrival_every: usize,
    /// Serve: sequences the continuous scheduler runs at once (its KV pool's slots).
    #[arg(long, default_value_t = 32)]
    slots: usize,
    /// Serve: also through the length-bucketed scheduler over these pools, SLOTSxPOSITIONS
    /// each (e.g. 24x128,8x256).
    #[arg(long, value_delimiter = ',', value_parser = crate::generate_cli::parse_bucket)]
    buckets: Vec<(usize, usize)>,
}

impl BenchCli {
    /// Runs the benchmark and prints its table, or its JSON with `--json`.
    pub fn run(self) -> Result<()> {
        let BenchCli {
            model,
            program,
            batch,
            seq,
            context,
            max_seq,
            precision,
            device: BenchDevice::Cuda,
            mode,
            streams,
            warmup,
            steps,
            linear_rows,
            fusion,
            pdl,
            clusters,
            portable,
            gemm_tune,
            l2_prefetch,
            l2_prefetch_lead,
            l2_prefetch_min_rows,
            profile,
            timeline,
            memory_budget,
            data_parallel,
            tensor_parallel,
            seed,
            json,
            requests,
            new_tokens,
            arrival_every,
            slots,
            buckets,
        } = self;
        let kind = match program {
            BenchProgram::Prefill => ProgramKind::Prefill,
            BenchProgram::Decode => ProgramKind::Decode,
            BenchProgram::Train => ProgramKind::Train,
            BenchProgram::Serve => {
                if let Some(rank) = kiln::launch::Rank::from_env()? {
                    anyhow::bail!(
                        "rank {} of {}: the serve workload runs on one GPU, not under `kiln \
                         launch`",
                        rank.rank,
                        rank.world_size
                    );
                }
                let args = commands::ServeArgs {
                    model,
                    seed,
                    requests,
                    prompt_len: seq,
                    new_tokens,
                    arrival_every,
                    slots,
                    buckets,
                    precision: precision.into(),
                    mode: mode.into(),
                    backend: cuda()?,
                };
                let result = commands::bench_serve(&args)?;
                match json {
                    true => println!("{}", serde_json::to_string(&result)?),
                    false => print!("{}", commands::serve_table(&result)),
                }
                return Ok(());
            }
        };
        let one_gpu_train =
            kind == ProgramKind::Train && data_parallel.is_none() && tensor_parallel.is_none();
        let streams = streams.unwrap_or(if one_gpu_train && !profile { 2 } else { 1 });
        if profile && streams > 1 {
            anyhow::bail!(
                "--profile times each step alone on one stream: pass --streams 1, or leave \
                 --streams out (it is then 1)"
            );
        }
        let args = commands::BenchArgs {
            model,
            seed,
            kind,
            options: ProgramOptions {
                batch,
                seq,
                max_seq,
                precision: precision.into(),
                fusion: fusion == Switch::On,
                data_parallel: data_parallel
                    .map(|bucket_bytes| kiln_frontend::programs::DataParallel { bucket_bytes }),
                tensor_parallel,
                ..ProgramOptions::default()
            },
            context,
            mode: mode.into(),
            streams,
            warmup,
            steps,
            linear_rows,
            pdl: pdl == Switch::On,
            clusters: clusters == Switch::On,
            portable: portable == Switch::On,
            gemm_tune: gemm_tune == Switch::On,
            l2_prefetch,
            l2_prefetch_lead: l2_prefetch_lead.map(usize::from),
            l2_prefetch_min_rows,
            profile,
            timeline,
            memory_budget,
        };
        let result = commands::bench(&args)?;
        if result.rank != 0 {
            return Ok(()); // rank 0 reports for a launch
        }
        match json {
            true => println!("{}", serde_json::to_string(&result)?),
            false => print!("{}", commands::bench_table(&result)),
        }
        Ok(())
    }
}

/// The CUDA device, or why none can be used.
fn cuda() -> Result<kiln_runtime::Backend> {
    if let Some(reason) = kiln_runtime::cuda::unavailable() {
        anyhow::bail!("--device cuda: no CUDA device can be used here: {reason}");
    }
    Ok(kiln_runtime::Backend::cuda()?)
}
