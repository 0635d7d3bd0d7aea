//! Writing a [`ModelConfig`] as a Hugging Face `config.json`.

use kiln_ir::DType;
use serde_json::{Map, Value};

use super::fields::{config_error, unsupported};
use super::validate::validate;
use crate::error::Result;
use crate::model::{Family, ModelConfig};

/// What errors name as their "file": the config being written has none.
const WRITTEN: &str = "ModelConfig";

/// Writes a `config.json` that transformers (4.x and 5.x) loads as this model and that
/// [`parse_config`](super::parse_config) reads back to `config`. Keys are sorted (a `BTreeMap`), so the text is
/// deterministic. Fails for configs the Hugging Face format cannot express.
pub fn config_json(config: &ModelConfig, dtype: DType) -> Result<String> {
    validate(config, WRITTEN)?;
    let dtype_name = match dtype {
        DType::F32 => "float32",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => {
            let reason = "checkpoints are float32, bfloat16 or float16".to_string();
            return Err(unsupported(WRITTEN, "dtype", other.to_string(), reason));
        }
    };
    let mut object = Map::new();
    let mut put = |key: &str, value: Value| object.insert(key.to_string(), value);
    match config.family {
        Family::Qwen2 => {
            if !config.qkv_bias || config.o_bias || config.mlp_bias {
                let value = biases(config);
                let reason = "qwen2 always has q/k/v biases and no o_proj or MLP bias".to_string();
                return Err(unsupported(
                    WRITTEN,
                    "qkv_bias/o_bias/mlp_bias",
                    value,
                    reason,
                ));
            }
            put("architectures", Value::from(vec!["Qwen2ForCausalLM"]));
            put("model_type", Value::from("qwen2"));
            put("use_sliding_window", Value::from(false));
        }
        Family::Llama => {
            if config.qkv_bias != config.o_bias {
                let value = biases(config);
                let reason = "llama's one `attention_bias` covers q/k/v and o_proj alike".into();
                return Err(unsupported(WRITTEN, "attention_bias", value, reason));
            }
            put("architectures", Value::from(vec!["LlamaForCausalLM"]));
            put("model_type", Value::from("llama"));
            put("attention_bias", Value::from(config.qkv_bias));
            put("mlp_bias", Value::from(config.mlp_bias));
        }
    }
    for (key, value) in config.sizes() {
        put(key, Value::from(value));
    }
    put("rms_norm_eps", Value::from(config.rms_norm_eps));
    put(
        "tie_word_embeddings",
        Value::from(config.tie_word_embeddings),
    );
    put("hidden_act", Value::from("silu"));
    // Both layouts, equal: 4.x reads the top-level key, 5.x the dictionary.
    put("rope_theta", Value::from(config.rope_theta));
    let mut rope = Map::new();
    rope.insert("rope_type".into(), Value::from("default"));
    rope.insert("rope_theta".into(), Value::from(config.rope_theta));
    put("rope_parameters", Value::Object(rope));
    put("torch_dtype", Value::from(dtype_name));
    put("dtype", Value::from(dtype_name));
    let mut text = serde_json::to_string_pretty(&Value::Object(object))
        .map_err(|error| config_error(WRITTEN, "(json)", error.to_string()))?;
    text.push('\n');
    Ok(text)
}

fn biases(config: &ModelConfig) -> String {
    format!(
        "qkv_bias {}, o_bias {}, mlp_bias {}",
        config.qkv_bias, config.o_bias, config.mlp_bias
    )
}

#[cfg(test)]
mod tests {
    use rand::Rng;
    use serde_json::json;

    use super::*;
    use crate::error::Error;
    use crate::hf::config::parse_config;

    fn parse(json: &str) -> Result<(ModelConfig, DType)> {
        parse_config(json, "written")
    }

    /// A Llama with o_proj and q/k/v biases and a head_dim of its own.
    fn llama() -> ModelConfig {
        ModelConfig {
            family: Family::Llama,
            hidden_size: 2048,
            intermediate_size: 5632,
            num_hidden_layers: 22,
            num_attention_heads: 32,
            num_key_value_heads: 4,
            head_dim: 128,
            vocab_size: 32000,
            rms_norm_eps: 1e-5,
            rope_theta: 500000.0,
            tie_word_embeddings: false,
            qkv_bias: true,
            o_bias: true,
            mlp_bias: false,
            max_position_embeddings: 4096,
        }
    }

    /// A random config that kiln runs, of either family.
    fn random_config(rng: &mut impl Rng) -> (ModelConfig, DType) {
        let family = if rng.random() {
            Family::Qwen2
        } else {
            Family::Llama
        };
        let num_key_value_heads = rng.random_range(1..=8);
        let num_attention_heads = num_key_value_heads * rng.random_range(1..=8);
        let head_dim = 2 * rng.random_range(1..=128);
        let attention_bias = rng.random();
        let config = ModelConfig {
            family,
            hidden_size: rng.random_range(1..=8192),
            intermediate_size: rng.random_range(1..=30000),
            num_hidden_layers: rng.random_range(1..=100),
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: rng.random_range(1..=300_000),
            // Decimal values as configs carry them (serde_json parses these exactly).
            rms_norm_eps: [1e-5, 1e-6, 1e-8, 0.5][rng.random_range(0..4)],
            rope_theta: f64::from(rng.random_range(1..=u32::MAX)),
            tie_word_embeddings: rng.random(),
            qkv_bias: family == Family::Qwen2 || attention_bias,
            o_bias: family == Family::Llama && attention_bias,
            mlp_bias: family == Family::Llama && rng.random(),
            max_position_embeddings: rng.random_range(1..=1 << 20),
        };
        let dtype = [DType::F32, DType::BF16, DType::F16][rng.random_range(0..3)];
        (config, dtype)
    }

    #[test]
    fn config_json_round_trips_random_configs() {
        let mut rng = kiln_kernels::testing::rng("config_json_round_trips_random_configs");
        for _ in 0..200 {
            let (config, dtype) = random_config(&mut rng);
            let json = config_json(&config, dtype).unwrap();
            assert_eq!(parse(&json).unwrap(), (config.clone(), dtype), "{json}");
            assert_eq!(config_json(&config, dtype).unwrap(), json, "deterministic");
        }
    }

    #[test]
    fn config_json_writes_both_transformers_layouts() {
        let config = llama();
        let json = config_json(&config, DType::BF16).unwrap();
        let value: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["architectures"], json!(["LlamaForCausalLM"]));
        assert_eq!(value["rope_theta"], json!(500000.0));
        assert_eq!(
            value["rope_parameters"],
            json!({"rope_type": "default", "rope_theta": 500000.0})
        );
        assert_eq!(
            (&value["torch_dtype"], &value["dtype"]),
            (&json!("bfloat16"), &json!("bfloat16"))
        );
        assert_eq!(
            (&value["attention_bias"], &value["mlp_bias"]),
            (&json!(true), &json!(false))
        );
        assert!(value.get("bos_token_id").is_none() && value.get("eos_token_id").is_none());
        let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        assert!(keys.windows(2).all(|pair| pair[0] < pair[1]), "{keys:?}");

        let qwen2 = ModelConfig::tiny();
        let value: Value = serde_json::from_str(&config_json(&qwen2, DType::F32).unwrap()).unwrap();
        assert_eq!(value["architectures"], json!(["Qwen2ForCausalLM"]));
        assert_eq!(value["use_sliding_window"], json!(false));
        assert!(value.get("attention_bias").is_none());
    }

    #[test]
    fn config_json_refuses_what_the_format_cannot_express() {
        let llama = llama();
        let split_bias = ModelConfig {
            o_bias: false,
            ..llama.clone()
        };
        let error = config_json(&split_bias, DType::F32).unwrap_err();
        assert!(matches!(error, Error::Unsupported { .. }), "{error:?}");
        let message = error.to_string();
        assert!(
            message.contains("attention_bias") && message.contains("o_bias false"),
            "{message}"
        );

        let qwen2 = ModelConfig {
            o_bias: true,
            ..ModelConfig::tiny()
        };
        let error = config_json(&qwen2, DType::F32).unwrap_err();
        assert!(matches!(error, Error::Unsupported { .. }), "{error:?}");
        assert!(error.to_string().contains("o_bias true"), "{error}");

        let error = config_json(&llama, DType::F64).unwrap_err();
        assert!(matches!(error, Error::Unsupported { .. }), "{error:?}");
        assert!(error.to_string().contains("dtype = f64"), "{error}");

        let odd = ModelConfig {
            head_dim: 7,
            ..llama
        };
        let error = config_json(&odd, DType::F32).unwrap_err();
        assert!(matches!(error, Error::Config { .. }), "{error:?}");
        assert!(
            error.to_string().contains("head_dim") && error.to_string().contains('7'),
            "{error}"
        );
    }
}
