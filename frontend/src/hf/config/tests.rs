use serde_json::json;

use super::*;

/// Qwen/Qwen2.5-0.5B's config.json as published (transformers 4.x layout).
const QWEN2_5_0_5B: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.40.1",
  "use_cache": true,
  "use_mrope": false,
  "use_sliding_window": false,
  "vocab_size": 151936
}"#;

/// A Llama config as transformers 5.x saves it (`rope_parameters`, `dtype`), with an explicit
/// head_dim larger than hidden_size / num_attention_heads.
const LLAMA_5X: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.1,
  "bos_token_id": 1,
  "dtype": "float16",
  "eos_token_id": [2, 3],
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 5632,
  "max_position_embeddings": 4096,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 22,
  "num_key_value_heads": 4,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
  "tie_word_embeddings": false,
  "transformers_version": "5.0.0",
  "use_cache": true,
  "vocab_size": 32000
}"#;

fn parse(json: &str) -> Result<(ModelConfig, DType)> {
    parse_config(json, "models/x/config.json")
}

/// `base` with each edit applied: the key set to the value, or removed (absent) for `Value::Null`.
fn with(base: &str, edits: &[(&str, Value)]) -> String {
    let mut value: Value = serde_json::from_str(base).unwrap();
    let object = value.as_object_mut().unwrap();
    for (key, edit) in edits {
        match edit {
            Value::Null => object.remove(*key),
            _ => object.insert(key.to_string(), edit.clone()),
        };
    }
    value.to_string()
}

/// Asserts `json` is refused as `variant` with a message naming every one of `names`.
fn assert_refused(json: &str, variant: &str, names: &[&str]) {
    let error = parse(json).expect_err(json);
    let got = match &error {
        Error::Config { .. } => "Config",
        Error::Unsupported { .. } => "Unsupported",
        _ => "other",
    };
    assert_eq!(got, variant, "{error:?} for {json}");
    let message = error.to_string();
    assert!(message.contains("models/x/config.json"), "{message}");
    for name in names {
        assert!(message.contains(name), "{message:?} lacks {name:?}");
    }
}

#[test]
fn reads_qwen2_5_0_5b_as_published() {
    let (config, dtype) = parse(QWEN2_5_0_5B).unwrap();
    let expected = ModelConfig {
        family: Family::Qwen2,
        hidden_size: 896,
        intermediate_size: 4864,
        num_hidden_layers: 24,
        num_attention_heads: 14,
        num_key_value_heads: 2,
        head_dim: 64,
        vocab_size: 151936,
        rms_norm_eps: 1e-6,
        rope_theta: 1e6,
        tie_word_embeddings: true,
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        max_position_embeddings: 32768,
    };
    assert_eq!(config, expected);
    assert_eq!(dtype, DType::BF16);
}

#[test]
fn reads_a_transformers_5_llama_config() {
    let (config, dtype) = parse(LLAMA_5X).unwrap();
    let expected = ModelConfig {
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
    };
    assert_eq!(config, expected);
    assert_eq!(dtype, DType::F16);
}

#[test]
fn head_dim_is_read_when_present_and_derived_when_absent_or_null() {
    let derived = with(LLAMA_5X, &[("head_dim", Value::Null)]);
    assert_eq!(parse(&derived).unwrap().0.head_dim, 2048 / 32);
    let null = LLAMA_5X.replace(r#""head_dim": 128"#, r#""head_dim": null"#);
    assert!(null.contains(r#""head_dim": null"#));
    assert_eq!(parse(&null).unwrap().0.head_dim, 64);
    let explicit = with(LLAMA_5X, &[("head_dim", json!(32))]);
    assert_eq!(parse(&explicit).unwrap().0.head_dim, 32);
}

#[test]
fn absent_keys_take_the_transformers_defaults_of_each_family() {
    let llama = json!({
        "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    });
    let (config, dtype) = parse(&llama.to_string()).unwrap();
    assert_eq!(dtype, DType::F32);
    assert_eq!(
        (
            config.num_key_value_heads,
            config.head_dim,
            config.rms_norm_eps
        ),
        (4, 16, 1e-6)
    );
    assert_eq!(config.rope_theta, 10000.0);
    assert!(!config.tie_word_embeddings);
    assert_eq!(config.max_position_embeddings, 2048);
    assert_eq!(
        (config.qkv_bias, config.o_bias, config.mlp_bias),
        (false, false, false)
    );

    // Qwen2Config's class defaults: 32 key/value heads and 32768 positions; its biases are
    // fixed whatever attention_bias / mlp_bias say.
    let mut qwen2 = llama.clone();
    qwen2["model_type"] = json!("qwen2");
    qwen2["num_attention_heads"] = json!(64);
    qwen2["head_dim"] = json!(2);
    qwen2["attention_bias"] = json!(false);
    qwen2["mlp_bias"] = json!(true);
    let (config, _) = parse(&qwen2.to_string()).unwrap();
    assert_eq!(config.num_key_value_heads, 32);
    assert_eq!(config.max_position_embeddings, 32768);
    assert_eq!(
        (config.qkv_bias, config.o_bias, config.mlp_bias),
        (true, false, false)
    );
    // An explicit null means "as many as query heads", in both families.
    qwen2["num_key_value_heads"] = Value::Null;
    assert_eq!(parse(&qwen2.to_string()).unwrap().0.num_key_value_heads, 64);
}

#[test]
fn default_rope_scaling_and_matching_thetas_are_accepted() {
    let default_scaling = json!({"rope_type": "default"});
    let both_thetas = json!({"rope_type": "default", "rope_theta": 1e6});
    let json = with(
        QWEN2_5_0_5B,
        &[
            ("rope_scaling", default_scaling),
            ("rope_parameters", both_thetas),
        ],
    );
    assert_eq!(parse(&json).unwrap().0.rope_theta, 1e6);
    // Token ids, dropout and unknown keys change nothing.
    let json = with(
        QWEN2_5_0_5B,
        &[
            ("attention_dropout", json!(0.5)),
            ("something_new", json!([1, 2])),
        ],
    );
    assert_eq!(parse(&json).unwrap(), parse(QWEN2_5_0_5B).unwrap());
}

#[test]
fn refuses_what_kiln_does_not_implement() {
    let scaled = |kind: &str, key: &str| json!({ key: kind, "factor": 8.0, "rope_theta": 1e6 });
    for (field, edit, names) in [
        ("model_type", json!("gpt2"), vec!["model_type", "gpt2"]),
        ("hidden_act", json!("gelu"), vec!["hidden_act", "gelu"]),
        (
            "use_sliding_window",
            json!(true),
            vec!["use_sliding_window", "true"],
        ),
        (
            "layer_types",
            json!(["full_attention", "sliding_attention"]),
            vec!["layer_types", "sliding_attention"],
        ),
        (
            "partial_rotary_factor",
            json!(0.5),
            vec!["partial_rotary_factor", "0.5"],
        ),
        (
            "rope_scaling",
            scaled("linear", "type"),
            vec!["rope_scaling.type", "linear"],
        ),
        (
            "rope_scaling",
            scaled("yarn", "rope_type"),
            vec!["rope_scaling.rope_type", "yarn"],
        ),
        (
            "rope_scaling",
            scaled("llama3", "rope_type"),
            vec!["rope_scaling.rope_type", "llama3"],
        ),
        (
            "rope_parameters",
            scaled("linear", "rope_type"),
            vec!["rope_parameters.rope_type", "linear"],
        ),
        (
            "rope_parameters",
            scaled("yarn", "rope_type"),
            vec!["rope_parameters.rope_type", "yarn"],
        ),
        (
            "rope_parameters",
            scaled("llama3", "rope_type"),
            vec!["rope_parameters.rope_type", "llama3"],
        ),
        (
            "rope_parameters",
            json!({"full_attention": {"rope_type": "default", "rope_theta": 1e6}}),
            vec!["rope_parameters.full_attention"],
        ),
    ] {
        assert_refused(&with(QWEN2_5_0_5B, &[(field, edit)]), "Unsupported", &names);
    }
}

#[test]
fn refuses_inconsistent_shapes() {
    let absent = with(QWEN2_5_0_5B, &[("num_key_value_heads", Value::Null)]);
    assert_refused(
        &absent,
        "Config",
        &["num_key_value_heads", "absent", "32", "14"],
    );
    let heads = with(QWEN2_5_0_5B, &[("num_key_value_heads", json!(4))]);
    assert_refused(&heads, "Config", &["num_key_value_heads", "4", "14"]);
    let odd = with(LLAMA_5X, &[("head_dim", json!(63))]);
    assert_refused(&odd, "Config", &["head_dim", "63", "odd"]);
    let indivisible = with(
        LLAMA_5X,
        &[("head_dim", Value::Null), ("hidden_size", json!(2050))],
    );
    assert_refused(&indivisible, "Config", &["head_dim", "2050", "32"]);
    let huge = with(
        LLAMA_5X,
        &[
            ("vocab_size", json!(1u64 << 62)),
            ("hidden_size", json!(1u64 << 62)),
        ],
    );
    assert_refused(&huge, "Config", &["(sizes)", "overflow"]);
}

#[test]
fn refuses_missing_and_mistyped_fields() {
    for field in [
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
    ] {
        let missing = with(QWEN2_5_0_5B, &[(field, Value::Null)]);
        assert_refused(&missing, "Config", &[field, "missing"]);
    }
    for (field, edit, shown) in [
        ("hidden_size", json!("896"), "\"896\""),
        ("num_hidden_layers", json!(-2), "-2"),
        ("intermediate_size", json!(4864.5), "4864.5"),
        ("num_key_value_heads", json!(2.0), "2.0"),
        ("vocab_size", json!(0), "0"),
        ("max_position_embeddings", json!(0), "0"),
        ("tie_word_embeddings", json!("yes"), "\"yes\""),
        ("rope_theta", json!("1e6"), "\"1e6\""),
        ("rms_norm_eps", json!(-1e-6), "-0.000001"),
        ("rope_scaling", json!("linear"), "\"linear\""),
        ("layer_types", json!("full_attention"), "\"full_attention\""),
        ("model_type", json!(2), "2"),
    ] {
        assert_refused(
            &with(QWEN2_5_0_5B, &[(field, edit)]),
            "Config",
            &[field, shown],
        );
    }
    let nested = with(
        QWEN2_5_0_5B,
        &[("rope_parameters", json!({"rope_theta": "big"}))],
    );
    assert_refused(
        &nested,
        "Config",
        &["rope_parameters.rope_theta", "\"big\""],
    );
}

#[test]
fn refuses_conflicting_duplicates() {
    let thetas = with(
        QWEN2_5_0_5B,
        &[(
            "rope_parameters",
            json!({"rope_type": "default", "rope_theta": 10000}),
        )],
    );
    assert_refused(&thetas, "Config", &["rope_theta", "1000000", "10000"]);
    let dtypes = with(QWEN2_5_0_5B, &[("dtype", json!("float32"))]);
    assert_refused(
        &dtypes,
        "Config",
        &["dtype", "\"float32\"", "torch_dtype \"bfloat16\""],
    );
}

#[test]
fn refuses_other_dtypes() {
    for (field, name) in [
        ("torch_dtype", "int8"),
        ("dtype", "float64"),
        ("torch_dtype", "auto"),
    ] {
        let json = with(QWEN2_5_0_5B, &[(field, json!(name))]);
        assert_refused(&json, "Unsupported", &[field, name]);
    }
    let json = with(QWEN2_5_0_5B, &[("torch_dtype", Value::Null)]);
    assert_eq!(parse(&json).unwrap().1, DType::F32);
}

#[test]
fn refuses_malformed_json_with_its_position() {
    // The comma after "hidden_act" (line 6) is missing: serde_json stops on line 7.
    let missing_comma = QWEN2_5_0_5B.replacen(r#""silu","#, r#""silu""#, 1);
    assert_refused(&missing_comma, "Config", &["(json)", "line 7", "column 3"]);
    assert_refused(
        "[896]",
        "Config",
        &["(json)", "expected a JSON object", "[896]"],
    );
    assert_refused("", "Config", &["(json)", "EOF"]);
}

#[test]
fn load_config_reads_the_directory_and_names_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let error = load_config(dir.path()).unwrap_err();
    assert!(matches!(error, Error::Io { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains(&dir.path().join("config.json").display().to_string()),
        "{message}"
    );

    std::fs::write(dir.path().join("config.json"), QWEN2_5_0_5B).unwrap();
    assert_eq!(
        load_config(dir.path()).unwrap(),
        parse(QWEN2_5_0_5B).unwrap()
    );
    std::fs::write(dir.path().join("config.json"), "{").unwrap();
    let message = load_config(dir.path()).unwrap_err().to_string();
    assert!(
        message.contains("config.json") && message.contains("(json)"),
        "{message}"
    );
}

mod limits;
