//! bf16 inference (`Precision::Bf16`): weights and KV caches stored in bf16, activations in
//! f32, GEMM inputs rounded to bf16. The traced programs against the eager oracle in the same
//! precision (bit for bit where they compute the same ops), against f32, and the planned CPU
//! executor against the interpreter.

use std::collections::BTreeMap;

use kiln_frontend::eval::{evaluate, evaluate_interpreted};
use kiln_frontend::model::{
    forward, last_logits, random_weights_as, Eager, ModelConfig, ModelWeights, Precision,
};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::{DType, InputKind};
use kiln_kernels::testing;
use kiln_planner::{plan, PlanOptions};
use kiln_runtime::{execute, interpret, Device, Tensor};

const BF16: Eager = Eager {
    precision: Precision::Bf16,
};

fn configs() -> [ModelConfig; 2] {
    [ModelConfig::tiny(), ModelConfig::tiny_llama()]
}

fn bits(t: &Tensor) -> Vec<u64> {
    let values = t.to_f64_vec().unwrap();
    values.iter().map(|v| v.to_bits()).collect()
}

fn params(weights: &ModelWeights<Var>) -> BTreeMap<String, Tensor> {
    let named = weights.named().into_iter();
    named.map(|(name, v)| (name, v.value().clone())).collect()
}

fn ids(values: Vec<i64>, dims: &[usize]) -> Tensor {
    Tensor::from_vec(values, dims).unwrap()
}

fn constant(values: Vec<i64>, dims: &[usize]) -> Var {
    Var::constant(ids(values, dims))
}

/// Row-major positions `0..seq` of each of `batch` rows.
fn positions(batch: usize, seq: usize) -> Vec<i64> {
    (0..batch * seq).map(|i| (i % seq) as i64).collect()
}

#[test]
fn programs_store_weights_and_caches_in_bf16_and_refuse_training() {
    let config = ModelConfig::tiny();
    let options = ProgramOptions {
        precision: Precision::Bf16,
        ..Default::default()
    };
    let graph = build(ProgramKind::Decode, &config, &options).unwrap();
    kiln_ir::verify(&graph).unwrap();
    let mut stored = 0;
    for (_, name, kind, ty) in graph.inputs() {
        if matches!(kind, InputKind::Param | InputKind::State) {
            assert_eq!(ty.dtype, DType::BF16, "{name}");
            stored += 1;
        }
    }
    assert!(stored > config.num_hidden_layers * 2);
    for (kind, grads) in [(ProgramKind::Train, false), (ProgramKind::Eval, true)] {
        let options = ProgramOptions {
            grads,
            ..options.clone()
        };
        let error = build(kind, &config, &options).unwrap_err().to_string();
        assert!(
            error.contains("--precision bf16") && error.contains("inference"),
            "{error}"
        );
    }
}

#[test]
fn interpreted_eval_and_prefill_equal_the_bf16_oracle_bit_for_bit() {
    let mut rng = testing::rng("bf16_eval");
    for config in configs() {
        let seed = rand::Rng::random(&mut rng);
        let weights = random_weights_as(&config, seed, DType::BF16).unwrap();
        let (batch, seq) = (2, 7);
        let tokens = testing::indices(&mut rng, batch * seq, config.vocab_size);
        let oracle = evaluate(
            &config,
            &weights,
            &ids(tokens.clone(), &[batch, seq]),
            false,
            Precision::Bf16,
        )
        .unwrap();
        let interpreted = evaluate_interpreted(
            &config,
            &weights,
            &ids(tokens.clone(), &[batch, seq]),
            false,
            Precision::Bf16,
        )
        .unwrap();
        assert_eq!(oracle.logits.dtype(), DType::F32);
        assert_eq!(bits(&oracle.logits), bits(&interpreted.logits));
        assert_eq!(bits(&oracle.loss), bits(&interpreted.loss));

        let eager = last_logits(
            &BF16,
            &config,
            &weights,
            &constant(tokens.clone(), &[batch, seq]),
            &constant(positions(batch, seq), &[batch, seq]),
        )
        .unwrap();
        let options = ProgramOptions {
            batch,
            seq,
            precision: Precision::Bf16,
            ..Default::default()
        };
        let graph = build(ProgramKind::Prefill, &config, &options).unwrap();
        let mut values = prefill_inputs(&graph, &weights, tokens, (batch, seq));
        let logits = &interpret(&graph, &mut values).unwrap()["logits"];
        assert_eq!(bits(logits), bits(eager.value()), "{:?}", config.family);
    }
}

/// Parameters, tokens at positions `0..seq`, cache row 0 and zeroed bf16 caches.
fn prefill_inputs(
    graph: &kiln_ir::Graph,
    weights: &ModelWeights<Var>,
    tokens: Vec<i64>,
    (batch, seq): (usize, usize),
) -> BTreeMap<String, Tensor> {
    let mut values = params(weights);
    values.insert("tokens".into(), ids(tokens, &[batch, seq]));
    values.insert(
        "positions".into(),
        ids(positions(batch, seq), &[batch, seq]),
    );
    values.insert("cache_positions".into(), ids(vec![0; batch], &[batch]));
    for (_, name, kind, ty) in graph.inputs() {
        if kind == InputKind::State {
            let zeros = Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu);
            values.insert(name.to_string(), zeros);
        }
    }
    values
}

/// Prefill a prompt, then decode token by token (each row fed its true next token): every
/// step's logits against the full bf16 forward at that position, and greedy picks against f32
/// decoding of the same (rounded) weights wherever f32's top-2 margin is beyond bf16 noise.
/// Decode attends over keys and values rounded into the bf16 cache where the full forward
/// attends over f32 ones, so the bound is bf16's, not bit for bit.
#[test]
fn decode_steps_follow_the_bf16_forward_and_f32_greedy_picks() {
    let mut rng = testing::rng("bf16_decode");
    for config in configs() {
        let seed = rand::Rng::random(&mut rng);
        let weights = random_weights_as(&config, seed, DType::BF16).unwrap();
        let (batch, total, prompt, max_seq) = (2, 10, 3, 16);
        let tokens = testing::indices(&mut rng, batch * total, config.vocab_size);
        let full_logits = |ops: &Eager, weights: &ModelWeights<Var>| {
            let logits = forward(
                ops,
                &config,
                weights,
                &constant(tokens.clone(), &[batch, total]),
                &constant(positions(batch, total), &[batch, total]),
            );
            logits.unwrap().value().to_f64_vec().unwrap()
        };
        let full = full_logits(&BF16, &weights);
        let f32_full = full_logits(&Eager::F32, &widened(&config, &weights));
        let vocab = config.vocab_size;
        let at = |all: &[f64], b: usize, t: usize| {
            all[(b * total + t) * vocab..(b * total + t + 1) * vocab].to_vec()
        };

        let options = ProgramOptions {
            batch,
            seq: prompt,
            max_seq: Some(max_seq),
            precision: Precision::Bf16,
            ..Default::default()
        };
        let prefill = build(ProgramKind::Prefill, &config, &options).unwrap();
        let decode = build(ProgramKind::Decode, &config, &options).unwrap();
        let prompt_ids = (0..batch)
            .flat_map(|b| tokens[b * total..b * total + prompt].to_vec())
            .collect();
        let mut values = prefill_inputs(&prefill, &weights, prompt_ids, (batch, prompt));
        let mut logits = interpret(&prefill, &mut values).unwrap()["logits"]
            .to_f64_vec()
            .unwrap();
        let (mut worst, mut compared) = (0.0f64, 0);
        for t in prompt - 1..total - 1 {
            for b in 0..batch {
                let got = &logits[b * vocab..(b + 1) * vocab];
                let error = testing::rel_l2(got, &at(&full, b, t));
                assert!(
                    error <= 2e-2,
                    "{:?} row {b} t {t}: {error:e}",
                    config.family
                );
                worst = worst.max(error);
                let f32_row = at(&f32_full, b, t);
                if top2_margin(&f32_row) > 0.05 * max_abs(&f32_row) {
                    assert_eq!(argmax(got), argmax(&f32_row), "row {b} t {t}");
                    compared += 1;
                }
            }
            let next = (0..batch).map(|b| tokens[b * total + t + 1]).collect();
            values.insert("tokens".into(), ids(next, &[batch, 1]));
            values.insert(
                "positions".into(),
                ids(vec![(t + 1) as i64; batch], &[batch]),
            );
            logits = interpret(&decode, &mut values).unwrap()["logits"]
                .to_f64_vec()
                .unwrap();
        }
        assert!(compared > 0, "no step had a clear greedy pick");
        eprintln!(
            "{:?}: decode within {worst:.2e} of the bf16 forward; {compared} greedy picks equal f32's",
            config.family
        );
    }
}

/// The bf16 `weights` widened to f32 (exactly): the same numbers, for the f32 oracle.
fn widened(config: &ModelConfig, weights: &ModelWeights<Var>) -> ModelWeights<Var> {
    let named: BTreeMap<String, Tensor> = params(weights);
    ModelWeights::build(config, |name, _| {
        let values: Vec<f32> = named[name]
            .to_f64_vec()
            .unwrap()
            .iter()
            .map(|&v| v as f32)
            .collect();
        Var::leaf(Tensor::from_vec(values, named[name].shape().clone()).unwrap())
    })
    .unwrap()
}

fn argmax(row: &[f64]) -> usize {
    (0..row.len()).fold(0, |best, i| if row[i] > row[best] { i } else { best })
}

fn max_abs(row: &[f64]) -> f64 {
    row.iter().fold(0.0, |m, v| m.max(v.abs()))
}

fn top2_margin(row: &[f64]) -> f64 {
    let best = argmax(row);
    let second = (0..row.len())
        .filter(|&i| i != best)
        .fold(f64::NEG_INFINITY, |m, i| m.max(row[i]));
    row[best] - second
}

#[test]
fn bf16_logits_stay_near_f32_and_the_planned_executor_equals_the_interpreter() {
    let mut rng = testing::rng("bf16_planned");
    for config in configs() {
        let seed = rand::Rng::random(&mut rng);
        let weights = random_weights_as(&config, seed, DType::BF16).unwrap();
        let f32_weights = random_weights_as(&config, seed, DType::F32).unwrap();
        let (batch, seq) = (2, 6);
        let tokens = testing::indices(&mut rng, batch * seq, config.vocab_size);
        let options = ProgramOptions {
            batch,
            seq,
            precision: Precision::Bf16,
            ..Default::default()
        };
        let graph = build(ProgramKind::Prefill, &config, &options).unwrap();
        let values = prefill_inputs(&graph, &weights, tokens.clone(), (batch, seq));
        let want = interpret(&graph, &mut values.clone()).unwrap();
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &kiln_runtime::Workspaces::Cpu,
        );
        let got = execute(&graph, &planned.unwrap(), &mut values.clone(), true).unwrap();
        assert_eq!(bits(&got["logits"]), bits(&want["logits"]));
        for (name, tensor) in &want {
            assert_eq!(bits(&got[name]), bits(tensor), "{name}");
        }

        let f32_logits = last_logits(
            &Eager::F32,
            &config,
            &f32_weights,
            &constant(tokens, &[batch, seq]),
            &constant(positions(batch, seq), &[batch, seq]),
        )
        .unwrap();
        let f32_logits = f32_logits.value().to_f64_vec().unwrap();
        let error = testing::rel_l2(&want["logits"].to_f64_vec().unwrap(), &f32_logits);
        assert!(error <= 2e-2, "{:?}: {error:e} from f32", config.family);
        assert!(error > 0.0);
    }
}

/// The fusion pass rewrites the bf16 programs (every GEMM into a `linear`, gate/up with their
/// SwiGLU, q/k/v grouped, the RoPEs and cache writes into one op per layer, decode's into the
/// q/k/v linear; past 16 rows,
/// the linears' inputs written rounded by their producers) and the CPU
/// reference computes a fused op as its unfused ops, so fused and unfused programs give the
/// same bits: logits and every cache.
#[test]
fn fused_programs_equal_the_unfused_ones_bit_for_bit() {
    let mut rng = testing::rng("bf16_fused");
    for config in configs() {
        let seed = rand::Rng::random(&mut rng);
        let weights = random_weights_as(&config, seed, DType::BF16).unwrap();
        let programs = [
            (ProgramKind::Prefill, 2, 5),
            (ProgramKind::Decode, 2, 5),
            (ProgramKind::Decode, 20, 5),
            (ProgramKind::Prefill, 3, 12),
        ];
        for (kind, batch, seq) in programs {
            let tokens = testing::indices(&mut rng, batch * seq, config.vocab_size);
            let options = |fusion| ProgramOptions {
                batch,
                seq,
                max_seq: Some(16),
                precision: Precision::Bf16,
                fusion,
                ..Default::default()
            };
            let fused = build(kind, &config, &options(true)).unwrap();
            let unfused = build(kind, &config, &options(false)).unwrap();
            kiln_ir::verify(&fused).unwrap();
            let count = |graph: &kiln_ir::Graph, name: &str| {
                (graph.ops()).filter(|(_, op)| op.name() == name).count()
            };
            let layers = config.num_hidden_layers;
            // q/k/v, o, gate/up with SwiGLU, down per layer, and the head. Past 16 rows
            // (`UNROUNDED_LINEAR_MAX_ROWS`), o, gate/up and down write the next linear's input
            // rounded: in decode the last down's normed rows too (the LM head's input), not in
            // prefill, whose final norm reads the last token's row through a slice.
            let (rows, last) = match kind {
                ProgramKind::Decode => (batch, 1),
                _ => (batch * seq, 0),
            };
            let rounded = match rows > kiln_ir::UNROUNDED_LINEAR_MAX_ROWS {
                true => 3 * layers - 1 + last,
                false => 0,
            };
            let linears = count(&fused, "linear") + count(&fused, "rounded_linear");
            assert_eq!(linears, 4 * layers + 1, "{}", kind.name());
            assert_eq!(count(&fused, "rounded_linear"), rounded, "{}", kind.name());
            assert_eq!(count(&fused, "matmul") + count(&fused, "swiglu"), 0);
            assert_eq!(count(&unfused, "matmul"), 7 * layers + 1);
            // Every residual add + norm after o, down and the last layer in a linear's
            // epilogue (the first layer's norm has no add).
            assert_eq!(count(&fused, "add_rmsnorm"), 0);
            assert_eq!(count(&unfused, "add_rmsnorm"), 2 * layers);
            // The RoPEs and cache writes, one op per layer: decode's the q/k/v linear's
            // epilogue, prefill's a `rope_kv_write` (v made head-major in it, and its
            // FlashAttention's operands staged by it).
            let in_linears = (fused.node_indices())
                .filter(|&n| {
                    matches!(
                        fused.node(n).map(|n| &n.kind),
                        Some(kiln_ir::graph::NodeKind::Op(kiln_ir::Op::Linear {
                            rope_kv: Some(_),
                            ..
                        }))
                    )
                })
                .count();
            let (fused_linears, apart) = match kind {
                ProgramKind::Decode => (layers, 0),
                _ => (0, layers),
            };
            assert_eq!(in_linears, fused_linears, "{}", kind.name());
            assert_eq!(count(&fused, "rope_kv_write"), apart, "{}", kind.name());
            let unfused_ops = ["rope", "kv_cache_write", "contiguous"];
            let left: usize = unfused_ops.iter().map(|op| count(&fused, op)).sum();
            assert_eq!(left, 0, "{}", kind.name());
            let mut values = prefill_inputs(&unfused, &weights, tokens.clone(), (batch, seq));
            if kind == ProgramKind::Decode {
                values.insert("tokens".into(), ids(tokens[..batch].to_vec(), &[batch, 1]));
                values.insert("positions".into(), ids(vec![3; batch], &[batch]));
                for (_, name, input_kind, ty) in unfused.inputs() {
                    if input_kind == InputKind::State {
                        // Random history in the bf16 caches.
                        let history = testing::signed(&mut rng, ty.shape.numel());
                        let rounded: Vec<half::bf16> =
                            history.iter().map(|&v| half::bf16::from_f64(v)).collect();
                        let cache = Tensor::from_vec(rounded, ty.shape.clone()).unwrap();
                        values.insert(name.into(), cache);
                    }
                }
            }
            let want = interpret(&unfused, &mut values.clone()).unwrap();
            let mut fused_values = values.clone();
            let got = interpret(&fused, &mut fused_values).unwrap();
            assert_eq!(
                bits(&got["logits"]),
                bits(&want["logits"]),
                "{}",
                kind.name()
            );
            let mut unfused_values = values;
            interpret(&unfused, &mut unfused_values).unwrap();
            for (name, tensor) in &unfused_values {
                assert_eq!(
                    bits(&fused_values[name]),
                    bits(tensor),
                    "{} {name}",
                    kind.name()
                );
            }
        }
    }
}
