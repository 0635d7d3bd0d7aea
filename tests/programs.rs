//! The traced programs on the reference interpreter against the eager oracle: eval (forward,
//! loss, IR-autodiff gradients) and prefill bit for bit; decode steps against the full forward;
//! train steps (AdamW inside the graph) against the oracle's gradients and AdamW kernel.

use std::collections::BTreeMap;

use kiln_frontend::eval::{evaluate, evaluate_interpreted, CausalLmInputs};
use kiln_frontend::model::{
    forward, last_logits, random_weights, Eager, ModelConfig, ModelWeights, Precision,
};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::DType;
use kiln_kernels::testing;
use kiln_runtime::interpret;
use kiln_runtime::Tensor;

fn configs() -> [ModelConfig; 2] {
    [ModelConfig::tiny(), ModelConfig::tiny_llama()]
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn tokens(
    rng: &mut rand::rngs::StdRng,
    config: &ModelConfig,
    batch: usize,
    seq: usize,
) -> Vec<i64> {
    testing::indices(rng, batch * seq, config.vocab_size)
}

fn params(weights: &ModelWeights<Var>) -> BTreeMap<String, Tensor> {
    weights
        .named()
        .into_iter()
        .map(|(name, v)| (name, v.value().clone()))
        .collect()
}

#[test]
fn interpreted_eval_equals_oracle_bit_for_bit() {
    let mut rng = testing::rng("interpreted_eval_equals_oracle");
    for config in configs() {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let (batch, seq) = (2, 7);
        let ids = Tensor::from_vec(tokens(&mut rng, &config, batch, seq), [batch, seq]).unwrap();
        let oracle = evaluate(&config, &weights, &ids, true, Precision::F32).unwrap();
        let interpreted =
            evaluate_interpreted(&config, &weights, &ids, true, Precision::F32).unwrap();
        assert_eq!(
            bits(&oracle.logits),
            bits(&interpreted.logits),
            "{:?} logits",
            config.family
        );
        assert_eq!(
            bits(&oracle.loss),
            bits(&interpreted.loss),
            "{:?} loss",
            config.family
        );
        assert_eq!(oracle.grads.len(), interpreted.grads.len());
        for ((name, a), (_, b)) in oracle.grads.iter().zip(&interpreted.grads) {
            assert_eq!(bits(a), bits(b), "{:?} grad {name}", config.family);
        }
    }
}

#[test]
fn interpreted_prefill_equals_oracle_bit_for_bit() {
    let mut rng = testing::rng("interpreted_prefill");
    for config in configs() {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let (batch, seq, max_seq) = (2, 5, 12);
        let ids = tokens(&mut rng, &config, batch, seq);
        let positions: Vec<i64> = (0..batch * seq).map(|i| (i % seq) as i64).collect();
        let eager = last_logits(
            &Eager::F32,
            &config,
            &weights,
            &Var::constant(Tensor::from_vec(ids.clone(), [batch, seq]).unwrap()),
            &Var::constant(Tensor::from_vec(positions.clone(), [batch, seq]).unwrap()),
        )
        .unwrap();
        let options = ProgramOptions {
            batch,
            seq,
            max_seq: Some(max_seq),
            ..Default::default()
        };
        let graph = build(ProgramKind::Prefill, &config, &options).unwrap();
        kiln_ir::verify(&graph).unwrap();
        let mut values = params(&weights);
        values.insert(
            "tokens".into(),
            Tensor::from_vec(ids, [batch, seq]).unwrap(),
        );
        values.insert(
            "positions".into(),
            Tensor::from_vec(positions, [batch, seq]).unwrap(),
        );
        values.insert(
            "cache_positions".into(),
            Tensor::from_vec(vec![0i64; batch], [batch]).unwrap(),
        );
        insert_empty_caches(&mut values, &config, batch, max_seq);
        let outputs = interpret(&graph, &mut values).unwrap();
        assert_eq!(
            bits(&outputs["logits"]),
            bits(eager.value()),
            "{:?}",
            config.family
        );
    }
}

fn insert_empty_caches(
    values: &mut BTreeMap<String, Tensor>,
    config: &ModelConfig,
    batch: usize,
    max_seq: usize,
) {
    for layer in 0..config.num_hidden_layers {
        for kv in ["k", "v"] {
            let dims = [batch, config.num_key_value_heads, max_seq, config.head_dim];
            values.insert(
                format!("cache.{kv}.{layer}"),
                Tensor::zeros(dims, DType::F32, kiln_runtime::Device::Cpu),
            );
        }
    }
}

/// Prefill `prompt` tokens, then decode the rest one at a time; each step's logits must match
/// the full forward's logits at that position. Not bit for bit: decode multiplies one row per
/// sequence where the full forward multiplies all rows at once, and the GEMM may block its
/// inner sum differently for different row counts — so relative error ≤ 1e-5.
#[test]
fn decode_steps_reproduce_the_full_forward() {
    let mut rng = testing::rng("decode_steps");
    for config in configs() {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let (batch, total, prompt, max_seq) = (2, 9, 4, 16);
        let ids = tokens(&mut rng, &config, batch, total);
        let positions: Vec<i64> = (0..batch * total).map(|i| (i % total) as i64).collect();
        let full = forward(
            &Eager::F32,
            &config,
            &weights,
            &Var::constant(Tensor::from_vec(ids.clone(), [batch, total]).unwrap()),
            &Var::constant(Tensor::from_vec(positions, [batch, total]).unwrap()),
        )
        .unwrap()
        .value()
        .to_f64_vec()
        .unwrap();
        let vocab = config.vocab_size;
        let full_at = |b: usize, t: usize| {
            full[(b * total + t) * vocab..(b * total + t + 1) * vocab].to_vec()
        };

        let mut values = params(&weights);
        insert_empty_caches(&mut values, &config, batch, max_seq);
        let options = ProgramOptions {
            batch,
            seq: prompt,
            max_seq: Some(max_seq),
            ..Default::default()
        };
        let prefill = build(ProgramKind::Prefill, &config, &options).unwrap();
        let prompt_ids: Vec<i64> = (0..batch)
            .flat_map(|b| ids[b * total..b * total + prompt].to_vec())
            .collect();
        let prompt_positions: Vec<i64> = (0..batch * prompt).map(|i| (i % prompt) as i64).collect();
        values.insert(
            "tokens".into(),
            Tensor::from_vec(prompt_ids, [batch, prompt]).unwrap(),
        );
        values.insert(
            "positions".into(),
            Tensor::from_vec(prompt_positions, [batch, prompt]).unwrap(),
        );
        values.insert(
            "cache_positions".into(),
            Tensor::from_vec(vec![0i64; batch], [batch]).unwrap(),
        );
        let logits = interpret(&prefill, &mut values).unwrap()["logits"]
            .to_f64_vec()
            .unwrap();
        for b in 0..batch {
            let error =
                testing::rel_l2(&logits[b * vocab..(b + 1) * vocab], &full_at(b, prompt - 1));
            assert!(
                error < 1e-5,
                "{:?} prefill row {b}: {error:e}",
                config.family
            );
        }

        let decode = build(ProgramKind::Decode, &config, &options).unwrap();
        kiln_ir::verify(&decode).unwrap();
        for t in prompt..total {
            let step_ids: Vec<i64> = (0..batch).map(|b| ids[b * total + t]).collect();
            values.insert(
                "tokens".into(),
                Tensor::from_vec(step_ids, [batch, 1]).unwrap(),
            );
            values.insert(
                "positions".into(),
                Tensor::from_vec(vec![t as i64; batch], [batch]).unwrap(),
            );
            let logits = interpret(&decode, &mut values).unwrap()["logits"]
                .to_f64_vec()
                .unwrap();
            for b in 0..batch {
                let error = testing::rel_l2(&logits[b * vocab..(b + 1) * vocab], &full_at(b, t));
                assert!(
                    error < 1e-5,
                    "{:?} decode position {t} row {b}: {error:e}",
                    config.family
                );
            }
        }
    }
}

fn train_values(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    ids: &[i64],
    batch: usize,
    seq: usize,
) -> BTreeMap<String, Tensor> {
    let mut values = params(weights);
    for (name, v) in weights.named() {
        for moment in ["m", "v"] {
            values.insert(
                format!("adamw.{moment}.{name}"),
                Tensor::zeros(v.shape().clone(), DType::F32, kiln_runtime::Device::Cpu),
            );
        }
    }
    let tokens = Tensor::from_vec(ids.to_vec(), [batch, seq]).unwrap();
    let inputs = CausalLmInputs::new(&tokens, config.vocab_size).unwrap();
    for (name, tensor) in inputs.named() {
        values.insert(name.into(), tensor.clone());
    }
    values.insert("loss_seed".into(), Tensor::scalar(1.0, DType::F32));
    values.insert("lr".into(), Tensor::scalar(1e-3, DType::F64));
    values
}

/// Six interpreted train steps on one batch lower the loss, in f32 and in mixed precision
/// (bf16 GEMM inputs and FlashAttention; and with SwiGLU's gate and up kept in bf16).
#[test]
fn train_steps_reduce_the_loss() {
    let mut rng = testing::rng("train_steps_reduce_the_loss");
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
    let (batch, seq) = (2, 8);
    let ids = tokens(&mut rng, &config, batch, seq);
    for precision in [Precision::F32, Precision::Bf16Gemm, Precision::Bf16Swiglu] {
        let options = ProgramOptions {
            batch,
            seq,
            precision,
            ..Default::default()
        };
        let graph = build(ProgramKind::Train, &config, &options).unwrap();
        kiln_ir::verify(&graph).unwrap();
        let mut values = train_values(&config, &weights, &ids, batch, seq);
        values.insert("lr".into(), Tensor::scalar(5e-3, DType::F64));
        let mut losses = Vec::new();
        for step in 1..=6i64 {
            values.insert(
                "step".into(),
                Tensor::from_vec(vec![step], kiln_ir::Shape::scalar()).unwrap(),
            );
            let outputs = interpret(&graph, &mut values).unwrap();
            losses.push(outputs["loss"].to_f64_vec().unwrap()[0]);
        }
        eprintln!("{precision:?} losses {losses:?}");
        // Adam's first steps can overshoot on one step; over six steps on one batch the loss
        // must fall clearly, and stay finite throughout.
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{precision:?} {losses:?}"
        );
        assert!(
            losses[5] < 0.8 * losses[0],
            "{precision:?}: six steps on a fixed batch must reduce the loss: {losses:?}"
        );
    }
}

/// One interpreted train step updates every parameter exactly as the oracle's gradients run
/// through the AdamW kernel would: at the `lr` input's rate, and with clipping (the kernel's
/// global norm and factor) and the decay exemption of vectors when asked for. In mixed
/// precision the linears read persistent bf16 copies of their weights (derived states, one
/// cast per update) where the oracle casts at each use: the same bits, and every copy written
/// back as its updated weight's cast.
#[test]
fn train_step_equals_oracle_gradients_and_adamw() {
    let mut rng = testing::rng("train_step_equals_oracle");
    let precisions = [Precision::F32, Precision::Bf16Gemm, Precision::Bf16Swiglu];
    let cases = (configs().into_iter().zip([None, Some(0.5)]))
        .flat_map(|case| precisions.map(|precision| (case.clone(), precision)));
    for ((config, clip), precision) in cases {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let (batch, seq) = (2, 6);
        let ids = tokens(&mut rng, &config, batch, seq);
        let options = ProgramOptions {
            batch,
            seq,
            clip_grad_norm: clip,
            decay_exempt_vectors: clip.is_some(),
            precision,
            ..Default::default()
        };
        let lr = 3e-3;
        let graph = build(ProgramKind::Train, &config, &options).unwrap();
        let mut values = train_values(&config, &weights, &ids, batch, seq);
        values.insert("lr".into(), Tensor::scalar(lr, DType::F64));
        values.insert(
            "step".into(),
            Tensor::from_vec(vec![1i64], kiln_ir::Shape::scalar()).unwrap(),
        );
        let outputs = interpret(&graph, &mut values).unwrap();

        let oracle = evaluate(
            &config,
            &weights,
            &Tensor::from_vec(ids.clone(), [batch, seq]).unwrap(),
            true,
            precision,
        )
        .unwrap();
        // Mixed precision: a copy for every weight a linear reads, each written back as the
        // updated weight's cast.
        let copies = graph.derived();
        assert_eq!(copies.is_empty(), precision == Precision::F32);
        for (copy, from) in copies {
            assert_eq!(copy, &format!("bf16.{from}"));
            let want = values[from].cast_to(DType::BF16).unwrap();
            assert_eq!(bits(&values[copy]), bits(&want), "{copy}");
        }
        assert_eq!(
            bits(&outputs["loss"].reshape([1]).unwrap()),
            bits(&oracle.loss)
        );
        let grads: Vec<Vec<f32>> = (oracle.grads.iter())
            .map(|(_, g)| g.to_vec::<f32>().unwrap())
            .collect();
        let grad_scale = clip.map(|max_norm| {
            let views: Vec<_> = (grads.iter().zip(&oracle.grads))
                .map(|(g, (_, t))| kiln_kernels::TensorView::contiguous(g, t.dims()).unwrap())
                .collect();
            let (norm, scale) = kiln_kernels::optim::clip_grad_norm(&views, max_norm).unwrap();
            assert_eq!(
                bits(&outputs["grad_norm"].reshape([1]).unwrap()),
                vec![f64::from(norm).to_bits()]
            );
            assert!(
                scale < 1.0,
                "the tiny model's gradients are clipped at {max_norm}: {scale}"
            );
            scale
        });
        assert_eq!(outputs.contains_key("grad_norm"), clip.is_some());
        let a = options.adamw;
        for (((name, param), g), (_, grad)) in
            (weights.named().into_iter()).zip(&grads).zip(&oracle.grads)
        {
            let exempt = clip.is_some() && grad.dims().len() < 2;
            let adamw = kiln_kernels::optim::AdamW {
                lr,
                beta1: a.beta1,
                beta2: a.beta2,
                eps: a.eps,
                weight_decay: if exempt { 0.0 } else { a.weight_decay },
            };
            let mut p = param.value().to_vec::<f32>().unwrap();
            let mut m = vec![0f32; p.len()];
            let mut v = vec![0f32; p.len()];
            let dims = param.dims().to_vec();
            kiln_kernels::optim::adamw(
                &mut kiln_kernels::TensorViewMut::contiguous(&mut p, dims.as_slice()).unwrap(),
                &kiln_kernels::TensorView::contiguous(g, dims.as_slice()).unwrap(),
                &mut kiln_kernels::TensorViewMut::contiguous(&mut m, dims.as_slice()).unwrap(),
                &mut kiln_kernels::TensorViewMut::contiguous(&mut v, dims.as_slice()).unwrap(),
                (1, grad_scale),
                &adamw,
            )
            .unwrap();
            let updated = values[&name].to_vec::<f32>().unwrap();
            assert!(
                p.iter()
                    .zip(&updated)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{:?} {precision:?} {name}",
                config.family
            );
            assert_ne!(
                updated,
                param.value().to_vec::<f32>().unwrap(),
                "{name} was updated"
            );
        }
    }
}

/// The fusion pass on the mixed-precision train step: every gradient of a bf16 GEMM input
/// rounded to bf16 is computed by one `rounded_matmul` (two per linear: the input's and the
/// weight's), each AdamW of a linear's weight (and of an untied LM head's) and each sum of
/// input gradients reads its rounded gradients as bf16, one normed input is cast once for q, k
/// and v and once for gate and up, SwiGLU and its backward take and write rounded values, the
/// norms write their normed rows rounded, each bf16 weight copy is written by its param's
/// AdamW; where the precision keeps SwiGLU's gate and up in bf16, their GEMMs write them
/// rounded, SwiGLU and its backward read them so, and no cast is left of them or of their
/// gradients; and two fused steps give the unfused steps' bits in the loss and in every state
/// (parameters, moments, bf16 copies).
#[test]
fn fused_mixed_precision_train_steps_equal_the_unfused_ones_bit_for_bit() {
    let mut rng = testing::rng("fused_mixed_precision_train");
    let precisions = [Precision::Bf16Gemm, Precision::Bf16Swiglu];
    for (config, precision) in configs()
        .into_iter()
        .flat_map(|c| precisions.map(|p| (c.clone(), p)))
    {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let (batch, seq) = (2, 5);
        let ids = tokens(&mut rng, &config, batch, seq);
        let options = |fusion| ProgramOptions {
            batch,
            seq,
            precision,
            fusion,
            ..Default::default()
        };
        let fused = build(ProgramKind::Train, &config, &options(true)).unwrap();
        let unfused = build(ProgramKind::Train, &config, &options(false)).unwrap();
        kiln_ir::verify(&fused).unwrap();
        let ops = |graph: &kiln_ir::Graph| -> Vec<(kiln_ir::Op, Vec<kiln_ir::ValueId>)> {
            (graph.ops())
                .map(|(n, op)| (op.clone(), graph.operands(n)))
                .collect()
        };
        let count = |graph, name: &str| {
            ops(graph)
                .iter()
                .filter(|(op, _)| op.name() == name)
                .count()
        };
        let layers = config.num_hidden_layers;
        // Gate's and up's products, rounded where the precision keeps them so.
        let kept = match precision.swiglu_dtype() {
            Some(_) => 2,
            None => 0,
        };
        assert_eq!(count(&unfused, "rounded_matmul"), 0);
        assert_eq!(count(&fused, "rounded_matmul"), (2 * 7 + kept) * layers);
        assert_eq!(
            count(&fused, "matmul"),
            (7 - kept) * layers,
            "the forward's products"
        );
        let casts: Vec<_> = (ops(&fused).into_iter())
            .filter(|(op, _)| op.name() == "cast")
            .collect();
        for (i, cast) in casts.iter().enumerate() {
            assert!(!casts[..i].contains(cast), "{cast:?} is cast twice");
        }
        // Per layer: q/k/v and gate/up share their casts (3 fewer); no linear's input or
        // weight gradient is rounded by a cast of its own (7 + 7); no rounded weight gradient
        // is widened for its AdamW (7), nor any term of the sums of q/k/v's and of gate/up's
        // input gradients (3 + 2), nor the output gradient FlashAttention's backward rounds
        // again as it reads it (1); the input gradients of both norms, of RoPE's q and k and
        // of v's head-major copy, and FlashAttention's output, read rounded (and in f32), are
        // written so by the ops that make them (2 + 2 + 1 + 1); SwiGLU writes its result
        // rounded for the
        // down GEMM and its backward takes the rounded gradient and writes both of its own
        // rounded (1 + 1 + 2); both norms write their normed rows rounded for q/k/v and gate/up
        // (2), and the final norm for the LM head (1). The LM head's weight gradient (bf16, the
        // chunked loss's) is read unwidened too: by its AdamW when untied, by the sum with the
        // embedding's gradient when tied. Gate and up kept in bf16: their rounding and
        // widening (2 + 2), and their gradients' (2 + 2) before the GEMMs round them again.
        let untied = usize::from(!config.tie_word_embeddings);
        let casts_gone = count(&unfused, "cast") - count(&fused, "cast");
        assert_eq!(
            casts_gone,
            (3 + 7 + 7 + 7 + 5 + 1 + 6 + 4 + 2 + 4 * kept) * layers + 1 + 1,
            "{precision:?}"
        );
        assert_eq!(count(&fused, "rounded_swiglu"), layers);
        assert_eq!(count(&fused, "rounded_swiglu_backward"), layers);
        // RoPE writes q and k rounded: FlashAttention reads them so (the same bits).
        assert_eq!(count(&fused, "rounded_rope"), 2 * layers);
        assert_eq!(
            count(&fused, "also_rounded_add_rmsnorm_backward"),
            2 * layers
        );
        // RoPE's input gradients: also read in f32 by the bias gradients where q and k have
        // biases (Qwen2), only rounded where they have none (Llama).
        let rope =
            count(&fused, "also_rounded_rope_backward") + count(&fused, "rounded_rope_backward");
        assert_eq!(rope, 2 * layers);
        // v made head-major for FlashAttention (rounded), and its gradient made token-major
        // again (both ways with a bias, rounded alone without).
        let copies = count(&fused, "also_rounded_contiguous") + count(&fused, "rounded_contiguous");
        assert_eq!(copies, 2 * layers);
        assert_eq!(count(&fused, "also_rounded_flash_attention"), layers);
        let norms = count(&fused, "rounded_rmsnorm") + count(&fused, "rounded_add_rmsnorm");
        assert_eq!(norms, 2 * layers + 1);
        // A tied embedding's gradient is the scatter onto the LM head's, no add; the table's
        // update takes the scatter in (`embedding_adamw`, its unnamed rows then its named
        // rows), so no gradient table is written.
        let embedding_updates: Vec<_> = (ops(&fused).into_iter())
            .filter_map(|(op, _)| match op {
                kiln_ir::Op::EmbeddingAdamW {
                    onto, copy, rows, ..
                } => Some((onto, copy, rows)),
                _ => None,
            })
            .collect();
        let tied = untied == 0;
        let rows = [
            kiln_ir::EmbeddingRows::Unnamed,
            kiln_ir::EmbeddingRows::Named,
        ];
        assert_eq!(embedding_updates, rows.map(|rows| (tied, tied, rows)));
        assert_eq!(count(&fused, "embedding_backward"), 0);
        assert_eq!(count(&unfused, "add") - count(&fused, "add"), 1 - untied);
        let bf16_grads = (ops(&fused).into_iter())
            .filter(|(op, operands)| {
                op.adamw().is_some() && fused.value_type(operands[1]).unwrap().dtype == DType::BF16
            })
            .count();
        assert_eq!(bf16_grads, 7 * layers + untied);
        // Every persistent bf16 copy (the linears' and the LM head's, which is the
        // embedding's when tied) is written by its param's update, none by a cast of its own.
        let copies = 7 * layers + 1;
        assert_eq!(count(&unfused, "cast_into"), copies);
        assert_eq!(count(&fused, "cast_into"), 0);
        assert_eq!(count(&fused, "adamw_copy"), copies - (1 - untied));

        let mut want = train_values(&config, &weights, &ids, batch, seq);
        let mut got = want.clone();
        for step in 1..=2i64 {
            let step = Tensor::from_vec(vec![step], kiln_ir::Shape::scalar()).unwrap();
            want.insert("step".into(), step.clone());
            got.insert("step".into(), step);
            let unfused_loss = &interpret(&unfused, &mut want).unwrap()["loss"];
            let fused_loss = &interpret(&fused, &mut got).unwrap()["loss"];
            assert_eq!(
                bits(fused_loss),
                bits(unfused_loss),
                "{:?} {precision:?}",
                config.family
            );
        }
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        );
        for (name, tensor) in &want {
            assert_eq!(
                bits(&got[name]),
                bits(tensor),
                "{:?} {precision:?} {name}",
                config.family
            );
        }
    }
}

/// Mixed precision (bf16 GEMM inputs, f32 accumulation, f32 master weights; and with SwiGLU's
/// gate and up kept in bf16): the interpreted eval program equals the oracle in the same
/// precision bit for bit, and stays within bf16 rounding of the f32 run.
#[test]
fn mixed_precision_eval_equals_oracle_bit_for_bit() {
    let mut rng = testing::rng("mixed_precision_eval");
    for config in configs() {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let (batch, seq) = (2, 5);
        let ids = Tensor::from_vec(tokens(&mut rng, &config, batch, seq), [batch, seq]).unwrap();
        let f32_run = evaluate(&config, &weights, &ids, false, Precision::F32).unwrap();
        let mut logits = Vec::new();
        for precision in [Precision::Bf16Gemm, Precision::Bf16Swiglu] {
            let oracle = evaluate(&config, &weights, &ids, true, precision).unwrap();
            let interpreted =
                evaluate_interpreted(&config, &weights, &ids, true, precision).unwrap();
            assert_eq!(
                bits(&oracle.logits),
                bits(&interpreted.logits),
                "{:?} {precision:?} logits",
                config.family
            );
            for ((name, a), (_, b)) in oracle.grads.iter().zip(&interpreted.grads) {
                assert_eq!(
                    bits(a),
                    bits(b),
                    "{:?} {precision:?} grad {name}",
                    config.family
                );
            }
            let error = testing::rel_l2(
                &oracle.logits.to_f64_vec().unwrap(),
                &f32_run.logits.to_f64_vec().unwrap(),
            );
            assert!(
                error > 0.0 && error < 2e-2,
                "{:?} {precision:?}: bf16 GEMMs change the logits by {error:e}",
                config.family
            );
            logits.push(bits(&oracle.logits));
        }
        // Keeping gate and up in bf16 rounds something the other precision does not.
        assert_ne!(logits[0], logits[1], "{:?}", config.family);
    }
}
