//! The decoder-only Transformer (Qwen2 / Llama), written once against [`Ops`].
//!
//! Per layer, as Hugging Face computes it:
//! `h = h + o_proj(attention(rope(q_proj(norm(h))), rope(k_proj(..)), v_proj(..)))`,
//! `h = h + down_proj(silu(gate_proj(norm(h))) · up_proj(norm(h)))`,
//! with each residual add fused into the RMSNorm that follows it. Under tensor parallelism
//! ([`ModelConfig::shard`]) o_proj and down_proj give partial sums, made whole by
//! [`Ops::reduce_partial`] before the residual add. q/k biases are fused into
//! RoPE (they are added before the rotation, as in Hugging Face's projection).
//!
//! The points a user may trace are named ([`Ops::name_value`]): `embed`; per layer `i`
//! `layers.i.attn.norm` (the attention's input norm), `layers.i.attn.q`, `.k` (after RoPE,
//! `[B,H,T,D]`), `.v` (`[B,Hkv,T,D]`), `layers.i.attn.out` (after o_proj),
//! `layers.i.attn.residual` (the residual stream after the attention block),
//! `layers.i.mlp.norm`, `layers.i.mlp.out` (after down_proj), `layers.i.residual` (the
//! residual stream after the layer); `norm` (the final norm) and `logits`.

use crate::error::Result;
use crate::model::config::ModelConfig;
use crate::model::ops::Ops;
use crate::model::weights::{LayerWeights, ModelWeights};

/// Hugging Face's ignore index for labels.
pub const IGNORE_INDEX: i64 = -100;

/// Logits `[B,T,V]` for `tokens [B,T]` at `positions [B,T]`.
pub fn forward<O: Ops>(
    ops: &O,
    config: &ModelConfig,
    weights: &ModelWeights<O::Value>,
    tokens: &O::Value,
    positions: &O::Value,
) -> Result<O::Value> {
    let hidden = hidden_states(ops, config, weights, tokens, positions)?;
    output_head(ops, weights, &hidden)
}

/// Logits `[B,V]` of the last position only (what prefill returns): the output head, the
/// largest GEMM, runs on one position per row.
pub fn last_logits<O: Ops>(
    ops: &O,
    config: &ModelConfig,
    weights: &ModelWeights<O::Value>,
    tokens: &O::Value,
    positions: &O::Value,
) -> Result<O::Value> {
    let hidden = hidden_states(ops, config, weights, tokens, positions)?;
    let last = ops.last_position(&hidden)?;
    let logits = output_head(ops, weights, &last)?;
    let dims = ops.dims(&logits);
    ops.reshape(&logits, &[dims[0], config.vocab_size])
}

/// `x · lm_headᵀ` (the embedding when tied).
pub fn output_head<O: Ops>(
    ops: &O,
    weights: &ModelWeights<O::Value>,
    hidden: &O::Value,
) -> Result<O::Value> {
    let head = weights.lm_head.as_ref().unwrap_or(&weights.embed_tokens);
    let logits = ops.linear(hidden, head, None)?;
    ops.name_value("logits", &logits)?;
    Ok(logits)
}

/// The final normalized hidden states `[B,T,H]`.
pub fn hidden_states<O: Ops>(
    ops: &O,
    config: &ModelConfig,
    weights: &ModelWeights<O::Value>,
    tokens: &O::Value,
    positions: &O::Value,
) -> Result<O::Value> {
    let mut hidden = ops.embedding(&weights.embed_tokens, tokens)?;
    ops.name_value("embed", &hidden)?;
    // `residual` is the running sum; `hidden` the output of the last block not yet added to it.
    let mut residual: Option<O::Value> = None;
    // The residual stream after the previous layer (before layer 0 there is no sum to name).
    let after_layer = |index: usize| format!("layers.{}.residual", index.saturating_sub(1));
    for (index, layer) in weights.layers.iter().enumerate() {
        let names = (after_layer(index), format!("layers.{index}.attn.norm"));
        let normed = pre_norm(
            ops,
            config,
            (&hidden, &mut residual),
            &layer.input_layernorm,
            names,
        )?;
        hidden = attention_block(ops, config, index, layer, &normed, positions)?;
        ops.name_value(&format!("layers.{index}.attn.out"), &hidden)?;
        let names = (
            format!("layers.{index}.attn.residual"),
            format!("layers.{index}.mlp.norm"),
        );
        let weight = &layer.post_attention_layernorm;
        let normed = pre_norm(ops, config, (&hidden, &mut residual), weight, names)?;
        hidden = mlp_block(ops, layer, &normed)?;
        ops.name_value(&format!("layers.{index}.mlp.out"), &hidden)?;
    }
    let names = (after_layer(weights.layers.len()), "norm".to_string());
    pre_norm(ops, config, (&hidden, &mut residual), &weights.norm, names)
}

/// `rmsnorm(hidden + residual)`, updating `residual`; the first call starts the residual.
/// Names the new residual `sum_name` (when there is a sum) and the result `norm_name`.
fn pre_norm<O: Ops>(
    ops: &O,
    config: &ModelConfig,
    (hidden, residual): (&O::Value, &mut Option<O::Value>),
    weight: &O::Value,
    (sum_name, norm_name): (String, String),
) -> Result<O::Value> {
    let normed = match residual {
        None => {
            *residual = Some(hidden.clone());
            ops.rmsnorm(hidden, weight, config.rms_norm_eps)?
        }
        Some(previous) => {
            let (sum, normed) = ops.add_rmsnorm(hidden, previous, weight, config.rms_norm_eps)?;
            ops.name_value(&sum_name, &sum)?;
            *residual = Some(sum);
            normed
        }
    };
    ops.name_value(&norm_name, &normed)?;
    Ok(normed)
}

fn attention_block<O: Ops>(
    ops: &O,
    config: &ModelConfig,
    index: usize,
    layer: &LayerWeights<O::Value>,
    x: &O::Value,
    positions: &O::Value,
) -> Result<O::Value> {
    let dims = ops.dims(x);
    let (batch, seq) = (dims[0], dims[1]);
    let (heads, kv_heads, head_dim) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    );
    let q = ops.linear(x, &layer.q_proj, None)?;
    let q = ops.reshape(&q, &[batch, seq, heads, head_dim])?;
    let q = ops.rope(&q, positions, layer.q_bias.as_ref(), config.rope_theta)?;
    let k = ops.linear(x, &layer.k_proj, None)?;
    let k = ops.reshape(&k, &[batch, seq, kv_heads, head_dim])?;
    let k = ops.rope(&k, positions, layer.k_bias.as_ref(), config.rope_theta)?;
    let v = ops.linear(x, &layer.v_proj, layer.v_bias.as_ref())?;
    let v = ops.reshape(&v, &[batch, seq, kv_heads, head_dim])?;
    let v = ops.heads_first(&v)?;
    for (name, value) in [("q", &q), ("k", &k), ("v", &v)] {
        ops.name_value(&format!("layers.{index}.attn.{name}"), value)?;
    }
    let scale = 1.0 / (head_dim as f64).sqrt();
    let attended = ops.attention(index, &q, &k, &v, scale)?;
    let attended = ops.reshape(&attended, &[batch, seq, heads * head_dim])?;
    let out = ops.linear(&attended, &layer.o_proj, layer.o_bias.as_ref())?;
    ops.reduce_partial(&out)
}

fn mlp_block<O: Ops>(ops: &O, layer: &LayerWeights<O::Value>, x: &O::Value) -> Result<O::Value> {
    let gate = ops.linear(x, &layer.gate_proj, layer.gate_bias.as_ref())?;
    let up = ops.linear(x, &layer.up_proj, layer.up_bias.as_ref())?;
    let act = ops.swiglu(&gate, &up)?;
    let out = ops.linear(&act, &layer.down_proj, layer.down_bias.as_ref())?;
    ops.reduce_partial(&out)
}

/// Hugging Face's causal-LM loss: mean cross-entropy of `logits[:, :-1]` against
/// `tokens[:, 1:]`. `targets [B·T]` are the tokens shifted left by one with the last position
/// of each row set to [`IGNORE_INDEX`] (see [`shifted_targets`]), which gives the same mean
/// without slicing the logits.
pub fn causal_lm_loss<O: Ops>(ops: &O, logits: &O::Value, targets: &O::Value) -> Result<O::Value> {
    let dims = ops.dims(logits);
    let vocab = dims.last().copied().unwrap_or(0);
    let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    let flat = ops.reshape(logits, &[rows, vocab])?;
    ops.cross_entropy(&flat, targets, IGNORE_INDEX)
}

/// [`causal_lm_loss`] of the logits of `hidden [B,T,H]`, which the caller passes as `logits`
/// where it has them; in mixed precision ([`Ops::chunked_loss`]) the LM head and the loss in
/// one op over vocabulary chunks instead, so the train step's logits never exist whole. An
/// eval program there computes the head twice (its logits, and the loss as training does),
/// so its loss and gradients are the train step's, bit for bit.
pub fn lm_loss<O: Ops>(
    ops: &O,
    weights: &ModelWeights<O::Value>,
    hidden: &O::Value,
    logits: Option<&O::Value>,
    targets: &O::Value,
) -> Result<O::Value> {
    let head = weights.lm_head.as_ref().unwrap_or(&weights.embed_tokens);
    if let Some(loss) = ops.chunked_loss(hidden, head, targets, IGNORE_INDEX)? {
        return Ok(loss);
    }
    match logits {
        Some(logits) => causal_lm_loss(ops, logits, targets),
        None => causal_lm_loss(ops, &output_head(ops, weights, hidden)?, targets),
    }
}

/// Targets for [`causal_lm_loss`]: row-major `tokens [B,T]` shifted left, last column ignored.
pub fn shifted_targets(tokens: &[i64], batch: usize, seq: usize) -> Vec<i64> {
    let mut targets = vec![IGNORE_INDEX; batch * seq];
    for b in 0..batch {
        for t in 0..seq.saturating_sub(1) {
            targets[b * seq + t] = tokens[b * seq + t + 1];
        }
    }
    targets
}
