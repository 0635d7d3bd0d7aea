//! kiln's built-in model presets: configs that need no `config.json` on disk.
//!
//! The two published presets copy the shapes of the official Hugging Face checkpoints, so
//! weights downloaded for them load into these configs; their parameter counts are tested
//! against the published ones.

use kiln_ir::DType;

use crate::error::{Error, Result};
use crate::model::{Family, ModelConfig};

/// Every preset name [`preset`] knows, in the order help text lists them.
pub const PRESETS: [&str; 3] = ["tiny", "qwen2.5-0.5b", "deepseek-r1-distill-qwen-1.5b"];

/// The config and checkpoint dtype of a built-in preset.
pub fn preset(name: &str) -> Result<(ModelConfig, DType)> {
    match name {
        "tiny" => Ok((ModelConfig::tiny(), DType::F32)),
        // Qwen/Qwen2.5-0.5B config.json.
        "qwen2.5-0.5b" => Ok((
            qwen2(Qwen2Shape {
                hidden_size: 896,
                intermediate_size: 4864,
                num_hidden_layers: 24,
                num_attention_heads: 14,
                num_key_value_heads: 2,
                rope_theta: 1_000_000.0,
                tie_word_embeddings: true,
                max_position_embeddings: 32768,
            }),
            DType::BF16,
        )),
        // deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B config.json (a Qwen2.5-Math-1.5B body).
        "deepseek-r1-distill-qwen-1.5b" => Ok((
            qwen2(Qwen2Shape {
                hidden_size: 1536,
                intermediate_size: 8960,
                num_hidden_layers: 28,
                num_attention_heads: 12,
                num_key_value_heads: 2,
                rope_theta: 10000.0,
                tie_word_embeddings: false,
                max_position_embeddings: 131072,
            }),
            DType::BF16,
        )),
        _ => Err(Error::UnknownPreset {
            name: name.to_string(),
            known: PRESETS.join(", "),
        }),
    }
}

/// What distinguishes the published Qwen2 checkpoints kiln presets.
struct Qwen2Shape {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    rope_theta: f64,
    tie_word_embeddings: bool,
    max_position_embeddings: usize,
}

/// A Qwen2 config: the Qwen tokenizer's vocabulary, head_dim = hidden / heads, q/k/v biases.
fn qwen2(shape: Qwen2Shape) -> ModelConfig {
    ModelConfig {
        family: Family::Qwen2,
        hidden_size: shape.hidden_size,
        intermediate_size: shape.intermediate_size,
        num_hidden_layers: shape.num_hidden_layers,
        num_attention_heads: shape.num_attention_heads,
        num_key_value_heads: shape.num_key_value_heads,
        head_dim: shape.hidden_size / shape.num_attention_heads,
        vocab_size: 151936,
        rms_norm_eps: 1e-6,
        rope_theta: shape.rope_theta,
        tie_word_embeddings: shape.tie_word_embeddings,
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        max_position_embeddings: shape.max_position_embeddings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::config::{config_json, parse_config};
    use crate::model::parameter_shapes;

    fn parameter_count(config: &ModelConfig) -> usize {
        let shapes = parameter_shapes(config);
        shapes
            .iter()
            .map(|(_, dims)| dims.iter().product::<usize>())
            .sum()
    }

    /// What transformers 5.24's `save_pretrained` writes for Qwen2.5-0.5B (`layer_types` and
    /// `rope_parameters` instead of `rope_theta`, `dtype`; the layer list joined on one line).
    const QWEN2_5_0_5B_SAVED_BY_TRANSFORMERS_5: &str = r#"{
  "architectures": [
    "Qwen2ForCausalLM"
  ],
  "attention_dropout": 0.0,
  "bos_token_id": null,
  "dtype": "bfloat16",
  "eos_token_id": null,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "layer_types": ["full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention", "full_attention"],
  "max_position_embeddings": 32768,
  "max_window_layers": 28,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "pad_token_id": null,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {
    "rope_theta": 1000000.0,
    "rope_type": "default"
  },
  "sliding_window": null,
  "tie_word_embeddings": true,
  "transformers_version": "5.24.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

    #[test]
    fn qwen2_5_0_5b_as_transformers_5_saves_it_is_the_preset() {
        let parsed = parse_config(QWEN2_5_0_5B_SAVED_BY_TRANSFORMERS_5, "saved").unwrap();
        assert_eq!(parsed, preset("qwen2.5-0.5b").unwrap());
    }

    #[test]
    fn published_presets_have_the_published_parameter_counts() {
        for (name, expected, head_dim) in [
            ("qwen2.5-0.5b", 494_032_768, 64),
            ("deepseek-r1-distill-qwen-1.5b", 1_777_088_000, 128),
        ] {
            let (config, dtype) = preset(name).unwrap();
            assert_eq!(parameter_count(&config), expected, "{name}");
            assert_eq!(config.head_dim, head_dim, "{name}");
            assert_eq!(dtype, DType::BF16, "{name}");
        }
    }

    #[test]
    fn tiny_is_the_embedded_default_in_f32() {
        assert_eq!(preset("tiny").unwrap(), (ModelConfig::tiny(), DType::F32));
    }

    #[test]
    fn every_preset_round_trips_through_config_json() {
        for name in PRESETS {
            let (config, dtype) = preset(name).unwrap();
            let json = config_json(&config, dtype).unwrap();
            let parsed = parse_config(&json, name).unwrap();
            assert_eq!(parsed, (config, dtype), "{name}:\n{json}");
        }
    }

    #[test]
    fn an_unknown_preset_lists_the_known_ones() {
        let error = preset("qwen2.5-7b").unwrap_err();
        assert!(matches!(error, Error::UnknownPreset { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("qwen2.5-7b"), "{message}");
        for name in PRESETS {
            assert!(message.contains(name), "{message}");
        }
    }
}
