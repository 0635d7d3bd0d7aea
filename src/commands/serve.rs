//! `kiln serve`: a model behind the OpenAI-compatible HTTP server of `kiln-server`, on one
//! continuous batching engine of `--slots` sequences of `--max-seq` positions.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kiln_engine::engine::{Engine, EngineOptions};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::Precision;
use kiln_runtime::{Backend, RunMode};
use kiln_server::ServeOptions;

use super::generate::text_side;

/// What to serve and how.
pub struct HttpArgs {
    pub model: String,
    /// The id clients name (default: the preset, or the directory's last component).
    pub served_model_name: Option<String>,
    pub seed: u64,
    pub host: String,
    pub port: u16,
    pub slots: usize,
    /// Positions of a slot (default: the model's, at most 2048).
    pub max_seq: Option<usize>,
    pub max_waiting: usize,
    pub drain: Duration,
    pub cuda: bool,
    pub mode: RunMode,
    pub precision: Precision,
}

/// Positions of a slot when `--max-seq` is not given, at most.
const DEFAULT_MAX_SEQ: usize = 2048;

/// Serves `args`. Under `kiln launch` each rank runs its tensor-parallel shard of the engine on
/// its own GPU: rank 0 serves HTTP and leads, the other ranks follow its scheduler
/// (`kiln_server::lockstep`) until it stops.
pub fn serve(args: HttpArgs) -> Result<()> {
    let launched = crate::launch::Rank::from_env()?;
    if let Some(rank) = &launched {
        if !args.cuda {
            bail!(
                "rank {} of {}: `kiln launch` runs one rank per GPU; pass --device cuda",
                rank.rank,
                rank.world_size
            );
        }
        crate::launch::nccl_built(Some(rank))?;
    }
    let source = ModelSource::resolve(&args.model)?;
    let (config, _) = source.config()?;
    let positions = config.max_position_embeddings;
    let max_seq = args.max_seq.unwrap_or(positions.min(DEFAULT_MAX_SEQ));
    if max_seq == 0 || max_seq > positions {
        bail!("--max-seq {max_seq}: the model takes 1 to {positions} positions (max_position_embeddings)");
    }
    if args.slots == 0 {
        bail!("--slots must be at least 1");
    }
    let (tokenizer, eos) = text_side(&source)?;
    let model = args
        .served_model_name
        .clone()
        .unwrap_or_else(|| match &source {
            ModelSource::Preset(name) => name.clone(),
            ModelSource::Dir(dir) => served_name(dir),
        });
    let options = EngineOptions {
        tensor_parallel: launched.as_ref().map(|r| (r.rank, r.world_size)),
        ..EngineOptions::new(args.slots, max_seq, args.precision, args.mode)
    };
    // A launched rank's GPU, joined to the group's communicator first.
    let group = launched
        .as_ref()
        .map(crate::launch::Rank::join)
        .transpose()?;
    let (seed, label, cuda) = (args.seed, args.model.clone(), args.cuda);
    let joined = group.clone();
    let build = Box::new(move || -> Result<Engine> {
        // The device opens (and loads its kernels) while the weights are read.
        let opening = (cuda && joined.is_none())
            .then(|| kiln_runtime::cuda::CudaDevice::open_in_background(0));
        // A rank reads only its part of each split projection.
        let dtype = options.precision.weight_dtype();
        let (config, loaded) = (source.load_shard(seed, dtype, options.tensor_parallel))
            .with_context(|| format!("loading model {label}"))?;
        let backend = match (opening, &joined) {
            (_, Some((device, _))) => Backend::Cuda(device.clone()),
            (Some(opening), None) => Backend::Cuda(opening.wait()?),
            (None, None) => Backend::Cpu,
        };
        if let Some(warning) = loaded.warning() {
            eprintln!("warning: {label}: {warning}");
        }
        eprintln!(
            "kiln serve: compiling {} prefill and {} decode programs on {}",
            options.prefill_lengths.len() * options.prefill_batches.len(),
            options.decode_batches.len(),
            match cuda {
                true => "the GPU",
                false => "the CPU",
            }
        );
        let mut engine = Engine::new((&config, &loaded.weights), &backend, options)?;
        if let Some((_, communicator)) = &joined {
            engine.join(communicator)?;
        }
        Ok(engine)
    });
    if let (Some(rank), Some((_, communicator))) = (&launched, &group) {
        if rank.rank != 0 {
            return follow(build, tokenizer, communicator.as_ref());
        }
    }
    kiln_server::serve(
        ServeOptions {
            host: args.host,
            port: args.port,
            model,
            tokenizer,
            eos,
            max_waiting: args.max_waiting,
            drain: args.drain,
            group: group.map(|(_, communicator)| communicator),
        },
        build,
    )
}

/// A rank other than 0 of a tensor-parallel server: its engine follows rank 0's scheduler
/// until rank 0 stops. Signals are left to rank 0 (the launcher passes them on to every rank),
/// which drains and then stops the followers.
fn follow(
    build: kiln_server::EngineBuilder,
    tokenizer: Option<kiln_engine::tokenizer::Tokenizer>,
    communicator: &dyn kiln_runtime::collective::Communicator,
) -> Result<()> {
    let ignored = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, ignored.clone())?;
    }
    let engine = build()?;
    let mut scheduler = kiln_engine::scheduler::continuous::ContinuousBatchScheduler::new(
        engine,
        tokenizer.as_ref(),
    );
    kiln_server::lockstep::follow(&mut scheduler, communicator)?;
    Ok(())
}

/// A directory's last component (`models/qwen-0.5b` → `qwen-0.5b`; `.` → the current
/// directory's name).
fn served_name(dir: &Path) -> String {
    let absolute = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    match absolute.file_name() {
        Some(name) => name.to_string_lossy().into_owned(),
        None => dir.display().to_string(),
    }
}
