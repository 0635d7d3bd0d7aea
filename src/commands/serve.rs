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

pub fn serve(args: HttpArgs) -> Result<()> {
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
    let options = EngineOptions::new(args.slots, max_seq, args.precision, args.mode);
    let (seed, label, cuda) = (args.seed, args.model.clone(), args.cuda);
    let build = Box::new(move || -> Result<Engine> {
        // The device opens (and loads its kernels) while the weights are read.
        let opening = cuda.then(|| kiln_runtime::cuda::CudaDevice::open_in_background(0));
        let (config, loaded) = (source.load(seed, options.precision.weight_dtype()))
            .with_context(|| format!("loading model {label}"))?;
        let backend = match opening {
            Some(opening) => Backend::Cuda(opening.wait()?),
            None => Backend::Cpu,
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
        Ok(Engine::new((&config, &loaded.weights), &backend, options)?)
    });
    kiln_server::serve(
        ServeOptions {
            host: args.host,
            port: args.port,
            model,
            tokenizer,
            eos,
            max_waiting: args.max_waiting,
            drain: args.drain,
        },
        build,
    )
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
