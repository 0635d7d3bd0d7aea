//! The invariants of every [`ModelConfig`] kiln runs, whether read or written.

use super::fields::{config_error, positive};
use crate::error::Result;
use crate::model::ModelConfig;

/// The most layers a config may have. Every layer adds its parameters, names and graph nodes
/// before any tensor is sized against memory, so the bound has to come first; the deepest
/// published decoders have about 128 layers.
pub const MAX_LAYERS: usize = 1024;

/// Checks what every config kiln runs must satisfy; `path` names the source in errors.
pub fn validate(config: &ModelConfig, path: &str) -> Result<()> {
    for (field, value) in config.sizes() {
        positive(path, field, value)?;
    }
    if config.num_hidden_layers > MAX_LAYERS {
        let reason = format!(
            "{} is more than the {MAX_LAYERS} layers kiln builds",
            config.num_hidden_layers
        );
        return Err(config_error(path, "num_hidden_layers", reason));
    }
    // Positions are i64 graph inputs.
    if i64::try_from(config.max_position_embeddings).is_err() {
        let reason = format!(
            "{} is more than the {} positions an i64 can index",
            config.max_position_embeddings,
            i64::MAX
        );
        return Err(config_error(path, "max_position_embeddings", reason));
    }
    if !config
        .num_attention_heads
        .is_multiple_of(config.num_key_value_heads)
    {
        let reason = format!(
            "{} does not divide num_attention_heads {} (each key/value head serves a whole group \
             of query heads)",
            config.num_key_value_heads, config.num_attention_heads
        );
        return Err(config_error(path, "num_key_value_heads", reason));
    }
    if !config.head_dim.is_multiple_of(2) {
        let reason = format!(
            "{} is odd; split-half RoPE rotates pairs (i, i + head_dim/2)",
            config.head_dim
        );
        return Err(config_error(path, "head_dim", reason));
    }
    for (field, value) in [
        ("rms_norm_eps", config.rms_norm_eps),
        ("rope_theta", config.rope_theta),
    ] {
        if !(value.is_finite() && value > 0.0) {
            let reason = format!("{value} is not a positive finite number");
            return Err(config_error(path, field, reason));
        }
    }
    // Parameters are held in f32; their bytes bound every per-parameter size too, so token ids
    // (< vocab_size) fit an i64.
    let bytes = parameter_count(config).and_then(|count| count.checked_mul(4));
    if bytes.is_none_or(|bytes| isize::try_from(bytes).is_err()) {
        let reason = format!(
            "the sizes are too large: the parameters' f32 bytes overflow {} (isize::MAX), the \
             most one allocation can hold",
            isize::MAX
        );
        return Err(config_error(path, "(sizes)", reason));
    }
    Ok(())
}

/// The number of parameters, or `None` when it (or a shape inside it) overflows `usize`.
fn parameter_count(config: &ModelConfig) -> Option<usize> {
    let (h, i, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let q = config.num_attention_heads.checked_mul(config.head_dim)?;
    let kv = config.num_key_value_heads.checked_mul(config.head_dim)?;
    let bias = |on: bool, n: usize| if on { n } else { 0 };
    let attention = [
        h.checked_mul(q)?,
        h.checked_mul(kv)?.checked_mul(2)?,
        q.checked_mul(h)?,
        bias(config.qkv_bias, q.checked_add(kv.checked_mul(2)?)?),
        bias(config.o_bias, h),
    ];
    let mlp = [
        h.checked_mul(i)?.checked_mul(3)?,
        bias(config.mlp_bias, i.checked_mul(2)?.checked_add(h)?),
    ];
    let norms = h.checked_mul(2)?;
    let layer = attention
        .into_iter()
        .chain(mlp)
        .try_fold(norms, usize::checked_add)?;
    let heads = if config.tie_word_embeddings { 1 } else { 2 };
    v.checked_mul(h)?
        .checked_mul(heads)?
        .checked_add(layer.checked_mul(config.num_hidden_layers)?)?
        .checked_add(h)
}
