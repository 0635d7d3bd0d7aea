//! The whole Transformer through the eager oracle in f64: every parameter's gradient of the
//! causal-LM loss against central finite differences (sampled coordinates), for a Qwen2-style
//! model (GQA, q/k/v biases, untied head) and a Llama-style one (MHA, tied embeddings, biases
//! everywhere), batch 2.

use kiln_frontend::model::{
    causal_lm_loss, forward, shifted_targets, Eager, Family, ModelConfig, ModelWeights,
};
use kiln_frontend::Var;
use kiln_kernels::testing;
use kiln_runtime::Tensor;
use rand::Rng;

fn small(family: Family) -> ModelConfig {
    let qwen = family == Family::Qwen2;
    ModelConfig {
        family,
        hidden_size: 12,
        intermediate_size: 20,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: if qwen { 2 } else { 4 },
        head_dim: 6,
        vocab_size: 11,
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        tie_word_embeddings: !qwen,
        qkv_bias: true,
        o_bias: !qwen,
        mlp_bias: !qwen,
        max_position_embeddings: 32,
    }
}

fn loss_of(
    config: &ModelConfig,
    params: &[(String, Vec<usize>, Vec<f64>)],
    tokens: &[i64],
    batch: usize,
    seq: usize,
) -> (Var, ModelWeights<Var>) {
    let mut values = params.iter();
    let weights = ModelWeights::build(config, |_, dims| {
        let (_, _, v) = values.next().expect("one value per parameter");
        Var::leaf(Tensor::from_vec(v.clone(), dims).unwrap())
    })
    .unwrap();
    let tokens_t = Var::constant(Tensor::from_vec(tokens.to_vec(), [batch, seq]).unwrap());
    let positions: Vec<i64> = (0..batch * seq).map(|i| (i % seq) as i64).collect();
    let positions = Var::constant(Tensor::from_vec(positions, [batch, seq]).unwrap());
    let targets = Var::constant(
        Tensor::from_vec(shifted_targets(tokens, batch, seq), [batch * seq]).unwrap(),
    );
    let logits = forward(&Eager::F32, config, &weights, &tokens_t, &positions).unwrap();
    (
        causal_lm_loss(&Eager::F32, &logits, &targets).unwrap(),
        weights,
    )
}

fn check(family: Family) {
    let mut rng = testing::rng(&format!("model_gradcheck {family:?}"));
    let config = small(family);
    let (batch, seq) = (2, 5);
    let params: Vec<(String, Vec<usize>, Vec<f64>)> =
        kiln_frontend::model::parameter_shapes(&config)
            .into_iter()
            .map(|(name, dims)| {
                let n = dims.iter().product();
                let values = if name.contains("norm") {
                    testing::uniform(&mut rng, n, 0.5, 1.5)
                } else {
                    testing::uniform(&mut rng, n, -0.5, 0.5)
                };
                (name, dims, values)
            })
            .collect();
    let tokens = testing::indices(&mut rng, batch * seq, config.vocab_size);
    let (loss, weights) = loss_of(&config, &params, &tokens, batch, seq);
    loss.backward().unwrap();
    let base = loss.value().to_f64_vec().unwrap()[0];
    assert!(base.is_finite() && base > 0.0);
    for ((name, param), (_, _, values)) in weights.named().into_iter().zip(&params) {
        let grad = param
            .grad()
            .unwrap_or_else(|| panic!("{name}: no gradient"))
            .to_f64_vec()
            .unwrap();
        for _ in 0..3 {
            let at = rng.random_range(0..values.len());
            let h = 1e-6;
            let probe = |delta: f64| {
                let mut moved = params.clone();
                let index = moved.iter().position(|(n, _, _)| n == &name).unwrap();
                moved[index].2[at] += delta;
                loss_of(&config, &moved, &tokens, batch, seq)
                    .0
                    .value()
                    .to_f64_vec()
                    .unwrap()[0]
            };
            let numeric = (probe(h) - probe(-h)) / (2.0 * h);
            let ok = (grad[at] - numeric).abs() <= 1e-8 + 1e-5 * numeric.abs();
            assert!(
                ok,
                "{family:?} {name}[{at}]: tape {} vs finite difference {numeric}",
                grad[at]
            );
        }
    }
}

#[test]
fn qwen2_style_gradients_match_finite_differences() {
    check(Family::Qwen2);
}

#[test]
fn llama_style_tied_gradients_match_finite_differences() {
    check(Family::Llama);
}
