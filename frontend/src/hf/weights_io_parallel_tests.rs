//! Tests of a tensor-parallel rank's load (`load_weight_shard`): only its part of each split
//! projection, equal to that part of the whole model's load, from a single file and from
//! shards, in f32 and bf16; models that do not split are refused by name.

use super::tests::{named_tensors, qwen2_like, random, write_sharded, write_single};
use super::*;
use crate::model::shard_weights;

/// `qwen2_like` with as many KV heads as heads: two ranks can split it.
fn splittable() -> ModelConfig {
    ModelConfig {
        num_key_value_heads: 2,
        ..qwen2_like()
    }
}

/// Names, dims and f32 bits (bf16 widened exactly) of every parameter.
fn contents(weights: &ModelWeights<Var>) -> Vec<(String, Vec<usize>, Vec<u32>)> {
    (named_tensors(weights).into_iter())
        .map(|(name, t)| {
            let wide = t.cast_to(DType::F32).unwrap().to_vec::<f32>().unwrap();
            (
                name,
                t.dims().to_vec(),
                wide.iter().map(|x| x.to_bits()).collect(),
            )
        })
        .collect()
}

#[test]
fn a_ranks_load_is_its_part_of_the_whole_load() {
    let config = splittable();
    let tensors = named_tensors(&random(&config, "a_ranks_load_is_its_part"));
    for sharded_files in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        match sharded_files {
            true => drop(write_sharded(dir.path(), &tensors)),
            false => write_single(dir.path(), &tensors),
        }
        for dtype in [DType::F32, DType::BF16] {
            let whole = load_weights(dir.path(), &config, dtype).unwrap().weights;
            for ranks in [1, 2] {
                for rank in 0..ranks {
                    let what =
                        format!("files sharded {sharded_files}, {dtype}, rank {rank} of {ranks}");
                    let got = load_weight_shard(dir.path(), &config, dtype, Some((rank, ranks)))
                        .unwrap()
                        .weights;
                    let want = shard_weights(&config, &whole, ranks, rank).unwrap();
                    assert_eq!(contents(&got), contents(&want), "{what}");
                    // The rank holds its heads' rows of q and its MLP columns of down.
                    let q = &got.layers[1].q_proj;
                    assert_eq!(q.dims(), [8 / ranks, 8], "{what}");
                    assert_eq!(got.layers[0].down_proj.dims(), [8, 12 / ranks], "{what}");
                    assert_eq!(got.layers[0].input_layernorm.dims(), [8], "{what}");
                }
            }
        }
    }
}

#[test]
fn a_model_that_does_not_split_is_refused_by_name() {
    let cases = [
        // One KV head for two ranks.
        (
            qwen2_like(),
            "num_key_value_heads (1) does not split evenly over 2 ranks",
        ),
        // A row-parallel bias would be added by every rank.
        (
            ModelConfig {
                o_bias: true,
                ..splittable()
            },
            "o_proj and MLP biases are not split",
        ),
    ];
    for (config, reason) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_single(
            dir.path(),
            &named_tensors(&random(&config, "does_not_split")),
        );
        let Err(err) = load_weight_shard(dir.path(), &config, DType::F32, Some((0, 2))) else {
            panic!("{reason}: the load should have failed");
        };
        let message = err.to_string();
        assert!(message.contains(reason), "{message}");
        assert!(message.contains("2 tensor-parallel ranks"), "{message}");
    }
}
