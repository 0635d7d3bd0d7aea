//! `kiln demo`: kiln's main job on an embedded default model.
//!
//! It runs the tiny preset through the eager oracle, forward and backward (loss and every
//! parameter's gradient norm), then compiles the prefill, decode and train programs, plans each
//! into one arena, runs the plans on the planned CPU executor (dead arena bytes poisoned) and
//! checks every result against the oracle, saying so — or failing. Where a CUDA device can be
//! used, each program also runs there, eagerly and as a replayed CUDA graph, checked against the
//! CPU; the report says which device ran.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use kiln_frontend::eval::CausalLmInputs;
use kiln_frontend::model::{causal_lm_loss, forward, random_weights, Eager, ModelConfig};
use kiln_frontend::model::{last_logits, ModelWeights};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::DType;
use kiln_planner::PlanOptions;
use kiln_runtime::cuda::CudaDevice;
use kiln_runtime::Device;
use kiln_runtime::Tensor;
use kiln_runtime::{Backend, RunMode};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What the demo measured.
pub struct DemoReport {
    pub loss: f64,
    /// `(parameter name, L2 norm of its gradient)`, in Hugging Face order.
    pub grad_norms: Vec<(String, f64)>,
    pub text: String,
}

fn l2(values: &[f64]) -> f64 {
    values.iter().map(|v| v * v).sum::<f64>().sqrt()
}

/// Refuses `batch × seq` tokens the demo cannot run, before anything is allocated: options
/// every program refuses, and a train program (the demo's largest) that the eager oracle,
/// which keeps every value, could not hold in this machine's memory.
fn check(config: &ModelConfig, batch: usize, seq: usize) -> Result<()> {
    // Decode runs on the last token after a prefill of the rest.
    anyhow::ensure!(
        seq >= 2,
        "--seq {seq}: the demo needs --seq >= 2 (a prompt and a token decoded after it)"
    );
    let train = ProgramOptions {
        batch,
        seq,
        ..ProgramOptions::default()
    };
    let graph = build(ProgramKind::Train, config, &train)?;
    if let Some(memory) = crate::memory::host_memory() {
        let what = format!("--batch {batch} with --seq {seq}: the demo's eager run");
        let need = crate::memory::graph_bytes(&graph);
        crate::memory::ensure_fits(&what, need, memory, "this machine's memory")?;
    }
    Ok(())
}

/// Runs the tiny model on `batch × seq` random tokens drawn from `seed`.
pub fn run(seed: u64, batch: usize, seq: usize) -> Result<DemoReport> {
    let config = ModelConfig::tiny();
    check(&config, batch, seq)?;
    let weights = random_weights(&config, seed).context("building random weights")?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6b69_6c6e);
    let tokens: Vec<i64> = (0..batch * seq)
        .map(|_| rng.random_range(0..config.vocab_size as i64))
        .collect();
    let token_ids = Tensor::from_vec(tokens, [batch, seq])?;
    let inputs = CausalLmInputs::new(&token_ids, config.vocab_size)?;
    let [tokens, positions, targets] = inputs.named().map(|(_, t)| Var::constant(t.clone()));
    let logits = forward(&Eager::F32, &config, &weights, &tokens, &positions).context("forward")?;
    let loss = causal_lm_loss(&Eager::F32, &logits, &targets).context("loss")?;
    loss.backward().context("backward")?;
    let loss_value = loss.value().to_f64_vec()?[0];

    let mut grad_norms = Vec::new();
    for (name, param) in weights.named() {
        let grad = param
            .grad()
            .with_context(|| format!("{name} received no gradient"))?;
        grad_norms.push((name, l2(&grad.to_f64_vec()?)));
    }
    let total = l2(&grad_norms.iter().map(|(_, n)| *n).collect::<Vec<_>>());

    let mut text = String::new();
    let params: usize = weights.named().iter().map(|(_, p)| p.value().numel()).sum();
    writeln!(
        text,
        "kiln demo: tiny {:?} model ({} layers, hidden {}, heads {}/{} (GQA), vocab {}, {} parameters)",
        config.family,
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.vocab_size,
        params
    )?;
    writeln!(
        text,
        "engine: eager oracle (CPU reference kernels, tape autograd), f32"
    )?;
    writeln!(text, "batch {batch} x seq {seq}, seed {seed}")?;
    writeln!(
        text,
        "loss {loss_value:.6}  (ln vocab = {:.6}: a random model sits near it)",
        (config.vocab_size as f64).ln()
    )?;
    writeln!(text, "gradient norms:")?;
    for (name, norm) in &grad_norms {
        writeln!(text, "  {name:<48} {norm:>12.6e}")?;
    }
    writeln!(text, "  {:<48} {total:>12.6e}", "total")?;
    let gpu = match kiln_runtime::cuda::unavailable() {
        None => {
            let device = CudaDevice::open(0).context("opening the CUDA device")?;
            writeln!(
                text,
                "device: {} — the compiled programs also run there",
                device.describe()
            )?;
            Some(device)
        }
        Some(reason) => {
            writeln!(text, "device: CPU only (no CUDA device: {reason})")?;
            None
        }
    };
    compiled_programs(
        &mut text,
        &config,
        &weights,
        &token_ids,
        loss_value,
        gpu.as_ref(),
    )?;
    Ok(DemoReport {
        loss: loss_value,
        grad_norms,
        text,
    })
}

/// Compiles, plans and runs prefill (on all but the last token), one decode step (the last
/// token) and one train step on the planned executor, checking each against the oracle.
fn compiled_programs(
    text: &mut String,
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    tokens: &Tensor,
    oracle_loss: f64,
    gpu: Option<&Arc<CudaDevice>>,
) -> Result<()> {
    let (batch, seq) = (tokens.dims()[0], tokens.dims()[1]);
    let ids = tokens.to_vec::<i64>()?;
    let row = |b: usize, range: std::ops::Range<usize>| {
        ids[b * seq + range.start..b * seq + range.end].to_vec()
    };
    let prompt = seq - 1;
    let params: BTreeMap<String, Tensor> = weights
        .named()
        .into_iter()
        .map(|(name, v)| (name, v.value().clone()))
        .collect();
    let mut values = params.clone();
    writeln!(
        text,
        "compiled programs (traced, planned into one arena, run by the planned CPU executor with dead bytes poisoned):"
    )?;

    // Prefill the prompt: last-position logits must equal the oracle's bit for bit.
    let options = ProgramOptions {
        batch,
        seq: prompt,
        max_seq: Some(seq),
        ..ProgramOptions::default()
    };
    let prompt_ids: Vec<i64> = (0..batch).flat_map(|b| row(b, 0..prompt)).collect();
    let prompt_tokens = Tensor::from_vec(prompt_ids, [batch, prompt])?;
    let prompt_inputs = CausalLmInputs::new(&prompt_tokens, config.vocab_size)?;
    values.insert("tokens".into(), prompt_inputs.tokens.clone());
    values.insert("positions".into(), prompt_inputs.positions.clone());
    values.insert(
        "cache_positions".into(),
        Tensor::from_vec(vec![0i64; batch], [batch])?,
    );
    for layer in 0..config.num_hidden_layers {
        for kv in ["k", "v"] {
            let dims = [batch, config.num_key_value_heads, seq, config.head_dim];
            values.insert(
                format!("cache.{kv}.{layer}"),
                Tensor::zeros(dims, DType::F32, Device::Cpu),
            );
        }
    }
    let logits = run_planned(
        text,
        config,
        ProgramKind::Prefill,
        &options,
        &mut values,
        gpu,
    )?["logits"]
        .clone();
    let eager = last_logits(
        &Eager::F32,
        config,
        weights,
        &Var::constant(prompt_inputs.tokens.clone()),
        &Var::constant(prompt_inputs.positions.clone()),
    )?;
    anyhow::ensure!(
        same_bits(&logits, eager.value())?,
        "prefill logits differ from the oracle"
    );
    writeln!(
        text,
        "    last-position logits: bit-identical to the oracle"
    )?;

    // Decode the last token from the caches prefill filled: compare with the full forward.
    let last: Vec<i64> = (0..batch).map(|b| ids[b * seq + prompt]).collect();
    values.insert("tokens".into(), Tensor::from_vec(last, [batch, 1])?);
    values.insert(
        "positions".into(),
        Tensor::from_vec(vec![prompt as i64; batch], [batch])?,
    );
    let logits = run_planned(
        text,
        config,
        ProgramKind::Decode,
        &options,
        &mut values,
        gpu,
    )?["logits"]
        .to_f64_vec()?;
    let inputs = CausalLmInputs::new(tokens, config.vocab_size)?;
    let full = forward(
        &Eager::F32,
        config,
        weights,
        &Var::constant(inputs.tokens.clone()),
        &Var::constant(inputs.positions.clone()),
    )?
    .value()
    .to_f64_vec()?;
    let vocab = config.vocab_size;
    let mut worst = 0f64;
    for b in 0..batch {
        let at = (b * seq + prompt) * vocab;
        let want = &full[at..at + vocab];
        let got = &logits[b * vocab..(b + 1) * vocab];
        let diff: f64 = got.iter().zip(want).map(|(g, w)| (g - w).powi(2)).sum();
        let norm: f64 = want.iter().map(|w| w * w).sum();
        worst = worst.max((diff / norm).sqrt());
    }
    anyhow::ensure!(
        worst <= 1e-5,
        "decode logits differ from the full forward by {worst:e}"
    );
    writeln!(
        text,
        "    logits at position {prompt}: match the oracle's full forward (relative error {worst:.1e}; \
         decode multiplies {batch} rows where the full forward multiplies {}, so not bitwise)",
        batch * seq
    )?;

    // One train step: the loss equals the oracle's bit for bit; AdamW updates every parameter.
    let options = ProgramOptions {
        batch,
        seq,
        ..ProgramOptions::default()
    };
    let mut values = params.clone();
    for (name, tensor) in inputs.named() {
        values.insert(name.into(), tensor.clone());
    }
    values.insert("loss_seed".into(), Tensor::scalar(1.0, DType::F32));
    values.insert(
        "step".into(),
        Tensor::from_vec(vec![1i64], kiln_ir::Shape::scalar())?,
    );
    values.insert("lr".into(), Tensor::scalar(1e-3, DType::F64));
    for (name, tensor) in &params {
        for moment in ["m", "v"] {
            values.insert(
                format!("adamw.{moment}.{name}"),
                Tensor::zeros(tensor.shape().clone(), DType::F32, Device::Cpu),
            );
        }
    }
    let loss = run_planned(text, config, ProgramKind::Train, &options, &mut values, gpu)?["loss"]
        .to_f64_vec()?[0];
    // The oracle's loss is f32; the program's loss is f32 too, widened the same way.
    anyhow::ensure!(
        loss.to_bits() == oracle_loss.to_bits(),
        "train loss {loss} differs from the oracle's {oracle_loss}"
    );
    let updated = params
        .iter()
        .filter(|(name, t)| !same_bits(t, &values[*name]).unwrap_or(true))
        .count();
    anyhow::ensure!(
        updated == params.len(),
        "AdamW updated {updated} of {} parameters",
        params.len()
    );
    writeln!(text, "    loss {loss:.6}: bit-identical to the oracle; AdamW updated all {updated} parameters inside the graph")?;
    Ok(())
}

/// Traces, plans, verifies and runs one program; prints its plan summary.
fn run_planned(
    text: &mut String,
    config: &ModelConfig,
    kind: ProgramKind,
    options: &ProgramOptions,
    values: &mut BTreeMap<String, Tensor>,
    gpu: Option<&Arc<CudaDevice>>,
) -> Result<BTreeMap<String, Tensor>> {
    let graph = build(kind, config, options).with_context(|| format!("tracing {}", kind.name()))?;
    let planned = kiln_planner::plan(
        &graph,
        &PlanOptions::default(),
        &kiln_runtime::Workspaces::Any,
    )?;
    kiln_planner::verify_plan(&graph, &planned, &kiln_runtime::Workspaces::Any)?;
    let ops = planned.schedule.len();
    writeln!(
        text,
        "  {:<8} {ops:>4} ops, arena {} B, lower bound {} B (ratio {:.4}), {} stream(s), plan verified",
        kind.name(),
        planned.arena_bytes,
        planned.lower_bound_bytes,
        planned.arena_bytes as f64 / planned.lower_bound_bytes.max(1) as f64,
        planned.options.streams
    )?;
    let inputs = values.clone();
    let outputs = kiln_runtime::execute(&graph, &planned, values, true)?;
    if let Some(device) = gpu {
        let (worst, launches) = on_gpu(device, &graph, &planned, &inputs, &outputs, values)?;
        writeln!(
            text,
            "  {:<8} on the GPU: {launches} launches captured into a CUDA graph; replay = eager bit for bit; \
             outputs and writes within {worst:.1e} of the CPU",
            kind.name()
        )?;
    }
    Ok(outputs)
}

/// Runs `graph` on the GPU from `inputs`, eagerly and replayed; checks that both give the same
/// bits and match the CPU's `outputs` and `writes` (relative error <= 1e-5); returns the worst
/// error and the launches per run.
fn on_gpu(
    device: &Arc<CudaDevice>,
    graph: &kiln_ir::Graph,
    planned: &kiln_planner::Plan,
    inputs: &BTreeMap<String, Tensor>,
    outputs: &BTreeMap<String, Tensor>,
    writes: &BTreeMap<String, Tensor>,
) -> Result<(f64, usize)> {
    let backend = Backend::Cuda(device.clone());
    let eager = backend.run(graph, planned, inputs, RunMode::Eager, 1)?;
    let replayed = backend.run(graph, planned, inputs, RunMode::Graph, 1)?;
    let summary =
        kiln_runtime::lower_for_device(graph, planned, kiln_runtime::LowerOptions::default())?;
    let launches = summary.kernels + summary.gemms + summary.copies;
    let mut worst = 0f64;
    for (name, got) in &eager {
        anyhow::ensure!(
            same_bits(got, &replayed[name])?,
            "GPU: `{name}` of the replayed graph differs from the eager run"
        );
        let want = outputs.get(name).unwrap_or_else(|| &writes[name]);
        let (g, w) = (got.to_f64_vec()?, want.to_f64_vec()?);
        let diff: f64 = g.iter().zip(&w).map(|(a, b)| (a - b).powi(2)).sum();
        let norm: f64 = w.iter().map(|b| b * b).sum();
        let error = (diff / norm.max(f64::MIN_POSITIVE)).sqrt();
        anyhow::ensure!(
            error <= 1e-5,
            "GPU: `{name}` differs from the CPU by {error:e}"
        );
        worst = worst.max(error);
    }
    Ok((worst, launches))
}

fn same_bits(a: &Tensor, b: &Tensor) -> Result<bool> {
    let (a, b) = (a.to_f64_vec()?, b.to_f64_vec()?);
    Ok(a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()))
}
