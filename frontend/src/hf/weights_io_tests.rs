//! Tests of `weights_io`: save → load round trips (bit-exact in f32, rounded once in bf16), a
//! sharded directory loading like a single file, and every refusal naming the tensor or file.

use std::fs;

use half::bf16;
use kiln_kernels::testing::rng;
use rand::Rng;

use super::*;
use crate::hf::safetensors_io::write_safetensors;
use crate::model::Family;

// --- helpers (shared with the shard tests) ---

/// Qwen2-like: grouped-query attention, q/k/v biases, untied head.
pub(super) fn qwen2_like() -> ModelConfig {
    ModelConfig {
        family: Family::Qwen2,
        hidden_size: 8,
        intermediate_size: 12,
        num_hidden_layers: 2,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 4,
        vocab_size: 11,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        tie_word_embeddings: false,
        qkv_bias: true,
        o_bias: false,
        mlp_bias: false,
        max_position_embeddings: 32,
    }
}

/// Llama-like with a tied head, and o_proj and MLP biases (every optional parameter but q/k/v
/// biases).
pub(super) fn llama_tied() -> ModelConfig {
    ModelConfig {
        family: Family::Llama,
        num_key_value_heads: 2,
        tie_word_embeddings: true,
        qkv_bias: false,
        o_bias: true,
        mlp_bias: true,
        ..qwen2_like()
    }
}

/// Fresh random f32 weights.
pub(super) fn random(config: &ModelConfig, test: &str) -> ModelWeights<Var> {
    let mut rng = rng(test);
    ModelWeights::build(config, |_, dims| {
        let values = (0..dims.iter().product()).map(|_| rng.random_range(-1.0..1.0f32));
        Var::leaf(Tensor::from_vec(values.collect(), dims)?)
    })
    .unwrap()
}

pub(super) fn named_tensors(weights: &ModelWeights<Var>) -> Vec<(String, Tensor)> {
    let named = weights.named().into_iter();
    named.map(|(n, v)| (n, v.value().clone())).collect()
}

/// Every parameter's name and f32 bit patterns.
pub(super) fn f32_bits(weights: &ModelWeights<Var>) -> Vec<(String, Vec<u32>)> {
    let bits = |v: &Var| {
        v.value()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    weights
        .named()
        .into_iter()
        .map(|(n, v)| (n, bits(v)))
        .collect()
}

/// Writes `tensors` as the directory's single weights file, in place of one an earlier case
/// wrote (kiln's writer never replaces a file).
pub(super) fn write_single(dir: &Path, tensors: &[(String, Tensor)]) {
    let path = dir.join(WEIGHTS_FILE);
    if path.exists() {
        fs::remove_file(&path).unwrap();
    }
    write_safetensors(&path, tensors, None).unwrap();
}

/// An f32 tensor of zeros.
pub(super) fn zeros(dims: impl Into<kiln_ir::Shape>) -> Tensor {
    Tensor::zeros(dims, DType::F32, kiln_runtime::Device::Cpu)
}

pub(super) fn replace(tensors: &mut [(String, Tensor)], name: &str, tensor: Tensor) {
    let slot = tensors.iter_mut().find(|(n, _)| n == name).unwrap();
    slot.1 = tensor;
}

pub(super) fn assert_contains(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            message.contains(part),
            "`{message}` should contain `{part}`"
        );
    }
}

// --- round trips ---

#[test]
fn f32_save_and_load_round_trip_bit_exact() {
    for (config, test) in [
        (qwen2_like(), "f32_round_trip_qwen2"),
        (llama_tied(), "f32_round_trip_llama_tied"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let weights = random(&config, test);
        save_weights(dir.path(), &weights, DType::F32).unwrap();

        let file = SafetensorsFile::open(&dir.path().join(WEIGHTS_FILE)).unwrap();
        assert_eq!(
            file.metadata().get("format").map(String::as_str),
            Some("pt")
        );
        let mut expected: Vec<String> = parameter_shapes(&config)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        expected.sort();
        assert_eq!(
            file.names(),
            expected,
            "tied models carry no lm_head.weight"
        );

        let loaded = load_weights(dir.path(), &config, DType::F32)
            .unwrap()
            .weights;
        assert_eq!(f32_bits(&loaded), f32_bits(&weights));
        assert_eq!(loaded.lm_head.is_some(), !config.tie_word_embeddings);
        assert!(loaded
            .named()
            .iter()
            .all(|(_, v)| v.is_leaf() && v.requires_grad()));

        let wide = load_weights(dir.path(), &config, DType::F64)
            .unwrap()
            .weights;
        for ((name, a), (_, b)) in wide.named().into_iter().zip(weights.named()) {
            assert_eq!(a.dtype(), DType::F64, "{name}");
            assert_eq!(
                a.value().to_f64_vec().unwrap(),
                b.value().to_f64_vec().unwrap(),
                "{name}"
            );
        }
    }
}

#[test]
fn bf16_save_rounds_each_value_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen2_like();
    let weights = random(&config, "bf16_save_rounds_each_value_once");
    save_weights(dir.path(), &weights, DType::BF16).unwrap();
    let file = SafetensorsFile::open(&dir.path().join(WEIGHTS_FILE)).unwrap();
    assert_eq!(
        file.info("model.norm.weight"),
        Some((safetensors::Dtype::BF16, vec![8]))
    );

    let loaded = load_weights(dir.path(), &config, DType::F32)
        .unwrap()
        .weights;
    for ((name, got), (_, original)) in loaded.named().into_iter().zip(weights.named()) {
        let rounded: Vec<f32> = original
            .value()
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(|x| bf16::from_f32(x).to_f32())
            .collect();
        assert_eq!(got.value().to_vec::<f32>().unwrap(), rounded, "{name}");
    }
}

#[test]
fn saving_creates_the_directory_and_never_replaces_earlier_weights() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("new").join("model");
    let config = llama_tied();
    let first = random(&config, "saving_never_replaces_earlier_weights_1");
    save_weights(&dir, &first, DType::F32).unwrap();
    let before = fs::read(dir.join(WEIGHTS_FILE)).unwrap();
    let second = random(&config, "saving_never_replaces_earlier_weights_2");
    let err = save_weights(&dir, &second, DType::F16).unwrap_err();
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &[
            &dir.join(WEIGHTS_FILE).display().to_string(),
            "already exists",
        ],
    );
    assert_eq!(fs::read(dir.join(WEIGHTS_FILE)).unwrap(), before);
    assert_eq!(
        f32_bits(&load_weights(&dir, &config, DType::F32).unwrap().weights),
        f32_bits(&first)
    );
    let names: Vec<_> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [WEIGHTS_FILE], "no temporary file left");
}

/// Writes the weights as two shards and an index, returning the shard names.
pub(super) fn write_sharded(dir: &Path, tensors: &[(String, Tensor)]) -> [String; 2] {
    let shards = [
        "model-00001-of-00002.safetensors".to_string(),
        "model-00002-of-00002.safetensors".to_string(),
    ];
    let (first, second) = tensors.split_at(tensors.len() / 2);
    write_safetensors(&dir.join(&shards[0]), first, None).unwrap();
    write_safetensors(&dir.join(&shards[1]), second, None).unwrap();
    let weight_map: BTreeMap<&str, &str> = first
        .iter()
        .map(|(n, _)| (n.as_str(), shards[0].as_str()))
        .chain(second.iter().map(|(n, _)| (n.as_str(), shards[1].as_str())))
        .collect();
    let index = serde_json::json!({"metadata": {"total_size": 1234}, "weight_map": weight_map});
    fs::write(dir.join(WEIGHTS_INDEX_FILE), index.to_string()).unwrap();
    shards
}

#[test]
fn a_sharded_directory_loads_like_a_single_file() {
    for (config, test) in [
        (qwen2_like(), "sharded_qwen2"),
        (llama_tied(), "sharded_llama_tied"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let weights = random(&config, test);
        write_sharded(dir.path(), &named_tensors(&weights));
        let loaded = load_weights(dir.path(), &config, DType::F32)
            .unwrap()
            .weights;
        assert_eq!(f32_bits(&loaded), f32_bits(&weights));
    }
}

// --- refusals of the set of tensors ---

/// The error loading `dir` for `config` gives.
pub(super) fn load_error(dir: &Path, config: &ModelConfig) -> Error {
    match load_weights(dir, config, DType::F32) {
        Err(e) => e,
        Ok(_) => panic!("loading should have failed"),
    }
}

#[test]
fn a_directory_without_weights_names_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let err = load_error(dir.path(), &qwen2_like());
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &[
            &dir.path().display().to_string(),
            WEIGHTS_FILE,
            WEIGHTS_INDEX_FILE,
        ],
    );
}

#[test]
fn a_missing_tensor_is_named_with_its_shape() {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen2_like();
    let mut tensors = named_tensors(&random(&config, "a_missing_tensor_is_named_with_its_shape"));
    tensors.retain(|(n, _)| n != "model.layers.1.mlp.up_proj.weight");
    tensors.push((
        "model.unused.weight".into(),
        Tensor::from_vec(vec![0f32], [1]).unwrap(),
    ));
    write_single(dir.path(), &tensors);
    let err = load_error(dir.path(), &config);
    assert!(
        matches!(err, Error::MissingTensor { .. }),
        "missing wins over unexpected: {err:?}"
    );
    assert_contains(
        &err.to_string(),
        &[
            WEIGHTS_FILE,
            "missing tensor `model.layers.1.mlp.up_proj.weight`",
            "[12,8]",
        ],
    );

    // An untied model must have its head.
    tensors.retain(|(n, _)| n != "model.unused.weight");
    tensors.push(("model.layers.1.mlp.up_proj.weight".into(), zeros([12, 8])));
    tensors.retain(|(n, _)| n != "lm_head.weight");
    write_single(dir.path(), &tensors);
    let err = load_error(dir.path(), &config);
    assert!(matches!(err, Error::MissingTensor { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &["missing tensor `lm_head.weight`", "[11,8]"],
    );
}

#[test]
fn unexpected_tensors_are_reported_in_name_order() {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen2_like();
    let mut tensors = named_tensors(&random(
        &config,
        "unexpected_tensors_are_reported_in_name_order",
    ));
    for name in ["model.zzz.weight", "model.layers.0.aaa.weight"] {
        tensors.push((name.into(), Tensor::from_vec(vec![1f32], [1]).unwrap()));
    }
    write_single(dir.path(), &tensors);
    let err = load_error(dir.path(), &config);
    assert!(matches!(err, Error::UnexpectedTensor { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &[
            WEIGHTS_FILE,
            "unexpected tensor `model.layers.0.aaa.weight`",
        ],
    );
}

#[test]
fn a_wrong_shape_or_an_integer_dtype_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen2_like();
    let mut tensors = named_tensors(&random(
        &config,
        "a_wrong_shape_or_an_integer_dtype_is_refused",
    ));
    let good = tensors.clone();
    replace(
        &mut tensors,
        "model.layers.0.self_attn.k_proj.bias",
        zeros([8]),
    );
    write_single(dir.path(), &tensors);
    let err = load_error(dir.path(), &config);
    assert!(matches!(err, Error::TensorShape { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &[
            WEIGHTS_FILE,
            "`model.layers.0.self_attn.k_proj.bias` has shape [8], expected [4]",
        ],
    );

    let mut tensors = good;
    replace(
        &mut tensors,
        "model.norm.weight",
        Tensor::from_vec(vec![1i32; 8], [8]).unwrap(),
    );
    write_single(dir.path(), &tensors);
    let err = load_error(dir.path(), &config);
    assert!(matches!(err, Error::TensorDType { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &["`model.norm.weight` has dtype I32, expected a float dtype"],
    );
}

#[test]
fn non_float_dtypes_are_refused_for_loading_and_saving() {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen2_like();
    let weights = random(&config, "non_float_dtypes_are_refused");
    let err = save_weights(dir.path(), &weights, DType::I64).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert_contains(&err.to_string(), &["dtype = i64"]);
    assert!(!dir.path().join(WEIGHTS_FILE).exists());

    save_weights(dir.path(), &weights, DType::F32).unwrap();
    let err = load_weights(dir.path(), &config, DType::I64).unwrap_err();
    assert!(matches!(err, Error::Unsupported { .. }), "{err:?}");
    assert_contains(&err.to_string(), &["dtype = i64", "f32, f64 or bf16"]);
    // bf16 inference loads bf16 leaves (rounded once from the f32 file).
    let bf16 = load_weights(dir.path(), &config, DType::BF16).unwrap();
    assert!(bf16
        .weights
        .named()
        .iter()
        .all(|(_, v)| v.dtype() == DType::BF16));
}
