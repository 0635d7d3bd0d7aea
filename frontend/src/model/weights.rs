//! Model parameters under their Hugging Face names.

use std::collections::BTreeMap;

use half::{bf16, f16};
use kiln_ir::{DType, Shape};
use kiln_kernels::Buffer;
use kiln_runtime::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::autograd::Var;
use crate::error::{Error, Result};
use crate::model::config::ModelConfig;

/// Parameters of one decoder layer.
#[derive(Clone, Debug)]
pub struct LayerWeights<V> {
    pub input_layernorm: V,
    pub q_proj: V,
    pub q_bias: Option<V>,
    pub k_proj: V,
    pub k_bias: Option<V>,
    pub v_proj: V,
    pub v_bias: Option<V>,
    pub o_proj: V,
    pub o_bias: Option<V>,
    pub post_attention_layernorm: V,
    pub gate_proj: V,
    pub gate_bias: Option<V>,
    pub up_proj: V,
    pub up_bias: Option<V>,
    pub down_proj: V,
    pub down_bias: Option<V>,
}

/// All parameters of a model. `lm_head` is `None` when tied to `embed_tokens`.
#[derive(Clone, Debug)]
pub struct ModelWeights<V> {
    pub embed_tokens: V,
    pub layers: Vec<LayerWeights<V>>,
    pub norm: V,
    pub lm_head: Option<V>,
}

/// The shape of every parameter, in Hugging Face naming order.
pub fn parameter_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let (h, i, v) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
    );
    let q = config.num_attention_heads * config.head_dim;
    let kv = config.num_key_value_heads * config.head_dim;
    let mut shapes = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for layer in 0..config.num_hidden_layers {
        let p = |name: &str| format!("model.layers.{layer}.{name}");
        shapes.push((p("input_layernorm.weight"), vec![h]));
        for (proj, out, bias) in [
            ("q_proj", q, config.qkv_bias),
            ("k_proj", kv, config.qkv_bias),
            ("v_proj", kv, config.qkv_bias),
            ("o_proj", h, config.o_bias),
        ] {
            shapes.push((
                p(&format!("self_attn.{proj}.weight")),
                vec![out, if proj == "o_proj" { q } else { h }],
            ));
            if bias {
                shapes.push((p(&format!("self_attn.{proj}.bias")), vec![out]));
            }
        }
        shapes.push((p("post_attention_layernorm.weight"), vec![h]));
        for (proj, out, inp) in [("gate_proj", i, h), ("up_proj", i, h), ("down_proj", h, i)] {
            shapes.push((p(&format!("mlp.{proj}.weight")), vec![out, inp]));
            if config.mlp_bias {
                shapes.push((p(&format!("mlp.{proj}.bias")), vec![out]));
            }
        }
    }
    shapes.push(("model.norm.weight".to_string(), vec![h]));
    if !config.tie_word_embeddings {
        shapes.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    shapes
}

impl<V> ModelWeights<V> {
    /// Every parameter with its Hugging Face name, in [`parameter_shapes`] order.
    pub fn named(&self) -> Vec<(String, &V)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), &self.embed_tokens)];
        for (index, layer) in self.layers.iter().enumerate() {
            let p = |name: &str| format!("model.layers.{index}.{name}");
            out.push((p("input_layernorm.weight"), &layer.input_layernorm));
            for (proj, weight, bias) in [
                ("q_proj", &layer.q_proj, &layer.q_bias),
                ("k_proj", &layer.k_proj, &layer.k_bias),
                ("v_proj", &layer.v_proj, &layer.v_bias),
                ("o_proj", &layer.o_proj, &layer.o_bias),
            ] {
                out.push((p(&format!("self_attn.{proj}.weight")), weight));
                if let Some(bias) = bias {
                    out.push((p(&format!("self_attn.{proj}.bias")), bias));
                }
            }
            out.push((
                p("post_attention_layernorm.weight"),
                &layer.post_attention_layernorm,
            ));
            for (proj, weight, bias) in [
                ("gate_proj", &layer.gate_proj, &layer.gate_bias),
                ("up_proj", &layer.up_proj, &layer.up_bias),
                ("down_proj", &layer.down_proj, &layer.down_bias),
            ] {
                out.push((p(&format!("mlp.{proj}.weight")), weight));
                if let Some(bias) = bias {
                    out.push((p(&format!("mlp.{proj}.bias")), bias));
                }
            }
        }
        out.push(("model.norm.weight".to_string(), &self.norm));
        if let Some(head) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), head));
        }
        out
    }

    /// Builds the weights from a function that gives the value of each named parameter, called
    /// in [`parameter_shapes`] order.
    pub fn build(
        config: &ModelConfig,
        mut make: impl FnMut(&str, &[usize]) -> Result<V>,
    ) -> Result<Self> {
        let shapes = parameter_shapes(config);
        let mut values = std::collections::BTreeMap::new();
        for (name, dims) in &shapes {
            values.insert(name.clone(), make(name, dims)?);
        }
        let mut take = |name: String| values.remove(&name);
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for layer in 0..config.num_hidden_layers {
            let mut p = |name: &str| take(format!("model.layers.{layer}.{name}"));
            layers.push(LayerWeights {
                input_layernorm: required(p("input_layernorm.weight")),
                q_proj: required(p("self_attn.q_proj.weight")),
                q_bias: p("self_attn.q_proj.bias"),
                k_proj: required(p("self_attn.k_proj.weight")),
                k_bias: p("self_attn.k_proj.bias"),
                v_proj: required(p("self_attn.v_proj.weight")),
                v_bias: p("self_attn.v_proj.bias"),
                o_proj: required(p("self_attn.o_proj.weight")),
                o_bias: p("self_attn.o_proj.bias"),
                post_attention_layernorm: required(p("post_attention_layernorm.weight")),
                gate_proj: required(p("mlp.gate_proj.weight")),
                gate_bias: p("mlp.gate_proj.bias"),
                up_proj: required(p("mlp.up_proj.weight")),
                up_bias: p("mlp.up_proj.bias"),
                down_proj: required(p("mlp.down_proj.weight")),
                down_bias: p("mlp.down_proj.bias"),
            });
        }
        Ok(ModelWeights {
            embed_tokens: required(take("model.embed_tokens.weight".into())),
            layers,
            norm: required(take("model.norm.weight".into())),
            lm_head: take("lm_head.weight".into()),
        })
    }
}

/// `parameter_shapes` lists every required name, and `build` made a value for each.
fn required<V>(value: Option<V>) -> V {
    value.unwrap_or_else(|| unreachable!("parameter_shapes lists every required parameter"))
}

/// Rank `rank`'s part of the whole model's parameter `name` (`tensor`) under `ranks`-way
/// tensor parallelism ([`ModelConfig::shard`]): the rank's rows of q/k/v, gate and up (and
/// their biases: column-parallel), its columns of o_proj and down_proj (row-parallel), and
/// every other parameter whole. The rows of a projection into heads are head after head, so
/// rank `r` of `n` holds heads `r·H/n .. (r+1)·H/n`.
pub fn shard_parameter(name: &str, tensor: &Tensor, ranks: usize, rank: usize) -> Result<Tensor> {
    match shard_part(name, tensor.dims(), ranks, rank)? {
        Some((axis, start, end)) => Ok(tensor.slice(axis, start, end, 1)?.contiguous()?),
        None => Ok(tensor.clone()),
    }
}

/// The part of parameter `name` of `dims` that rank `rank` of `ranks` holds, as (dim, start,
/// end), or `None` where every rank holds it whole (see [`shard_parameter`]); an error where
/// the dim does not split evenly.
pub fn shard_part(
    name: &str,
    dims: &[usize],
    ranks: usize,
    rank: usize,
) -> Result<Option<(usize, usize, usize)>> {
    let column_parallel = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"];
    let row_parallel = ["o_proj", "down_proj"];
    let projection = name.rsplit('.').nth(1).unwrap_or("");
    let axis = if column_parallel.contains(&projection) {
        0
    } else if row_parallel.contains(&projection) && name.ends_with(".weight") {
        1
    } else {
        return Ok(None);
    };
    let length = dims.get(axis).copied().unwrap_or(0);
    if ranks == 0 || rank >= ranks || length % ranks != 0 {
        return Err(Error::Operand {
            op: "shard_parameter",
            reason: format!(
                "`{name}` {} cannot give rank {rank} of {ranks} an equal part of dim {axis}",
                Shape::from(dims)
            ),
        });
    }
    let part = length / ranks;
    Ok(Some((axis, rank * part, (rank + 1) * part)))
}

/// Rank `rank`'s weights of the whole model's `weights` under `ranks`-way tensor parallelism:
/// each parameter's part ([`shard_parameter`]), shaped as `config.shard(ranks)` has them.
pub fn shard_weights(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    ranks: usize,
    rank: usize,
) -> Result<ModelWeights<Var>> {
    let parts: BTreeMap<String, Tensor> = (weights.named().into_iter())
        .map(|(name, var)| {
            Ok((
                name.clone(),
                shard_parameter(&name, var.value(), ranks, rank)?,
            ))
        })
        .collect::<Result<_>>()?;
    let shard = sharded_config(config, ranks)?;
    ModelWeights::build(&shard, |name, dims| match parts.get(name) {
        Some(tensor) if tensor.dims() == dims => Var::leaf(tensor.clone()),
        found => Err(Error::Operand {
            op: "shard_weights",
            reason: format!(
                "rank {rank}'s `{name}` should be {} (found {:?})",
                Shape::from(dims),
                found.map(|t| t.dims().to_vec())
            ),
        }),
    })
}

/// `config.shard(ranks)`, its refusal an error of the op that needs it.
pub fn sharded_config(config: &ModelConfig, ranks: usize) -> Result<ModelConfig> {
    config.shard(ranks).map_err(|reason| Error::Operand {
        op: "shard_weights",
        reason: format!("{ranks} tensor-parallel ranks: {reason}"),
    })
}

/// Seeded random parameters in Hugging Face naming order, each generated in f32 and rounded to
/// `dtype`: projections and embeddings uniform with standard deviation 0.02 (Hugging Face's
/// initializer range), biases small, norm weights near 1 (not exactly 1, so tests see the
/// weight's effect). Values depend only on the config and the seed; `progress` is called once
/// per parameter.
pub fn random_parameters(
    config: &ModelConfig,
    seed: u64,
    dtype: DType,
    mut progress: impl FnMut(&str),
) -> Result<Vec<(String, Tensor)>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = Vec::new();
    for (name, dims) in parameter_shapes(config) {
        let numel: usize = dims.iter().product();
        let is_norm = name.ends_with("layernorm.weight") || name == "model.norm.weight";
        let (center, half_width) = if is_norm {
            (1.0, 0.1)
        } else if name.ends_with(".bias") {
            (0.0, 0.05)
        } else {
            // Uniform on [-a, a] has standard deviation a/sqrt(3).
            (0.0, 0.02 * 3f64.sqrt())
        };
        let mut draw = || (center + rng.random_range(-half_width..half_width)) as f32;
        let buffer = match dtype {
            DType::F32 => Buffer::F32((0..numel).map(|_| draw()).collect()),
            DType::F64 => Buffer::F64((0..numel).map(|_| f64::from(draw())).collect()),
            DType::BF16 => Buffer::BF16((0..numel).map(|_| bf16::from_f32(draw())).collect()),
            DType::F16 => Buffer::F16((0..numel).map(|_| f16::from_f32(draw())).collect()),
            other => {
                return Err(Error::Operand {
                    op: "random_parameters",
                    reason: format!("parameters must be a float dtype, got {other}"),
                })
            }
        };
        progress(&name);
        out.push((name, Tensor::from_buffer(buffer, dims)?));
    }
    Ok(out)
}

/// Seeded random f32 parameters (see [`random_parameters`]) as leaves of the eager oracle.
pub fn random_weights(config: &ModelConfig, seed: u64) -> Result<ModelWeights<Var>> {
    random_weights_as(config, seed, DType::F32)
}

/// [`random_weights`] stored in `dtype` (each value drawn in f32 and rounded once).
pub fn random_weights_as(
    config: &ModelConfig,
    seed: u64,
    dtype: DType,
) -> Result<ModelWeights<Var>> {
    let mut tensors = random_parameters(config, seed, dtype, |_| {})?.into_iter();
    ModelWeights::build(config, |_, _| {
        let (_, tensor) = tensors
            .next()
            .unwrap_or_else(|| unreachable!("one tensor per parameter, in the same order"));
        Var::leaf(tensor)
    })
}
