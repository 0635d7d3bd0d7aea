//! `kiln demo`: kiln's main job on an embedded default model.
//!
//! Today it runs the tiny preset through the eager oracle, forward and backward, and reports the
//! loss and the gradient norm of every parameter. Later it will compile, plan and replay the
//! programs and check them against this oracle.

use std::fmt::Write as _;

use anyhow::{Context, Result};
use kiln_frontend::model::{
    causal_lm_loss, forward, random_weights, shifted_targets, Eager, ModelConfig,
};
use kiln_frontend::Var;
use kiln_runtime::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

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

/// Runs the tiny model on `batch × seq` random tokens drawn from `seed`.
pub fn run(seed: u64, batch: usize, seq: usize) -> Result<DemoReport> {
    let config = ModelConfig::tiny();
    anyhow::ensure!(
        batch > 0 && seq > 1,
        "demo needs --batch >= 1 and --seq >= 2"
    );
    anyhow::ensure!(
        seq <= config.max_position_embeddings,
        "--seq {seq} exceeds the tiny model's {} positions",
        config.max_position_embeddings
    );
    let weights = random_weights(&config, seed).context("building random weights")?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6b69_6c6e);
    let tokens: Vec<i64> = (0..batch * seq)
        .map(|_| rng.random_range(0..config.vocab_size as i64))
        .collect();
    let positions: Vec<i64> = (0..batch * seq).map(|i| (i % seq) as i64).collect();
    let targets = shifted_targets(&tokens, batch, seq);

    let tokens = Var::constant(Tensor::from_vec(tokens, [batch, seq])?);
    let positions = Var::constant(Tensor::from_vec(positions, [batch, seq])?);
    let targets = Var::constant(Tensor::from_vec(targets, [batch * seq])?);
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
    Ok(DemoReport {
        loss: loss_value,
        grad_norms,
        text,
    })
}
