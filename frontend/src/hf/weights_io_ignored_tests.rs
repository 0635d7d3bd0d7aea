//! Tests of what loading ignores on purpose, as transformers does: a tied model's stored head
//! of the embedding's shape, and the RoPE inverse frequencies old checkpoints carry (reported,
//! not silent). Anything else extra is still refused. And what loading warns about: weights
//! holding NaN or infinities.

use super::tests::{
    assert_contains, f32_bits, llama_tied, load_error, named_tensors, qwen2_like, random, replace,
    write_sharded, write_single, zeros,
};
use super::*;
use kiln_kernels::testing::rng;
use rand::Rng;

/// Each layer's `self_attn.rotary_emb.inv_freq` of `config`, with fresh random values.
fn rope_buffers(config: &ModelConfig, test: &str) -> Vec<(String, Tensor)> {
    let mut rng = rng(test);
    (0..config.num_hidden_layers)
        .map(|layer| {
            let values = (0..config.head_dim / 2).map(|_| rng.random_range(0.0..1.0f32));
            let tensor = Tensor::from_vec(values.collect(), [config.head_dim / 2]).unwrap();
            (
                format!("model.layers.{layer}.self_attn.rotary_emb.inv_freq"),
                tensor,
            )
        })
        .collect()
}

#[test]
fn a_tied_model_ignores_a_stored_head_of_the_embedding_shape_only() {
    let dir = tempfile::tempdir().unwrap();
    let config = llama_tied();
    let weights = random(&config, "a_tied_model_ignores_a_stored_head");
    let mut tensors = named_tensors(&weights);
    tensors.push(("lm_head.weight".into(), zeros([11, 8])));
    write_single(dir.path(), &tensors);
    let loaded = load_weights(dir.path(), &config, DType::F32)
        .unwrap()
        .weights;
    assert!(loaded.lm_head.is_none());
    assert_eq!(f32_bits(&loaded), f32_bits(&weights));

    replace(&mut tensors, "lm_head.weight", zeros([11, 9]));
    write_single(dir.path(), &tensors);
    let err = load_error(dir.path(), &config);
    assert!(matches!(err, Error::TensorShape { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &["tensor `lm_head.weight` has shape [11,9], expected [11,8]"],
    );
}

#[test]
fn rope_inverse_frequencies_of_old_checkpoints_are_ignored_and_named() {
    let test = "rope_inverse_frequencies_are_ignored";
    let config = qwen2_like();
    let weights = random(&config, test);
    let buffers = rope_buffers(&config, test);
    let names: Vec<String> = buffers.iter().map(|(n, _)| n.clone()).collect();
    let mut tensors = named_tensors(&weights);
    tensors.extend(buffers);

    let single = tempfile::tempdir().unwrap();
    write_single(single.path(), &tensors);
    let sharded = tempfile::tempdir().unwrap();
    write_sharded(sharded.path(), &tensors);
    for dir in [single.path(), sharded.path()] {
        let loaded = load_weights(dir, &config, DType::F32).unwrap();
        assert_eq!(f32_bits(&loaded.weights), f32_bits(&weights));
        assert_eq!(loaded.ignored, names);
        let note = loaded.note().unwrap();
        assert_contains(&note, &["transformers ignores too", &names[0], &names[1]]);
    }

    let plain = tempfile::tempdir().unwrap();
    write_single(plain.path(), &named_tensors(&weights));
    let loaded = load_weights(plain.path(), &config, DType::F32).unwrap();
    assert!(loaded.ignored.is_empty() && loaded.note().is_none());
}

#[test]
fn only_rope_buffers_of_existing_layers_are_ignored() {
    let test = "only_rope_buffers_of_existing_layers_are_ignored";
    let config = qwen2_like();
    let tensors = named_tensors(&random(&config, test));
    let (_, buffer) = rope_buffers(&config, test).remove(0);
    let beyond = format!(
        "model.layers.{}.self_attn.rotary_emb.inv_freq",
        config.num_hidden_layers
    );
    for name in [beyond.as_str(), "model.layers.0.mlp.rotary_emb.inv_freq"] {
        let mut extra = tensors.clone();
        extra.push((name.to_string(), buffer.clone()));
        let dir = tempfile::tempdir().unwrap();
        write_single(dir.path(), &extra);
        let err = load_error(dir.path(), &config);
        assert!(matches!(err, Error::UnexpectedTensor { .. }), "{err:?}");
        assert_contains(&err.to_string(), &[&format!("unexpected tensor `{name}`")]);
    }
}

#[test]
fn a_long_list_of_ignored_tensors_is_shortened() {
    let ignored: Vec<String> = (0..24)
        .map(|i| format!("model.layers.{i}.self_attn.rotary_emb.inv_freq"))
        .collect();
    let config = qwen2_like();
    let loaded = LoadedWeights {
        weights: random(&config, "a_long_list_of_ignored_tensors_is_shortened"),
        ignored: ignored.clone(),
        non_finite: Vec::new(),
    };
    let note = loaded.note().unwrap();
    assert_contains(
        &note,
        &[&format!(
            "{}, {}, ..., {} (24 in all)",
            ignored[0], ignored[1], ignored[23]
        )],
    );
}

#[test]
fn non_finite_weights_are_counted_and_named_in_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let config = qwen2_like();
    let weights = random(&config, "non_finite_weights_are_counted");
    let mut tensors = named_tensors(&weights);
    let mut rng = rng("non_finite_weights_are_counted: positions");
    let poisoned = |tensor: &Tensor, values: &[f32], rng: &mut rand::rngs::StdRng| {
        let mut all = tensor.to_vec::<f32>().unwrap();
        for &value in values {
            let at = rng.random_range(0..all.len());
            all[at] = value;
        }
        Tensor::from_vec(all, tensor.shape().clone()).unwrap()
    };
    for (name, tensor) in &mut tensors {
        match name.as_str() {
            "lm_head.weight" => *tensor = poisoned(tensor, &[f32::NAN], &mut rng),
            "model.norm.weight" => *tensor = poisoned(tensor, &[f32::INFINITY], &mut rng),
            _ => {}
        }
    }
    write_single(dir.path(), &tensors);
    // Read as f32 and as bf16 (the bits are counted in each dtype's own layout).
    for dtype in [DType::F32, DType::BF16] {
        let loaded = load_weights(dir.path(), &config, dtype).unwrap();
        let flagged: Vec<&str> = loaded.non_finite.iter().map(|(n, ..)| n.as_str()).collect();
        assert_eq!(flagged, ["model.norm.weight", "lm_head.weight"], "{dtype}");
        let warning = loaded.warning().unwrap();
        assert_contains(
            &warning,
            &[
                "lm_head.weight (1 NaN, 0 infinite)",
                "model.norm.weight (0 NaN, 1 infinite)",
            ],
        );
    }
    // Finite weights give no warning.
    let clean = tempfile::tempdir().unwrap();
    write_single(clean.path(), &named_tensors(&weights));
    let loaded = load_weights(clean.path(), &config, DType::F32).unwrap();
    assert!(loaded.non_finite.is_empty() && loaded.warning().is_none());
}
