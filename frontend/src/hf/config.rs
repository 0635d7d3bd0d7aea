//! Hugging Face `config.json`: reading it into a [`ModelConfig`] and writing one back.
//!
//! Both layouts found in the wild are read: transformers 4.x (top-level `rope_theta`,
//! `rope_scaling`, `torch_dtype`) and 5.x (`rope_parameters`, `dtype`). Defaults are the ones
//! transformers itself applies to an absent key, per family, so a config means the same model
//! here as there. Whatever kiln does not implement (RoPE scaling, sliding-window attention,
//! another activation or architecture) is refused with an error naming the field and value;
//! keys that do not change the forward pass (token ids, dropout, initializer range, ...) are
//! ignored.
//!
//! Invariant: every config [`parse_config`] returns passes [`validate`], and [`config_json`]
//! writes only configs that pass it, so `parse_config(config_json(c))` gives back `c`.

mod fields;
mod validate;
mod write;

use std::path::Path;

use kiln_ir::DType;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::model::{Family, ModelConfig};
use fields::{config_error, positive, shown, Fields};

pub use validate::validate;
pub use write::config_json;

/// The file name of a model directory's config.
pub const CONFIG_FILE: &str = "config.json";

/// Reads `dir/config.json`.
pub fn load_config(dir: &Path) -> Result<(ModelConfig, DType)> {
    let path = dir.join(CONFIG_FILE);
    let shown = path.display().to_string();
    let json = crate::hf::files::read_text(&path, crate::hf::files::CONFIG_LIMIT);
    let json = json.map_err(|error| Error::Io {
        path: shown.clone(),
        reason: format!("cannot read the model config: {error}"),
    })?;
    parse_config(&json, &shown)
}

/// Parses a `config.json` text; `path` only names the file in errors. Returns the model's
/// hyper-parameters and the dtype its checkpoint is stored in.
pub fn parse_config(json: &str, path: &str) -> Result<(ModelConfig, DType)> {
    let value: Value = serde_json::from_str(json)
        .map_err(|error| config_error(path, "(json)", format!("not valid JSON: {error}")))?;
    let Value::Object(object) = &value else {
        let found = shown(&value);
        return Err(config_error(
            path,
            "(json)",
            format!("expected a JSON object, found {found}"),
        ));
    };
    let fields = Fields::new(object, path);
    let family = family(&fields)?;
    check_unsupported(&fields)?;

    let hidden_size = fields.required_size("hidden_size")?;
    let num_attention_heads = fields.required_size("num_attention_heads")?;
    // Checked before `head_dim` is derived from them (no division by zero).
    positive(path, "hidden_size", hidden_size)?;
    positive(path, "num_attention_heads", num_attention_heads)?;
    let head_dim = match fields.size("head_dim")? {
        Some(head_dim) => head_dim,
        None if hidden_size.is_multiple_of(num_attention_heads) => {
            hidden_size / num_attention_heads
        }
        None => {
            let reason = format!(
                "absent, and hidden_size {hidden_size} is not divisible by num_attention_heads \
                 {num_attention_heads} (set head_dim explicitly)"
            );
            return Err(config_error(path, "head_dim", reason));
        }
    };
    // transformers: an explicit null means "as many as query heads" in both families, but an
    // absent key takes the class default, which for Qwen2Config is 32.
    let num_key_value_heads = match (fields.object.get("num_key_value_heads"), family) {
        (None, Family::Qwen2) if !num_attention_heads.is_multiple_of(32) => {
            let reason = format!(
                "absent, so transformers' Qwen2Config default 32 applies, which does not divide \
                 num_attention_heads {num_attention_heads} (set num_key_value_heads explicitly)"
            );
            return Err(config_error(path, "num_key_value_heads", reason));
        }
        (None, Family::Qwen2) => 32,
        _ => fields
            .size("num_key_value_heads")?
            .unwrap_or(num_attention_heads),
    };
    let (qkv_bias, o_bias, mlp_bias) = match family {
        // Qwen2 hard-codes its biases; `attention_bias` / `mlp_bias` are not read there.
        Family::Qwen2 => (true, false, false),
        Family::Llama => {
            let attention_bias = fields.boolean("attention_bias")?.unwrap_or(false);
            let mlp_bias = fields.boolean("mlp_bias")?.unwrap_or(false);
            (attention_bias, attention_bias, mlp_bias)
        }
    };
    let config = ModelConfig {
        family,
        hidden_size,
        intermediate_size: fields.required_size("intermediate_size")?,
        num_hidden_layers: fields.required_size("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size: fields.required_size("vocab_size")?,
        rms_norm_eps: fields.float("rms_norm_eps")?.unwrap_or(1e-6),
        rope_theta: rope_theta(&fields)?,
        tie_word_embeddings: fields.boolean("tie_word_embeddings")?.unwrap_or(false),
        qkv_bias,
        o_bias,
        mlp_bias,
        max_position_embeddings: match fields.size("max_position_embeddings")? {
            Some(positions) => positions,
            // The transformers class defaults.
            None if family == Family::Qwen2 => 32768,
            None => 2048,
        },
    };
    validate(&config, path)?;
    check_layer_types(&fields, config.num_hidden_layers)?;
    Ok((config, checkpoint_dtype(&fields)?))
}

/// `layer_types`, when given: one entry per layer, as transformers requires, each
/// `"full_attention"`.
fn check_layer_types(fields: &Fields, layers: usize) -> Result<()> {
    let Some(layer_types) = fields.get("layer_types") else {
        return Ok(());
    };
    let Value::Array(types) = layer_types else {
        let found = shown(layer_types);
        return Err(fields.error("layer_types", format!("expected an array, found {found}")));
    };
    if let Some(other) = types.iter().find(|t| t.as_str() != Some("full_attention")) {
        let reason = "kiln implements full causal attention only";
        return Err(fields.unsupported("layer_types", &shown(other), reason));
    }
    if types.len() != layers {
        let reason = format!(
            "{} entries for num_hidden_layers {layers} (one per layer)",
            types.len()
        );
        return Err(fields.error("layer_types", reason));
    }
    Ok(())
}

/// `model_type` → [`Family`].
fn family(fields: &Fields) -> Result<Family> {
    let Some(model_type) = fields.string("model_type")? else {
        return Err(fields.error("model_type", "missing (required)".into()));
    };
    match model_type {
        "qwen2" => Ok(Family::Qwen2),
        "llama" => Ok(Family::Llama),
        other => Err(fields.unsupported(
            "model_type",
            other,
            "kiln implements \"qwen2\" and \"llama\"",
        )),
    }
}

/// Refuses the switches that change the forward pass in ways kiln does not implement.
/// `attention_dropout` is deliberately not among them: dropout is training-time
/// regularisation, off in evaluation, and kiln's programs do not implement it.
fn check_unsupported(fields: &Fields) -> Result<()> {
    if let Some(act) = fields.string("hidden_act")? {
        if act != "silu" {
            return Err(fields.unsupported("hidden_act", act, "kiln's MLP is SwiGLU (\"silu\")"));
        }
    }
    if fields.boolean("use_sliding_window")? == Some(true) {
        let reason = "kiln implements full causal attention only";
        return Err(fields.unsupported("use_sliding_window", "true", reason));
    }
    for (field, rope) in [
        ("rope_scaling", fields.get("rope_scaling")),
        ("rope_parameters", fields.get("rope_parameters")),
    ] {
        let Some(rope) = rope else { continue };
        let Value::Object(rope) = rope else {
            let found = shown(rope);
            return Err(fields.error(field, format!("expected an object, found {found}")));
        };
        let prefix = format!("{field}.");
        let inner = fields.nested(&prefix, rope);
        // 5.x spells the key `rope_type`, older configs `type`; absent means default.
        for key in ["rope_type", "type"] {
            if let Some(rope_type) = inner.string(key)? {
                if rope_type != "default" {
                    let reason = "kiln implements unscaled (default) RoPE only";
                    return Err(inner.unsupported(key, rope_type, reason));
                }
            }
        }
        if let Some((key, _)) = rope.iter().find(|(_, value)| value.is_object()) {
            let reason = "per-layer-type RoPE parameters are not implemented";
            return Err(inner.unsupported(key, "{...}", reason));
        }
        check_full_rotary(&inner)?;
    }
    check_full_rotary(fields)
}

/// RoPE over the whole head: `partial_rotary_factor`, when given, must be 1.
fn check_full_rotary(fields: &Fields) -> Result<()> {
    match fields.float("partial_rotary_factor")? {
        Some(factor) if factor != 1.0 => {
            let reason = "kiln rotates the whole head (factor 1)";
            Err(fields.unsupported("partial_rotary_factor", &factor.to_string(), reason))
        }
        _ => Ok(()),
    }
}

/// `rope_theta` from either layout; both present must agree.
fn rope_theta(fields: &Fields) -> Result<f64> {
    let top = fields.float("rope_theta")?;
    let nested = match fields.get("rope_parameters") {
        Some(Value::Object(rope)) => fields
            .nested("rope_parameters.", rope)
            .float("rope_theta")?,
        _ => None,
    };
    match (top, nested) {
        (Some(top), Some(nested)) if top != nested => {
            let reason = format!(
                "top-level rope_theta {top} differs from rope_parameters.rope_theta {nested}"
            );
            Err(fields.error("rope_theta", reason))
        }
        (top, nested) => Ok(nested.or(top).unwrap_or(10000.0)),
    }
}

/// The checkpoint dtype: `dtype` (5.x) or `torch_dtype` (4.x); both present must agree.
fn checkpoint_dtype(fields: &Fields) -> Result<DType> {
    let read = |key: &str| -> Result<Option<(DType, &str)>> {
        let Some(name) = fields.string(key)? else {
            return Ok(None);
        };
        let dtype = match name {
            "float32" => DType::F32,
            "bfloat16" => DType::BF16,
            "float16" => DType::F16,
            other => {
                let reason = "expected float32, bfloat16 or float16";
                return Err(fields.unsupported(key, other, reason));
            }
        };
        Ok(Some((dtype, name)))
    };
    match (read("torch_dtype")?, read("dtype")?) {
        (Some((legacy, legacy_name)), Some((current, name))) if legacy != current => {
            let reason = format!("\"{name}\" disagrees with torch_dtype \"{legacy_name}\"");
            Err(fields.error("dtype", reason))
        }
        (legacy, current) => Ok(current.or(legacy).map_or(DType::F32, |(dtype, _)| dtype)),
    }
}

#[cfg(test)]
mod tests;
