//! The CPU executable (memory owned for its whole life, eager runs or captured replays) on the
//! real programs' real plans, both tiny families: an eager run equals `execute` bit for bit, a
//! replay equals an eager run, decode steps replayed at successive positions carry the caches
//! between replays, and train steps replayed update params and moments in their slots.

use std::collections::BTreeMap;

use kiln_frontend::eval::CausalLmInputs;
use kiln_frontend::model::{random_weights, ModelConfig, Precision};
use kiln_frontend::programs::{build, plan_program, ProgramKind, ProgramOptions};
use kiln_ir::{DType, Graph};
use kiln_kernels::testing;
use kiln_planner::{plan, verify_plan, Plan, PlanOptions};
use kiln_runtime::{execute, CpuExecutable, Device, Tensor};
use rand::rngs::StdRng;

fn bits(t: &Tensor) -> Vec<u64> {
    let values = t.to_f64_vec().unwrap();
    values.iter().map(|v| v.to_bits()).collect()
}

fn options() -> ProgramOptions {
    ProgramOptions {
        batch: 2,
        seq: 5,
        max_seq: Some(12),
        ..Default::default()
    }
}

fn program(config: &ModelConfig, kind: ProgramKind, streams: usize) -> (Graph, Plan) {
    let graph = build(kind, config, &options()).unwrap();
    let options = PlanOptions {
        streams,
        ..Default::default()
    };
    let planned = plan(&graph, &options, &kiln_runtime::Workspaces::Cpu).unwrap();
    verify_plan(&graph, &planned, &kiln_runtime::Workspaces::Cpu).unwrap();
    (graph, planned)
}

/// Fresh random tokens, positions and targets for `kind` (decode: one token per row at
/// `position`).
fn per_step(
    rng: &mut StdRng,
    config: &ModelConfig,
    kind: ProgramKind,
    position: i64,
) -> BTreeMap<String, Tensor> {
    let (batch, seq) = (options().batch, options().seq);
    let mut values = BTreeMap::new();
    if kind == ProgramKind::Decode {
        let ids = testing::indices(rng, batch, config.vocab_size);
        values.insert("tokens".into(), Tensor::from_vec(ids, [batch, 1]).unwrap());
        let positions = Tensor::from_vec(vec![position; batch], [batch]).unwrap();
        values.insert("positions".into(), positions);
        return values;
    }
    let ids = testing::indices(rng, batch * seq, config.vocab_size);
    let tokens = Tensor::from_vec(ids, [batch, seq]).unwrap();
    let inputs = CausalLmInputs::new(&tokens, config.vocab_size).unwrap();
    // Prefill takes no targets.
    let named = inputs.named().into_iter();
    for (name, tensor) in named.filter(|(n, _)| kind == ProgramKind::Train || *n != "targets") {
        values.insert(name.to_string(), tensor.clone());
    }
    values
}

/// Every input of `graph`: random weights, `per_step` inputs, caches of random history,
/// zeroed moments, step 1.
fn inputs(
    rng: &mut StdRng,
    config: &ModelConfig,
    kind: ProgramKind,
    graph: &Graph,
) -> BTreeMap<String, Tensor> {
    let weights = random_weights(config, rand::Rng::random(rng)).unwrap();
    let mut values: BTreeMap<String, Tensor> = (weights.named().into_iter())
        .map(|(name, v)| (name, v.value().clone()))
        .collect();
    values.extend(per_step(rng, config, kind, 3));
    for (_, name, _, ty) in graph.inputs() {
        if values.contains_key(name) {
            continue;
        }
        let tensor = match name {
            "cache_positions" => {
                let batch = options().batch;
                Tensor::from_vec(vec![0i64; batch], [batch]).unwrap()
            }
            "step" => Tensor::from_vec(vec![1i64], kiln_ir::Shape::scalar()).unwrap(),
            "lr" => Tensor::scalar(1e-3, DType::F64),
            "loss_seed" => Tensor::scalar(1.0, DType::F32),
            _ if name.starts_with("cache.") => {
                let values = testing::signed(rng, ty.shape.numel());
                Tensor::from_vec(testing::to_f32(&values), ty.shape.clone()).unwrap()
            }
            _ => Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu),
        };
        values.insert(name.to_string(), tensor);
    }
    values
}

fn executable(graph: &Graph, plan: &Plan, values: &BTreeMap<String, Tensor>) -> CpuExecutable {
    let mut executable = CpuExecutable::new(graph, plan).unwrap();
    for (name, tensor) in values {
        executable.set(name, tensor).unwrap();
    }
    executable
}

/// `executable`'s outputs and written inputs equal `outputs` and `values`, bit for bit.
#[track_caller]
fn assert_same(
    what: &str,
    graph: &Graph,
    executable: &CpuExecutable,
    outputs: &BTreeMap<String, Tensor>,
    values: &BTreeMap<String, Tensor>,
) {
    assert!(!outputs.is_empty(), "{what}");
    for (name, want) in outputs {
        let got = executable.get(name).unwrap();
        assert_eq!(got.dims(), want.dims(), "{what}: output {name}");
        assert_eq!(bits(&got), bits(want), "{what}: output {name}");
        assert!(bits(want).iter().any(|&b| b != 0), "{what}: {name} is zero");
    }
    for (name, _) in graph.writes() {
        let got = executable.get(name).unwrap();
        assert_eq!(bits(&got), bits(&values[name]), "{what}: write {name}");
    }
}

#[test]
fn eager_runs_and_replays_equal_execute_for_every_program() {
    let mut rng = testing::rng("cpu_executable_every_program");
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        for kind in [
            ProgramKind::Prefill,
            ProgramKind::Decode,
            ProgramKind::Train,
        ] {
            for streams in [1, 2] {
                let what = format!("{} streams={streams}", kind.name());
                let (graph, plan) = program(&config, kind, streams);
                let mut values = inputs(&mut rng, &config, kind, &graph);
                let mut eager = executable(&graph, &plan, &values);
                let mut replayed = executable(&graph, &plan, &values);
                replayed.capture().unwrap();
                // View steps record no launch; every other step records its kernels.
                let views = ["reshape", "transpose", "slice"];
                let kernels = (plan.schedule.iter())
                    .filter(|step| !views.iter().any(|v| step.op.starts_with(v)))
                    .count();
                let launches = replayed.captured_launches().unwrap();
                assert!(
                    launches >= kernels,
                    "{what}: {launches} launches, {kernels} kernels"
                );
                let outputs = execute(&graph, &plan, &mut values, false).unwrap();
                eager.run().unwrap();
                replayed.replay().unwrap();
                assert_same(&what, &graph, &eager, &outputs, &values);
                assert_same(&what, &graph, &replayed, &outputs, &values);
            }
        }
    }
}

#[test]
fn decode_steps_replayed_at_successive_positions_equal_eager_steps() {
    let mut rng = testing::rng("cpu_executable_decode");
    let config = ModelConfig::tiny();
    let (prefill_graph, prefill_plan) = program(&config, ProgramKind::Prefill, 1);
    let (decode_graph, decode_plan) = program(&config, ProgramKind::Decode, 2);
    let mut values = inputs(&mut rng, &config, ProgramKind::Prefill, &prefill_graph);
    let mut prefill = executable(&prefill_graph, &prefill_plan, &values);
    prefill.run().unwrap();
    let outputs = execute(&prefill_graph, &prefill_plan, &mut values, false).unwrap();
    assert_same("prefill", &prefill_graph, &prefill, &outputs, &values);

    // Both decode executables start from the prefill executable's caches.
    let mut start = BTreeMap::new();
    for (_, name, _, _) in decode_graph.inputs() {
        let tensor = match values.get(name) {
            Some(_) if name.starts_with("cache.") => prefill.get(name).unwrap(),
            Some(tensor) => tensor.clone(),
            None => continue,
        };
        start.insert(name.to_string(), tensor);
    }
    start.extend(per_step(&mut rng, &config, ProgramKind::Decode, 0));
    let mut eager = executable(&decode_graph, &decode_plan, &start);
    let mut replayed = executable(&decode_graph, &decode_plan, &start);
    replayed.capture().unwrap();
    let launches = replayed.captured_launches();
    let mut reference = start;
    let mut previous_logits = Vec::new();
    let first_cache = decode_graph.writes()[0].0.clone();
    for step in 0..4 {
        let position = options().seq as i64 + step;
        let fresh = per_step(&mut rng, &config, ProgramKind::Decode, position);
        for (name, tensor) in &fresh {
            eager.set(name, tensor).unwrap();
            replayed.set(name, tensor).unwrap();
        }
        let cache_before = bits(&replayed.get(&first_cache).unwrap());
        reference.extend(fresh);
        let outputs = execute(&decode_graph, &decode_plan, &mut reference, false).unwrap();
        eager.run().unwrap();
        replayed.replay().unwrap();
        let what = format!("decode step {step} at position {position}");
        assert_same(&what, &decode_graph, &eager, &outputs, &reference);
        assert_same(&what, &decode_graph, &replayed, &outputs, &reference);
        // The step appended to the cache the replay carried over, and the logits moved on.
        assert_ne!(bits(&replayed.get(&first_cache).unwrap()), cache_before);
        let logits = bits(&replayed.get("logits").unwrap());
        assert_ne!(logits, previous_logits, "{what}");
        previous_logits = logits;
        // One capture serves every step.
        assert_eq!(replayed.captured_launches(), launches);
    }
}

#[test]
fn train_steps_replayed_equal_eager_steps() {
    let mut rng = testing::rng("cpu_executable_train");
    let config = ModelConfig::tiny_llama();
    let (graph, plan) = program(&config, ProgramKind::Train, 2);
    let mut reference = inputs(&mut rng, &config, ProgramKind::Train, &graph);
    let initial = reference.clone();
    let mut eager = executable(&graph, &plan, &reference);
    let mut replayed = executable(&graph, &plan, &reference);
    replayed.capture().unwrap();
    for step in 1..=2i64 {
        let mut fresh = per_step(&mut rng, &config, ProgramKind::Train, 0);
        let step_tensor = Tensor::from_vec(vec![step], kiln_ir::Shape::scalar()).unwrap();
        fresh.insert("step".into(), step_tensor);
        for (name, tensor) in &fresh {
            eager.set(name, tensor).unwrap();
            replayed.set(name, tensor).unwrap();
        }
        reference.extend(fresh);
        let outputs = execute(&graph, &plan, &mut reference, false).unwrap();
        eager.run().unwrap();
        replayed.replay().unwrap();
        let what = format!("train step {step}");
        assert_same(&what, &graph, &eager, &outputs, &reference);
        assert_same(&what, &graph, &replayed, &outputs, &reference);
    }
    // Every param and moment moved from where it started.
    for (name, _) in graph.writes() {
        let now = bits(&replayed.get(name).unwrap());
        assert_ne!(now, bits(&initial[name]), "{name} never changed");
    }
}

#[test]
fn an_unset_input_is_named_and_replay_needs_a_capture() {
    let mut rng = testing::rng("cpu_executable_errors");
    let config = ModelConfig::tiny();
    let (graph, plan) = program(&config, ProgramKind::Decode, 1);
    let values = inputs(&mut rng, &config, ProgramKind::Decode, &graph);
    let mut exe = CpuExecutable::new(&graph, &plan).unwrap();
    for (name, tensor) in values.iter().filter(|(n, _)| *n != "positions") {
        exe.set(name, tensor).unwrap();
    }
    let err = exe.run().unwrap_err().to_string();
    assert!(err.contains("`positions`"), "{err}");
    let err = exe.replay().unwrap_err().to_string();
    assert!(err.contains("capture"), "{err}");
    let err = exe
        .set("positions", &values["tokens"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("positions"), "{err}");
    exe.set("positions", &values["positions"]).unwrap();
    exe.run().unwrap();
    assert!(bits(&exe.get("logits").unwrap()).iter().any(|&b| b != 0));
    // A plan of another program is refused without a panic.
    let (prefill, _) = program(&config, ProgramKind::Prefill, 1);
    assert!(CpuExecutable::new(&prefill, &plan).is_err());
}

/// Index inputs are checked where they enter: a token id outside the vocabulary and a decode
/// position past the cache are refused by `set` with an error naming the input, the value and
/// the range (the CUDA executable checks the same rules).
#[test]
fn set_refuses_out_of_range_ids_and_positions() {
    let config = ModelConfig::tiny();
    let (graph, planned) = program(&config, ProgramKind::Decode, 1);
    let mut exe = CpuExecutable::new(&graph, &planned).unwrap();
    let vocab = config.vocab_size as i64;
    let tokens = Tensor::from_vec(vec![3, vocab], [2, 1]).unwrap();
    let err = exe.set("tokens", &tokens).unwrap_err().to_string();
    assert!(
        err.contains("`tokens`") && err.contains(&format!("{vocab} at element 1")),
        "{err}"
    );
    assert!(err.contains(&format!("outside 0..{vocab}")), "{err}");
    // A cache of 12 rows: one new row fits at positions 0..=11.
    let positions = Tensor::from_vec(vec![11i64, 12], [2]).unwrap();
    let err = exe.set("positions", &positions).unwrap_err().to_string();
    assert!(
        err.contains("12 at element 1") && err.contains("0..12"),
        "{err}"
    );
    let negative = Tensor::from_vec(vec![-1i64, 0], [2]).unwrap();
    assert!(exe.set("positions", &negative).is_err());
    exe.set("positions", &Tensor::from_vec(vec![11i64, 0], [2]).unwrap())
        .unwrap();
}

/// A train step planned under a memory budget (values recomputed in the backward) gives the
/// bits of the unbudgeted step: outputs, updated params and moments, in f32 and in mixed
/// precision, on the CPU executable and against the unbudgeted `execute`.
#[test]
fn a_budgeted_train_step_equals_the_unbudgeted_one_bit_for_bit() {
    let mut rng = testing::rng("cpu_executable_budgeted_train");
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        for precision in [Precision::F32, Precision::Bf16Gemm, Precision::Bf16Swiglu] {
            let what = format!("{:?} {precision:?}", config.family);
            // Rows enough that saved activations, not gradients, make the peak.
            let program_options = ProgramOptions {
                precision,
                seq: 12,
                ..options()
            };
            let graph = build(ProgramKind::Train, &config, &program_options).unwrap();
            let workspaces = kiln_runtime::Workspaces::Cpu;
            let unbudgeted = plan(&graph, &PlanOptions::default(), &workspaces).unwrap();
            let budget = unbudgeted.arena_bytes - 1;
            let (budgeted_graph, budgeted) = plan_program(
                graph.clone(),
                &PlanOptions::default(),
                &workspaces,
                Some(budget),
            )
            .unwrap();
            assert!(budgeted.arena_bytes <= budget, "{what}");
            assert!(!budgeted.recomputed.is_empty(), "{what}");
            verify_plan(&budgeted_graph, &budgeted, &workspaces).unwrap();

            let mut values = inputs(&mut rng, &config, ProgramKind::Train, &graph);
            values.extend(train_step_inputs(&mut rng, &config, program_options.seq));
            // Derived copies are set with their params.
            for (copy, _) in graph.derived() {
                values.remove(copy);
            }
            let mut budgeted_values = values.clone();
            let outputs = execute(&graph, &unbudgeted, &mut values, false).unwrap();
            let mut exe = executable(&budgeted_graph, &budgeted, &budgeted_values);
            exe.run().unwrap();
            assert_same(&what, &budgeted_graph, &exe, &outputs, &values);
            let again = execute(&budgeted_graph, &budgeted, &mut budgeted_values, false).unwrap();
            for (name, want) in &outputs {
                assert_eq!(bits(&again[name]), bits(want), "{what}: {name}");
            }
        }
    }
}

/// A budget below what recomputing every candidate reaches is refused with both numbers;
/// a program without a backward cannot take one.
#[test]
fn an_unreachable_budget_and_a_budget_without_backward_are_refused() {
    let config = ModelConfig::tiny();
    let workspaces = kiln_runtime::Workspaces::Cpu;
    let train = build(ProgramKind::Train, &config, &options()).unwrap();
    let error = plan_program(train, &PlanOptions::default(), &workspaces, Some(1000))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("no plan fits the memory budget of 1000"),
        "{error}"
    );
    let prefill = build(ProgramKind::Prefill, &config, &options()).unwrap();
    let error = plan_program(prefill, &PlanOptions::default(), &workspaces, Some(1000))
        .unwrap_err()
        .to_string();
    assert!(error.contains("no backward"), "{error}");
}

/// Tokens, positions and targets of `seq` tokens per row (the per-step inputs of
/// [`per_step`] are of `options().seq`).
fn train_step_inputs(
    rng: &mut StdRng,
    config: &ModelConfig,
    seq: usize,
) -> BTreeMap<String, Tensor> {
    let batch = options().batch;
    let ids = testing::indices(rng, batch * seq, config.vocab_size);
    let tokens = Tensor::from_vec(ids, [batch, seq]).unwrap();
    let inputs = CausalLmInputs::new(&tokens, config.vocab_size).unwrap();
    (inputs.named().into_iter())
        .map(|(name, tensor)| (name.to_string(), tensor.clone()))
        .collect()
}
