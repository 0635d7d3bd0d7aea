//! 2 and 3 of the module doc: the tiny programs against the interpreter, decode at many
//! positions against the full forward, and a NaN weight's NaNs where the CPU has them.

use std::path::Path;

use super::*;

/// Inputs for the tiny programs: random weights, then `example_inputs`.
pub(crate) fn program_inputs(
    graph: &Graph,
    config: &ModelConfig,
    kind: ProgramKind,
    options: &ProgramOptions,
    seed: u64,
) -> BTreeMap<String, Tensor> {
    let weights = random_weights_as(config, seed, options.precision.weight_dtype()).unwrap();
    let mut values: BTreeMap<String, Tensor> = weights
        .named()
        .into_iter()
        .map(|(name, v)| (name, v.value().clone()))
        .collect();
    values.extend(example_inputs(graph, config, kind, options, 5, seed).unwrap());
    values
}

/// `graph` planned for the GPU on `streams` streams.
pub(crate) fn gpu_plan(graph: &Graph, streams: usize) -> kiln_planner::Plan {
    let options = PlanOptions {
        streams,
        ..Default::default()
    };
    plan(graph, &options, &kiln_runtime::Workspaces::Cuda).unwrap()
}

fn gpu_run(
    device: &Arc<CudaDevice>,
    graph: &Graph,
    values: &BTreeMap<String, Tensor>,
    streams: usize,
    mode: RunMode,
    runs: usize,
) -> BTreeMap<String, Tensor> {
    let planned = gpu_plan(graph, streams);
    let backend = Backend::Cuda(device.clone());
    backend.run(graph, &planned, values, mode, runs).unwrap()
}

/// The relative error a tiny program's value `name` may have against the interpreter. AdamW's
/// first steps divide by sqrt(v) ~ |grad|: an element whose gradient is near zero turns a 1e-7
/// difference of the gradient into a larger one of the update, so updated state gets 1e-4.
/// With bf16 GEMM inputs, a value that differs in its last f32 bits can round to the
/// neighbouring bf16: bf16's limit, 1e-2.
pub(crate) fn program_limit(precision: Precision, kind: ProgramKind, name: &str) -> f64 {
    match (precision, kind) {
        (precision, _) if precision.gemm_dtype().is_some() => 1e-2,
        (_, ProgramKind::Train) if name != "loss" => 1e-4,
        _ => 1e-5,
    }
}

#[test]
fn tiny_programs_match_the_cpu_and_replay_equals_eager() {
    let Some(device) = device() else { return };
    let mut seed = 11;
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        for precision in Precision::ALL {
            let options = ProgramOptions {
                batch: 2,
                seq: 6,
                max_seq: Some(12),
                precision,
                ..Default::default()
            };
            for kind in [
                ProgramKind::Prefill,
                ProgramKind::Decode,
                ProgramKind::Train,
            ] {
                if precision == Precision::Bf16 && kind == ProgramKind::Train {
                    continue; // inference only
                }
                seed += 1;
                let graph = build(kind, &config, &options).unwrap();
                let values = program_inputs(&graph, &config, kind, &options, seed);
                // Two runs: train carries params and moments, decode its caches.
                let mut cpu_values = values.clone();
                interpret(&graph, &mut cpu_values).unwrap();
                let want = interpret(&graph, &mut cpu_values).unwrap();
                for streams in [1, 2] {
                    let eager = gpu_run(&device, &graph, &values, streams, RunMode::Eager, 2);
                    let replayed = gpu_run(&device, &graph, &values, streams, RunMode::Graph, 2);
                    for (name, got) in &eager {
                        let reference = want.get(name).unwrap_or_else(|| &cpu_values[name]);
                        let error = testing::rel_l2(
                            &got.to_f64_vec().unwrap(),
                            &reference.to_f64_vec().unwrap(),
                        );
                        let what = format!(
                            "{:?} {} {precision:?} streams={streams}: {name}",
                            config.family,
                            kind.name()
                        );
                        let limit = program_limit(precision, kind, name);
                        assert!(error <= limit, "{what}: relative error {error:e}");
                        assert_eq!(bits(got), bits(&replayed[name]), "{what}: replay != eager");
                    }
                    println!(
                        "{:?} {} {precision:?} streams={streams}: {} values checked",
                        config.family,
                        kind.name(),
                        eager.len()
                    );
                }
            }
        }
    }
}

/// The tiny `cases` of both families lowered with `options` on this device: two replays on
/// two streams (so state carries), every output and write within the CUDA lowering's limits of
/// the interpreter. Returns the bits of every value, case after case.
fn tiny_cases_match_the_cpu_with(
    device: &Arc<CudaDevice>,
    options: LowerOptions,
    cases: &[(ProgramKind, Precision)],
    what: &str,
) -> Vec<BTreeMap<String, Vec<u64>>> {
    let mut seed = 61;
    let mut all = Vec::new();
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        for &(kind, precision) in cases {
            let program = ProgramOptions {
                batch: 2,
                seq: 6,
                max_seq: Some(12),
                precision,
                ..Default::default()
            };
            seed += 1;
            let graph = build(kind, &config, &program).unwrap();
            let values = program_inputs(&graph, &config, kind, &program, seed);
            let mut cpu_values = values.clone();
            interpret(&graph, &mut cpu_values).unwrap();
            let want = interpret(&graph, &mut cpu_values).unwrap();
            let planned = gpu_plan(&graph, 2);
            let mut exe = CudaExecutable::with_options(device, &graph, &planned, options).unwrap();
            for (name, tensor) in &values {
                if graph.input_named(name).is_some() {
                    exe.set(name, tensor).unwrap();
                }
            }
            for _ in 0..2 {
                exe.run(RunMode::Graph).unwrap();
            }
            let mut got_bits = BTreeMap::new();
            let names = graph.outputs().iter().chain(graph.writes());
            for (name, _) in names {
                let got = exe.get(name).unwrap();
                let reference = want.get(name).unwrap_or_else(|| &cpu_values[name]);
                let error =
                    testing::rel_l2(&got.to_f64_vec().unwrap(), &reference.to_f64_vec().unwrap());
                let case = format!("{:?} {} {precision:?}: {name}", config.family, kind.name());
                let limit = program_limit(precision, kind, name);
                assert!(error <= limit, "{case} ({what}): relative error {error:e}");
                got_bits.insert(name.clone(), bits(&got));
            }
            println!(
                "{:?} {} {precision:?}: {what} matches the CPU",
                config.family,
                kind.name()
            );
            all.push(got_bits);
        }
    }
    all
}

/// The HIP backend's lowering (`LowerOptions::portable`: kiln's tiled GEMM for cuBLASLt, the
/// portable emulation in the tensor-core modules, no clusters) runs the tiny programs on this
/// device within the limits of the CUDA lowering against the interpreter.
#[test]
fn tiny_programs_with_the_hip_lowering_match_the_cpu() {
    let Some(device) = device() else { return };
    let cases = [
        (ProgramKind::Prefill, Precision::F32),
        (ProgramKind::Prefill, Precision::Bf16Gemm),
        (ProgramKind::Decode, Precision::Bf16),
        (ProgramKind::Train, Precision::F32),
        (ProgramKind::Train, Precision::Bf16Gemm),
        (ProgramKind::Train, Precision::Bf16Swiglu),
    ];
    let hip = LowerOptions::portable();
    tiny_cases_match_the_cpu_with(&device, hip, &cases, "the HIP lowering");
}

/// cuBLASLt's algorithms chosen by timing its candidates (`tune_gemms`, the default), every
/// linear on cuBLASLt (`linear_rows` 0): the tiny programs within the CUDA lowering's limits of
/// the interpreter, and a second build of each (its choices kept from the first) gives the
/// first's bits.
#[test]
fn tuned_gemms_match_the_cpu_and_keep_their_choice() {
    let Some(device) = device() else { return };
    let cases = [
        (ProgramKind::Prefill, Precision::F32),
        (ProgramKind::Prefill, Precision::Bf16),
        (ProgramKind::Decode, Precision::Bf16),
        (ProgramKind::Train, Precision::Bf16Swiglu),
    ];
    let tuned = LowerOptions {
        tune_gemms: true,
        linear_rows: 0,
        ..LowerOptions::default()
    };
    let first = tiny_cases_match_the_cpu_with(&device, tuned, &cases, "tuned GEMMs");
    // Tuning is the default, so the tests before this one in the process may have chosen
    // for every matmul here already: what is asked is that some choice was made at all.
    let tuned_now = kiln_runtime::cuda::tuned_gemms();
    assert!(tuned_now > 0, "no matmul was tuned");
    let again = tiny_cases_match_the_cpu_with(&device, tuned, &cases, "tuned GEMMs again");
    assert!(
        first == again,
        "a second build of a tuned program gave other bits"
    );
    // The second builds found every choice made.
    assert_eq!(kiln_runtime::cuda::tuned_gemms(), tuned_now);
}

#[test]
fn decode_replayed_at_many_positions_equals_the_full_forward() {
    let Some(device) = device() else { return };
    let mut rng = testing::rng("gpu_decode");
    // f32: the GEMMs' row counts differ, 1e-5. bf16: decode reads keys and values rounded into
    // the bf16 cache where the full forward uses f32 ones (tests/bf16.rs measures ~4e-3).
    let tiny = ModelConfig::tiny();
    for (precision, limit) in [(Precision::F32, 1e-5), (Precision::Bf16, 2e-2)] {
        decode_at_many_positions(&device, &mut rng, (&tiny, precision, limit));
    }
    // Heads of 64 dims (the official models' width: 16-byte vectors over whole key chunks).
    let wide = ModelConfig {
        hidden_size: 128,
        num_attention_heads: 6,
        num_key_value_heads: 2,
        head_dim: 64,
        ..ModelConfig::tiny()
    };
    decode_at_many_positions(&device, &mut rng, (&wide, Precision::Bf16, 2e-2));
}

/// Decode replayed at every position after a prefilled prompt, each step's logits against the
/// full forward within `limit`.
fn decode_at_many_positions(
    device: &Arc<CudaDevice>,
    rng: &mut StdRng,
    (config, precision, limit): (&ModelConfig, Precision, f64),
) {
    let (batch, total, prompt, max_seq) = (2, 24, 5, 32);
    let seed = rand::Rng::random(rng);
    let weights = random_weights_as(config, seed, precision.weight_dtype()).unwrap();
    let ids = testing::indices(rng, batch * total, config.vocab_size);
    let positions: Vec<i64> = (0..batch * total).map(|i| (i % total) as i64).collect();
    let full = forward(
        &Eager { precision },
        config,
        &weights,
        &Var::constant(Tensor::from_vec(ids.clone(), [batch, total]).unwrap()),
        &Var::constant(Tensor::from_vec(positions, [batch, total]).unwrap()),
    )
    .unwrap()
    .value()
    .to_f64_vec()
    .unwrap();
    let vocab = config.vocab_size;
    let options = ProgramOptions {
        batch,
        seq: prompt,
        max_seq: Some(max_seq),
        precision,
        ..Default::default()
    };
    let compile = |kind| {
        let graph = build(kind, config, &options).unwrap();
        let planned = gpu_plan(&graph, 1);
        let mut exe = CudaExecutable::new(device, &graph, &planned).unwrap();
        for (name, var) in weights.named() {
            exe.set(&name, var.value()).unwrap();
        }
        for (name, tensor) in example_inputs(&graph, config, kind, &options, 0, 0).unwrap() {
            exe.set(&name, &tensor).unwrap();
        }
        exe
    };
    let mut prefill = compile(ProgramKind::Prefill);
    let rows = |t0: usize, t1: usize| -> Vec<i64> {
        (0..batch)
            .flat_map(|b| ids[b * total + t0..b * total + t1].to_vec())
            .collect()
    };
    let prompt_positions: Vec<i64> = (0..batch * prompt).map(|i| (i % prompt) as i64).collect();
    prefill
        .set(
            "tokens",
            &Tensor::from_vec(rows(0, prompt), [batch, prompt]).unwrap(),
        )
        .unwrap();
    prefill
        .set(
            "positions",
            &Tensor::from_vec(prompt_positions, [batch, prompt]).unwrap(),
        )
        .unwrap();
    prefill.run(RunMode::Graph).unwrap();
    let mut decode = compile(ProgramKind::Decode);
    for layer in 0..config.num_hidden_layers {
        for which in ["k", "v"] {
            let name = format!("cache.{which}.{layer}");
            decode.set(&name, &prefill.get(&name).unwrap()).unwrap();
        }
    }
    let mut worst = 0.0f64;
    for t in prompt..total {
        decode
            .set(
                "tokens",
                &Tensor::from_vec(rows(t, t + 1), [batch, 1]).unwrap(),
            )
            .unwrap();
        decode
            .set(
                "positions",
                &Tensor::from_vec(vec![t as i64; batch], [batch]).unwrap(),
            )
            .unwrap();
        decode.run(RunMode::Graph).unwrap();
        let logits = decode.get("logits").unwrap().to_f64_vec().unwrap();
        for b in 0..batch {
            let want = &full[(b * total + t) * vocab..(b * total + t + 1) * vocab];
            let error = testing::rel_l2(&logits[b * vocab..(b + 1) * vocab], want);
            assert!(
                error < limit,
                "{precision:?} position {t} row {b}: relative error {error:e}"
            );
            worst = worst.max(error);
        }
    }
    println!(
        "{precision:?} decode replayed at positions {prompt}..{total} (head dim {}): worst relative error {worst:e} vs the full forward",
        config.head_dim
    );
}

/// One NaN in `lm_head.weight` (the issue that `fmaxf` dropped NaN from the loss's row max):
/// the train step's loss is NaN on the GPU as in the reference interpreter, and every output,
/// eager and replayed, has its NaNs where the interpreter has them.
#[test]
fn a_nan_weight_gives_the_cpus_nans_on_the_gpu() {
    let Some(device) = device() else { return };
    let mut rng = testing::rng("gpu_nan_weight");
    let config = ModelConfig::tiny();
    let options = ProgramOptions {
        batch: 2,
        seq: 6,
        max_seq: Some(12),
        ..Default::default()
    };
    for kind in [ProgramKind::Train, ProgramKind::Prefill] {
        let graph = build(kind, &config, &options).unwrap();
        let mut values = program_inputs(&graph, &config, kind, &options, 3);
        let head = &values["lm_head.weight"];
        let mut weights = head.to_vec::<f32>().unwrap();
        let at = rand::Rng::random_range(&mut rng, 0..weights.len());
        weights[at] = f32::NAN;
        let head = Tensor::from_vec(weights, head.shape().clone()).unwrap();
        values.insert("lm_head.weight".to_string(), head);
        let want = interpret(&graph, &mut values.clone()).unwrap();
        if kind == ProgramKind::Train {
            assert!(
                want["loss"].to_f64_vec().unwrap()[0].is_nan(),
                "the CPU's loss"
            );
        }
        for mode in [RunMode::Eager, RunMode::Graph] {
            let got = gpu_run(&device, &graph, &values, 1, mode, 1);
            for (name, reference) in &want {
                let what = format!(
                    "{} {mode:?} lm_head.weight[{at}] = NaN: {name}",
                    kind.name()
                );
                let (g, w) = (
                    got[name].to_f64_vec().unwrap(),
                    reference.to_f64_vec().unwrap(),
                );
                special_values_agree(&what, &g, &w, false);
            }
        }
        println!(
            "{}: NaN in lm_head.weight[{at}] gives the CPU's NaNs",
            kind.name()
        );
    }
}

/// A program's results depend on its inputs, params and state alone, never on what earlier
/// runs left in the arena: the eval and train programs of both tiny families (odd vocabulary
/// sizes, so vector loads meet row ends), run once on a fresh executable, equal bit for bit
/// the same run made after two runs on other tokens and params. (A kernel reading a byte
/// outside what it was given, where a NaN of the first run's poison would not show — a max
/// skips NaN — reads a finite leftover instead; this is what a resumed training run exposes.)
#[test]
fn results_do_not_depend_on_what_earlier_runs_left_in_the_arena() {
    let Some(device) = device() else { return };
    let backend = Backend::Cuda(device.clone());
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/train_qwen2");
    let (trained, _) = kiln_frontend::hf::source::ModelSource::Dir(golden)
        .config()
        .unwrap();
    for (config, seq) in [
        (ModelConfig::tiny(), 7),
        (ModelConfig::tiny_llama(), 7),
        (trained, 8),
    ] {
        for kind in [ProgramKind::Eval, ProgramKind::Train] {
            let options = ProgramOptions {
                batch: 2,
                seq,
                clip_grad_norm: (kind == ProgramKind::Train).then_some(1.0),
                ..Default::default()
            };
            let graph = build(kind, &config, &options).unwrap();
            let planned = gpu_plan(&graph, 1);
            let values = program_inputs(&graph, &config, kind, &options, 21);
            let others = program_inputs(&graph, &config, kind, &options, 22);
            let names: Vec<String> = (graph.outputs().iter().chain(graph.writes()))
                .map(|(n, _)| n.clone())
                .collect();
            for mode in [RunMode::Eager, RunMode::Graph] {
                let run = |exe: &mut Box<dyn kiln_runtime::Executable>,
                           values: &BTreeMap<String, Tensor>| {
                    for (name, tensor) in values {
                        exe.set(name, tensor).unwrap();
                    }
                    exe.run(mode).unwrap();
                    (names.iter())
                        .map(|n| (n.clone(), exe.get(n).unwrap()))
                        .collect::<BTreeMap<_, _>>()
                };
                let mut fresh = backend.compile(&graph, &planned).unwrap();
                let want = run(&mut fresh, &values);
                let mut used = backend.compile(&graph, &planned).unwrap();
                run(&mut used, &others);
                run(&mut used, &others);
                let got = run(&mut used, &values);
                for name in &names {
                    let (g, w) = (bits(&got[name]), bits(&want[name]));
                    let first = g.iter().zip(&w).position(|(a, b)| a != b);
                    assert!(
                        first.is_none(),
                        "{:?} {} {mode:?}: `{name}` differs after earlier runs, first at element \
                         {} of {} ({} vs {})",
                        config.family,
                        kind.name(),
                        first.unwrap_or(0),
                        g.len(),
                        got[name].to_f64_vec().unwrap()[first.unwrap_or(0)],
                        want[name].to_f64_vec().unwrap()[first.unwrap_or(0)],
                    );
                }
            }
        }
    }
}

/// Programmatic dependent launch changes when kernels are scheduled, never what they compute:
/// the tiny programs replayed with it equal the same programs in plain stream order bit for
/// bit, on one stream and two (where events join the streams), two runs each.
/// The bits of every output and write of `graph` after two replays of `planned` from
/// `values`, with programmatic dependent launch when asked (the default) and the device has it.
fn replayed_bits(
    device: &Arc<CudaDevice>,
    (graph, planned): (&Graph, &kiln_planner::Plan),
    values: &BTreeMap<String, Tensor>,
    programmatic: bool,
) -> BTreeMap<String, Vec<u64>> {
    let mut exe = CudaExecutable::new(device, graph, planned).unwrap();
    let on = exe.set_programmatic_launch(programmatic);
    assert_eq!(on, programmatic && device.supports_programmatic_launch());
    for (name, tensor) in values {
        if graph.input_named(name).is_some() {
            exe.set(name, tensor).unwrap();
        }
    }
    for _ in 0..2 {
        exe.run(RunMode::Graph).unwrap();
    }
    let names = graph.outputs().iter().chain(graph.writes());
    (names.map(|(name, _)| (name.clone(), bits(&exe.get(name).unwrap())))).collect()
}

#[test]
fn programmatic_launch_gives_the_bits_of_plain_stream_order() {
    let Some(device) = device() else { return };
    if !device.supports_programmatic_launch() {
        let reason = format!("{} has no programmatic launch", device.describe());
        println!("SKIPPED: programmatic launch: {reason} (sm_90 and a 12.3 driver needed)");
        return;
    }
    let config = ModelConfig::tiny();
    let cases = [
        (ProgramKind::Decode, Precision::Bf16),
        (ProgramKind::Prefill, Precision::Bf16Gemm),
        (ProgramKind::Train, Precision::F32),
    ];
    for (kind, precision) in cases {
        let options = ProgramOptions {
            batch: 2,
            seq: 6,
            max_seq: Some(12),
            precision,
            ..Default::default()
        };
        let graph = build(kind, &config, &options).unwrap();
        let values = program_inputs(&graph, &config, kind, &options, 41);
        for streams in [1, 2] {
            let planned = gpu_plan(&graph, streams);
            let run = |programmatic: bool| {
                replayed_bits(&device, (&graph, &planned), &values, programmatic)
            };
            let (on, off) = (run(true), run(false));
            assert_eq!(on.len(), off.len());
            for (name, bits) in &on {
                assert!(
                    bits == &off[name],
                    "{} streams={streams}: {name}",
                    kind.name()
                );
            }
            println!(
                "{} {precision:?} streams={streams}: {} values equal",
                kind.name(),
                on.len()
            );
        }
    }
}

/// A train step planned under a memory budget (values recomputed in the backward) gives the
/// bits of the unbudgeted step on the device, replayed twice, in f32 and in mixed precision.
#[test]
fn a_budgeted_train_step_gives_the_unbudgeted_bits_on_the_device() {
    let Some(device) = device() else { return };
    let config = ModelConfig::tiny_llama();
    for precision in [Precision::F32, Precision::Bf16Gemm, Precision::Bf16Swiglu] {
        let options = ProgramOptions {
            batch: 2,
            seq: 12,
            precision,
            ..Default::default()
        };
        let graph = build(ProgramKind::Train, &config, &options).unwrap();
        let values = program_inputs(&graph, &config, ProgramKind::Train, &options, 43);
        let unbudgeted = gpu_plan(&graph, 1);
        let budget = Some(unbudgeted.arena_bytes * 19 / 20);
        let workspaces = kiln_runtime::Workspaces::Cuda;
        let (budgeted_graph, budgeted) =
            plan_program(graph.clone(), &PlanOptions::default(), &workspaces, budget).unwrap();
        assert!(!budgeted.recomputed.is_empty());
        kiln_planner::verify_plan(&budgeted_graph, &budgeted, &workspaces).unwrap();
        let run = |graph: &Graph, planned: &kiln_planner::Plan| {
            replayed_bits(&device, (graph, planned), &values, true)
        };
        let (want, got) = (run(&graph, &unbudgeted), run(&budgeted_graph, &budgeted));
        assert_eq!(want.len(), got.len());
        for (name, bits) in &want {
            assert!(bits == &got[name], "{precision:?}: {name}");
        }
        println!(
            "budgeted train {precision:?}: arena {} -> {} B, {} values recomputed, {} values equal",
            unbudgeted.arena_bytes,
            budgeted.arena_bytes,
            budgeted.recomputed.len(),
            want.len()
        );
    }
}

/// L2 prefetches are hints: a bf16 decode whose side stream's launches prefetch the next
/// linears' weights (`LowerOptions::l2_prefetch_bytes`, the default; a model wide enough for
/// its weights to pass the least range, 256 hidden and 1024 intermediate, at batch 16) gives
/// the bits of the same decode without them, replayed twice and run eagerly twice; its
/// timeline and profile show the prefetches.
#[test]
fn l2_prefetch_gives_the_bits_of_no_prefetch() {
    let config = ModelConfig {
        hidden_size: 256,
        intermediate_size: 1024,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        max_position_embeddings: 512,
        ..ModelConfig::tiny()
    };
    let options = ProgramOptions {
        batch: 16,
        seq: 6,
        max_seq: Some(320),
        precision: Precision::Bf16,
        ..Default::default()
    };
    let graph = build(ProgramKind::Decode, &config, &options).unwrap();
    let values = program_inputs(&graph, &config, ProgramKind::Decode, &options, 43);
    let planned = gpu_plan(&graph, 1);
    let options = |l2_prefetch_bytes| LowerOptions {
        l2_prefetch_bytes,
        ..LowerOptions::default()
    };
    let default = LowerOptions::default().l2_prefetch_bytes;
    for bytes in [0, default] {
        let summary = kiln_runtime::lower_for_device(&graph, &planned, options(bytes)).unwrap();
        assert_eq!(
            summary.prefetches.len(),
            if bytes > 0 {
                config.num_hidden_layers
            } else {
                0
            }
        );
    }
    let Some(device) = device() else { return };
    let run = |l2_prefetch_bytes: u64, mode: RunMode| {
        let options = options(l2_prefetch_bytes);
        let mut exe = CudaExecutable::with_options(&device, &graph, &planned, options).unwrap();
        for (name, tensor) in &values {
            if graph.input_named(name).is_some() {
                exe.set(name, tensor).unwrap();
            }
        }
        for _ in 0..2 {
            exe.run(mode).unwrap();
        }
        let names = graph.outputs().iter().chain(graph.writes());
        let values = (names.map(|(name, _)| (name.clone(), bits(&exe.get(name).unwrap()))))
            .collect::<BTreeMap<_, _>>();
        (values, exe)
    };
    if !device.supports_clusters() {
        println!("SKIPPED: l2 prefetch: the device has no bulk L2 prefetch (sm_90 needed)");
        return;
    }
    let (off, _) = run(0, RunMode::Graph);
    let (on, exe) = run(default, RunMode::Graph);
    let (eager, _) = run(default, RunMode::Eager);
    assert_eq!(on, off);
    assert_eq!(eager, off);
    // The prefetches run on the side stream, each issued between the step before its split
    // (whose end it waits for) and the split's step (the same node); profiling issues every
    // step on one stream, the prefetches included.
    let timeline = exe.timeline().unwrap();
    let prefetches: Vec<usize> = (0..timeline.len())
        .filter(|&i| timeline[i].op == "l2_prefetch")
        .collect();
    assert_eq!(prefetches.len(), config.num_hidden_layers);
    for &i in &prefetches {
        let (before, side, split) = (&timeline[i - 1], &timeline[i], &timeline[i + 1]);
        assert_eq!((side.stream, before.stream, split.stream), (1, 0, 0));
        assert_eq!(side.node, split.node);
        assert!(side.start_ms >= before.end_ms, "{side:?} before {before:?}");
    }
    let profiled = exe.profile().unwrap();
    let profiled = profiled
        .iter()
        .filter(|(_, op, _)| op == "l2_prefetch")
        .count();
    assert_eq!(profiled, config.num_hidden_layers);
    println!(
        "l2 prefetch, bf16 decode batch 16: {} values equal (graph and eager)",
        on.len()
    );
}
