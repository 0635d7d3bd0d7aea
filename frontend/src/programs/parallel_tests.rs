//! Several ranks without several GPUs: N simulated ranks run the rank programs through the
//! interpreter, each in its own thread, their `all_reduce` ops summing over a
//! [`kiln_runtime::collective::World`]; their results are compared with the single-rank
//! program's. This checks the sharding arithmetic — which slice each rank holds, what each
//! all-reduce sums — on fresh random weights and tokens.

use std::collections::BTreeMap;

use kiln_ir::{DType, Op};
use kiln_runtime::collective::{Communicator, World};
use kiln_runtime::{interpret, interpret_in, Tensor};
use rand::{Rng, SeedableRng};

use super::*;
use crate::eval::CausalLmInputs;
use crate::model::{random_parameters, shard_parameter, Family, Precision};

type Values = BTreeMap<String, Tensor>;

/// Runs `body(rank)` for every rank of a new world of `ranks` in its own thread; a rank that
/// fails tells the others, so none waits for it.
fn on_ranks<T: Send>(ranks: usize, body: impl Fn(&dyn Communicator) -> Result<T> + Sync) -> Vec<T> {
    let world = World::ranks(ranks).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (world.iter())
            .map(|rank| {
                let body = &body;
                s.spawn(move || {
                    let result = body(rank);
                    if let Err(e) = &result {
                        rank.abort(&e.to_string());
                    }
                    result
                })
            })
            .collect();
        (handles.into_iter().enumerate())
            .map(|(r, h)| {
                h.join()
                    .unwrap()
                    .unwrap_or_else(|e| panic!("rank {r}: {e}"))
            })
            .collect()
    })
}

fn parameters(config: &ModelConfig, seed: u64) -> Values {
    random_parameters(config, seed, DType::F32, |_| {})
        .unwrap()
        .into_iter()
        .collect()
}

fn count_ops(graph: &Graph, name: &str) -> usize {
    (graph.node_indices())
        .filter(|&n| matches!(graph.node(n), Some(node) if matches!(&node.kind, kiln_ir::graph::NodeKind::Op(op) if op.name() == name)))
        .count()
}

#[track_caller]
fn assert_close(what: &str, got: &Tensor, want: &Tensor, tolerance: f64) {
    assert_eq!(got.dims(), want.dims(), "{what}");
    let (got, want) = (got.to_f64_vec().unwrap(), want.to_f64_vec().unwrap());
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let error = (g - w).abs() / scale;
        assert!(
            error <= tolerance,
            "{what}[{i}]: {g} vs {w} (error {error:.2e} of the largest)"
        );
    }
}

/// Qwen2's tiny model (GQA 4:2, q/k/v biases) on 2 ranks, and a Llama of 4 heads and 4 KV
/// heads (GQA 1, tied head) on 4: each rank one KV head.
fn tensor_parallel_models() -> Vec<(ModelConfig, usize)> {
    let llama = ModelConfig {
        num_attention_heads: 4,
        num_key_value_heads: 4,
        head_dim: 12,
        ..ModelConfig::tiny_llama()
    };
    assert_eq!(llama.family, Family::Llama);
    vec![(ModelConfig::tiny(), 2), (llama, 4)]
}

#[test]
fn tensor_parallel_ranks_prefill_and_decode_the_whole_models_logits() {
    for (config, ranks) in tensor_parallel_models() {
        for fusion in [true, false] {
            let (batch, seq, steps) = (2, 5, 3);
            let options = ProgramOptions {
                batch,
                seq,
                max_seq: Some(seq + steps),
                fusion,
                ..ProgramOptions::default()
            };
            let sharded = ProgramOptions {
                tensor_parallel: Some(ranks),
                ..options.clone()
            };
            let build_all = |options: &ProgramOptions| {
                [ProgramKind::Prefill, ProgramKind::Decode]
                    .map(|kind| build(kind, &config, options).unwrap())
            };
            let (whole, rank) = (build_all(&options), build_all(&sharded));
            // Two all-reduces per layer (after o_proj and after down_proj), none whole.
            for graph in &rank {
                assert_eq!(count_ops(graph, "all_reduce"), 2 * config.num_hidden_layers);
            }
            assert_eq!(count_ops(&whole[0], "all_reduce"), 0);

            let params = parameters(&config, 11);
            // The tokens of every step, drawn up front so each rank feeds the same ones.
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
            let mut draw = |n: usize| -> Vec<i64> {
                (0..n)
                    .map(|_| rng.random_range(0..config.vocab_size as i64))
                    .collect()
            };
            let prompt = draw(batch * seq);
            let decoded: Vec<Vec<i64>> = (0..steps).map(|_| draw(batch)).collect();
            let run = |graphs: &[Graph; 2], values: &mut Values, comm: &dyn Communicator| {
                let mut logits = Vec::new();
                let mut inputs =
                    example_inputs(&graphs[0], &config, ProgramKind::Prefill, &options, 0, 1)?;
                inputs.insert(
                    "tokens".into(),
                    Tensor::from_vec(prompt.clone(), [batch, seq])?,
                );
                values.extend(inputs);
                logits.push(interpret_in(&graphs[0], values, comm)?["logits"].clone());
                for (step, tokens) in decoded.iter().enumerate() {
                    let position = seq + step;
                    let inputs = example_inputs(
                        &graphs[1],
                        &config,
                        ProgramKind::Decode,
                        &options,
                        position,
                        1,
                    )?;
                    // The caches the prefill wrote stay; the rest is this step's.
                    values.extend(inputs.into_iter().filter(|(n, _)| !n.starts_with("cache.")));
                    values.insert(
                        "tokens".into(),
                        Tensor::from_vec(tokens.clone(), [batch, 1])?,
                    );
                    logits.push(interpret_in(&graphs[1], values, comm)?["logits"].clone());
                }
                Ok(logits)
            };
            let mut values = params.clone();
            let want = run(&whole, &mut values, &kiln_runtime::collective::Solo).unwrap();
            let got = on_ranks(ranks, |comm| {
                let mut values: Values = (params.iter())
                    .map(|(name, t)| {
                        Ok((name.clone(), shard_parameter(name, t, ranks, comm.rank())?))
                    })
                    .collect::<Result<_>>()?;
                // The rank's own KV heads.
                let k_proj = &values["model.layers.0.self_attn.k_proj.weight"];
                assert_eq!(
                    k_proj.dims()[0],
                    config.num_key_value_heads / ranks * config.head_dim
                );
                run(&rank, &mut values, comm)
            });
            for (r, logits) in got.iter().enumerate() {
                for (step, (g, w)) in logits.iter().zip(&want).enumerate() {
                    let what = format!(
                        "{:?} fusion {fusion}, rank {r} of {ranks}, step {step}",
                        config.family
                    );
                    assert_close(&what, g, w, 2e-5);
                    // Every rank computes the same logits, bit for bit.
                    assert_eq!(
                        g.to_vec::<f32>().unwrap(),
                        got[0][step].to_vec::<f32>().unwrap()
                    );
                }
            }
        }
    }
}

/// Rank `r` of `ranks`' part of a `[ranks·B, T]` batch: its rows, as `kiln eval` makes the
/// inputs, and the loss seed `1/ranks`.
fn batch_of_rank(tokens: &[i64], (ranks, rows, seq): (usize, usize, usize), rank: usize) -> Values {
    let own = tokens[rank * rows * seq..(rank + 1) * rows * seq].to_vec();
    let inputs =
        CausalLmInputs::new(&Tensor::from_vec(own, [rows, seq]).unwrap(), usize::MAX).unwrap();
    let mut values: Values = (inputs.named().into_iter())
        .map(|(name, t)| (name.to_string(), t.clone()))
        .collect();
    values.insert(
        "loss_seed".into(),
        Tensor::scalar(1.0 / ranks as f64, DType::F32),
    );
    values
}

#[test]
fn data_parallel_ranks_take_the_combined_batchs_train_step() {
    let config = ModelConfig::tiny();
    let (ranks, rows, seq) = (2, 2, 6);
    for (precision, clip, bucket_bytes) in [
        (Precision::F32, None, 25 << 20),
        // Small buckets: many all-reduces, each over a few gradients.
        (Precision::F32, Some(0.05), 20_000),
        (Precision::Bf16Gemm, None, 20_000),
    ] {
        let options = ProgramOptions {
            batch: ranks * rows,
            seq,
            precision,
            clip_grad_norm: clip,
            ..ProgramOptions::default()
        };
        let rank_options = ProgramOptions {
            batch: rows,
            data_parallel: Some(DataParallel { bucket_bytes }),
            ..options.clone()
        };
        let whole = build(ProgramKind::Train, &config, &options).unwrap();
        let rank = build(ProgramKind::Train, &config, &rank_options).unwrap();
        let buckets = count_ops(&rank, "all_reduce");
        assert!(
            buckets >= if bucket_bytes < 1 << 20 { 3 } else { 1 },
            "{buckets} buckets"
        );

        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let tokens: Vec<i64> = (0..ranks * rows * seq)
            .map(|_| rng.random_range(0..config.vocab_size as i64))
            .collect();
        let start = {
            let mut values = parameters(&config, 23);
            let zeros =
                example_inputs(&whole, &config, ProgramKind::Train, &options, 0, 1).unwrap();
            values.extend(zeros);
            values
        };
        // In f32 two steps, so the second starts from moments the first summed. Mixed
        // precision takes one and compares the first moments (`0.1·g`) only: AdamW's first
        // update is `lr·sign(g)` for all but tiny `g`, so a gradient near 0 whose sign a bf16
        // rounding flips moves its weight by 2·lr, in f32 nothing comparable.
        let steps: i64 = if precision == Precision::F32 { 2 } else { 1 };
        let compared = |name: &str| match precision {
            Precision::F32 => name.starts_with("model.") || name.starts_with("adamw."),
            _ => name.starts_with("adamw.m."),
        };
        let two_steps =
            |graph: &Graph, batch: Values, comm: &dyn Communicator| -> Result<(Values, Vec<f32>)> {
                let mut values = start.clone();
                values.extend(batch);
                let mut losses = Vec::new();
                for step in 1..=steps {
                    values.insert(
                        "step".into(),
                        Tensor::from_vec(vec![step], kiln_ir::Shape::scalar())?,
                    );
                    let out = interpret_in(graph, &mut values, comm)?;
                    losses.push(out["loss"].to_vec::<f32>()?[0]);
                }
                Ok((values, losses))
            };
        let combined = batch_of_rank(&tokens, (1, ranks * rows, seq), 0);
        let (want, want_losses) =
            two_steps(&whole, combined, &kiln_runtime::collective::Solo).unwrap();
        let got = on_ranks(ranks, |comm| {
            two_steps(
                &rank,
                batch_of_rank(&tokens, (ranks, rows, seq), comm.rank()),
                comm,
            )
        });
        let what = format!("{precision:?}, clip {clip:?}, {buckets} buckets");
        // f32 sums in another order; in mixed precision such a difference may also flip the
        // bf16 rounding of a gradient entering a GEMM (2^-8 relative), and of an updated
        // weight in the second step. (loss, persistent values), relative to the largest.
        let (tolerance, states) = match precision {
            Precision::F32 => (1e-5, 1e-4),
            _ => (1e-3, 2e-2),
        };
        // The mean of the ranks' losses is the combined batch's (equal counts of targets).
        for step in 0..steps as usize {
            let mean = got.iter().map(|(_, l)| f64::from(l[step])).sum::<f64>() / ranks as f64;
            let want = f64::from(want_losses[step]);
            let error = (mean - want).abs() / want.abs();
            assert!(
                error <= tolerance,
                "{what}: step {step} loss {mean} vs {want}"
            );
        }
        for (name, value) in &want {
            if !compared(name) {
                continue;
            }
            for (r, (values, _)) in got.iter().enumerate() {
                assert_close(
                    &format!("{what}: rank {r} {name}"),
                    &values[name],
                    value,
                    states,
                );
                // The ranks stay identical, bit for bit: they applied the same sums.
                assert_eq!(
                    values[name].to_vec::<f32>().unwrap(),
                    got[0].0[name].to_vec::<f32>().unwrap()
                );
            }
        }
    }
}

#[test]
fn a_world_of_one_runs_the_parallel_programs_as_the_plain_ones() {
    // The all-reduces of a world of one are the identity: bit for bit the plain program.
    let config = ModelConfig::tiny();
    let options = ProgramOptions {
        batch: 2,
        seq: 5,
        ..ProgramOptions::default()
    };
    let plain = build(ProgramKind::Prefill, &config, &options).unwrap();
    let one = ProgramOptions {
        tensor_parallel: Some(1),
        ..options.clone()
    };
    let one = build(ProgramKind::Prefill, &config, &one).unwrap();
    let mut values = parameters(&config, 2);
    values.extend(example_inputs(&plain, &config, ProgramKind::Prefill, &options, 0, 9).unwrap());
    let want = interpret(&plain, &mut values.clone()).unwrap();
    let got = on_ranks(1, |comm| {
        interpret_in(&one, &mut values.clone(), comm).map_err(Into::into)
    });
    assert_eq!(
        got[0]["logits"].to_vec::<f32>().unwrap(),
        want["logits"].to_vec::<f32>().unwrap()
    );
}

#[test]
fn tensor_and_data_parallel_options_are_checked_before_building() {
    let config = ModelConfig::tiny();
    let refused = |kind, options: ProgramOptions, message: &str| {
        let error = build(kind, &config, &options).unwrap_err();
        assert_eq!(error.to_string(), message);
    };
    let tp = |ranks| ProgramOptions {
        tensor_parallel: Some(ranks),
        ..ProgramOptions::default()
    };
    refused(
        ProgramKind::Prefill,
        tp(3),
        "--tensor-parallel 3: the model's num_attention_heads (4) does not split evenly over 3 ranks",
    );
    refused(
        ProgramKind::Decode,
        tp(4),
        "--tensor-parallel 4: the model's num_key_value_heads (2) does not split evenly over 4 ranks",
    );
    refused(
        ProgramKind::Prefill,
        tp(0),
        "--tensor-parallel 0: must be at least 1",
    );
    refused(
        ProgramKind::Train,
        tp(2),
        "--tensor-parallel 2: tensor parallelism is for prefill, decode and eval without --grads; \
         train data-parallel",
    );
    let biased = ModelConfig {
        o_bias: true,
        intermediate_size: 96,
        ..ModelConfig::tiny_llama()
    };
    let error = build(ProgramKind::Prefill, &biased, &tp(3))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("o_proj and MLP biases are not split"),
        "{error}"
    );
    let dp = ProgramOptions {
        data_parallel: Some(DataParallel { bucket_bytes: 0 }),
        ..ProgramOptions::default()
    };
    refused(
        ProgramKind::Train,
        dp.clone(),
        "--data-parallel 0: buckets must hold at least 1 byte",
    );
    refused(
        ProgramKind::Decode,
        ProgramOptions {
            data_parallel: Some(DataParallel::default()),
            ..dp
        },
        "--data-parallel 26214400: data parallelism is for train steps; prefill and decode \
         split over ranks with --tensor-parallel",
    );
    // A gradient larger than the bucket gets one of its own.
    let dp = ProgramOptions {
        data_parallel: Some(DataParallel { bucket_bytes: 1 }),
        ..ProgramOptions::default()
    };
    let graph = build(ProgramKind::Train, &config, &dp).unwrap();
    let updates = count_ops(&graph, "adamw");
    assert_eq!(count_ops(&graph, "all_reduce"), updates);
    assert!(updates > 0 && Op::AllReduce.name() == "all_reduce");
}

#[test]
fn shards_of_a_parameter_put_back_together_are_the_parameter() {
    let config = ModelConfig::tiny();
    let params = parameters(&config, 4);
    for (name, whole) in &params {
        let parts: Vec<Tensor> = (0..2)
            .map(|r| shard_parameter(name, whole, 2, r).unwrap())
            .collect();
        let axis = match name.rsplit('.').nth(1).unwrap() {
            "q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj" => Some(0),
            "o_proj" | "down_proj" => Some(1),
            _ => None,
        };
        let whole_values = whole.to_vec::<f32>().unwrap();
        match axis {
            None => {
                for part in &parts {
                    assert_eq!(part.to_vec::<f32>().unwrap(), whole_values, "{name}");
                }
            }
            Some(axis) => {
                let dims = whole.dims();
                let (outer, inner) = match (axis, dims.len()) {
                    (0, _) => (1, whole.numel()),
                    _ => (dims[0], dims[1]),
                };
                // Concatenated along the axis, the parts give the whole back.
                let mut joined = Vec::new();
                for row in 0..outer {
                    for part in &parts {
                        let values = part.to_vec::<f32>().unwrap();
                        let width = values.len() / outer;
                        joined.extend_from_slice(&values[row * width..(row + 1) * width]);
                    }
                }
                assert_eq!(joined, whole_values, "{name}");
                assert_eq!(parts[0].numel() * 2, whole.numel());
                let _ = inner;
            }
        }
    }
    let error = shard_parameter(
        "model.layers.0.mlp.down_proj.weight",
        &params["model.layers.0.mlp.down_proj.weight"],
        3,
        0,
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("rank 0 of 3"), "{error}");
}
