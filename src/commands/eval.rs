//! `kiln eval`: the output contract scripts and tests rely on.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use kiln_frontend::eval::{evaluate_program_traced, evaluate_traced, traceable_values, Engine};
use kiln_frontend::hf::safetensors_io::{check_absent, write_safetensors, SafetensorsFile};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::Precision;
use kiln_frontend::value_trace::TracePatterns;
use kiln_ir::DType;
use kiln_runtime::{Backend, RunMode, Tensor};
use safetensors::Dtype;

/// Which engine computes the evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalMode {
    /// The eager oracle with tape autograd.
    Oracle,
    /// The traced `eval` program on the reference interpreter (IR autodiff for gradients).
    Interpret,
    /// The eval program planned and run eagerly on the device (every launch issued).
    Planned,
    /// The eval program planned, captured once and replayed on the device.
    Graph,
}

/// Where `planned` and `graph` run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalDevice {
    Cpu,
    Cuda,
    Hip,
}

/// How to run the evaluation.
#[derive(Clone, Copy, Debug)]
pub struct EvalEngine {
    pub mode: EvalMode,
    pub device: EvalDevice,
    pub precision: Precision,
}

/// What `--trace` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trace {
    /// Write the values these patterns select as `trace.<name>` (none when empty).
    Values(TracePatterns),
    /// Print the names there are, compute nothing.
    List,
}

impl Trace {
    /// `--trace` as given (each flag a pattern or a comma list; `list` alone lists).
    pub fn parse(flags: &[String]) -> Result<Trace> {
        if flags.len() == 1 && flags[0].trim() == "list" {
            return Ok(Trace::List);
        }
        Ok(Trace::Values(TracePatterns::parse(flags)?))
    }
}

/// Evaluates `model` on the `tokens` tensor of `tokens_path` and writes `logits`, `loss`,
/// with `grads` `grad.<name>`, and the values `trace` selects as `trace.<name>` to `out`
/// (which must not exist).
pub fn eval(
    model: &str,
    seed: u64,
    tokens_path: &Path,
    (out, trace): (&Path, &Trace),
    grads: bool,
    engine: EvalEngine,
) -> Result<()> {
    let EvalEngine {
        mode,
        device,
        precision,
    } = engine;
    if device != EvalDevice::Cpu && matches!(mode, EvalMode::Oracle | EvalMode::Interpret) {
        bail!("--device cuda and hip run the planned program: use --mode planned or --mode graph");
    }
    let source = ModelSource::resolve(model)?;
    let patterns = match trace {
        Trace::List => return list_traceable(&source, model, tokens_path, precision),
        Trace::Values(patterns) => patterns,
    };
    // Checked again when the file is published: this only answers before the work.
    check_absent(out).map_err(|e| anyhow!("{e} (choose another --out)"))?;
    let tokens = read_tokens(tokens_path)?;
    let (config, loaded) = source
        .load(seed, precision.weight_dtype())
        .with_context(|| format!("loading model {model}"))?;
    if let Some(note) = loaded.note() {
        eprintln!("note: {model}: {note}");
    }
    if let Some(warning) = loaded.warning() {
        eprintln!("warning: {model}: {warning}");
    }
    let weights = loaded.weights;
    let backend = match device {
        EvalDevice::Cpu => Backend::Cpu,
        EvalDevice::Cuda => Backend::cuda().context("--device cuda")?,
        EvalDevice::Hip => Backend::hip().context("--device hip")?,
    };
    let planned = |mode| Engine::Planned {
        backend: &backend,
        mode,
    };
    let how = (grads, precision);
    let program =
        |engine| evaluate_program_traced(&config, &weights, &tokens, how, engine, patterns);
    let result = match mode {
        EvalMode::Oracle => evaluate_traced(&config, &weights, &tokens, how, patterns)?,
        EvalMode::Interpret => program(Engine::Interpret)?,
        EvalMode::Planned => program(planned(RunMode::Eager))?,
        EvalMode::Graph => program(planned(RunMode::Graph))?,
    };
    let loss = result.loss.to_f64_vec()?[0];
    let tensors = result.named();
    write_safetensors(out, &tensors, None)?;
    // The causal-LM loss averages over the targets: every token but each row's first.
    let (rows, columns) = match tokens.dims() {
        [rows, columns] => (*rows, *columns),
        _ => (1, tokens.numel()),
    };
    let predicted = columns.saturating_sub(1);
    println!(
        "loss {loss:.6} over {} predicted tokens ({rows} rows × {predicted}: all but each row's \
         first); wrote {} tensors to {}",
        rows * predicted,
        tensors.len(),
        out.display()
    );
    Ok(())
}

/// Prints every value `--trace` can pick (name and type for these tokens), one per line.
fn list_traceable(
    source: &ModelSource,
    model: &str,
    tokens_path: &Path,
    precision: Precision,
) -> Result<()> {
    let tokens = read_tokens(tokens_path)?;
    let (config, _) = source
        .config()
        .with_context(|| format!("reading model {model}"))?;
    for (name, ty) in traceable_values(&config, &tokens, precision)? {
        println!("{name}  {ty}");
    }
    Ok(())
}

/// The `tokens` tensor of `path`: integer token ids, I32 or I64, read as i64.
fn read_tokens(path: &Path) -> Result<Tensor> {
    let file = SafetensorsFile::open(path)?;
    let Some((dtype, _)) = file.info("tokens") else {
        bail!(
            "{} has no tensor `tokens` (it holds: {})",
            path.display(),
            file.names().join(", ")
        );
    };
    if !matches!(dtype, Dtype::I32 | Dtype::I64) {
        bail!(
            "{}: tensor `tokens` has dtype {dtype}; expected integer token ids, I32 or I64",
            path.display()
        );
    }
    Ok(file.tensor("tokens", DType::I64)?)
}
