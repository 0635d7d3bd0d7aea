//! The planned executor (one host arena at the plan's offsets, dead bytes poisoned with NaN)
//! against the reference interpreter, bit for bit, on the real programs' real plans — prefill,
//! decode and train of both tiny families, 1 and 2 streams (the CPU executor runs the schedule in order, which every stream assignment allows).

use std::collections::BTreeMap;

use kiln_frontend::eval::CausalLmInputs;
use kiln_frontend::model::{random_weights, ModelConfig};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_ir::DType;
use kiln_kernels::testing;
use kiln_planner::{plan, verify_plan, PlanOptions};
use kiln_runtime::{execute, interpret, Device, Tensor};

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// Every input the program needs, with fresh random tokens and zeroed caches and moments.
fn bindings(
    rng: &mut rand::rngs::StdRng,
    config: &ModelConfig,
    kind: ProgramKind,
    options: &ProgramOptions,
) -> BTreeMap<String, Tensor> {
    let weights = random_weights(config, rand::Rng::random(rng)).unwrap();
    let mut values: BTreeMap<String, Tensor> = weights
        .named()
        .into_iter()
        .map(|(name, v)| (name, v.value().clone()))
        .collect();
    let graph = build(kind, config, options).unwrap();
    let (batch, seq) = (options.batch, options.seq);
    let ids = testing::indices(rng, batch * seq, config.vocab_size);
    for (_, name, input_kind, ty) in graph.inputs() {
        if values.contains_key(name) {
            continue;
        }
        let tensor = match name {
            "tokens" if kind == ProgramKind::Decode => {
                Tensor::from_vec(ids[..batch].to_vec(), [batch, 1]).unwrap()
            }
            "tokens" | "positions" | "targets" if kind != ProgramKind::Decode => {
                let inputs = CausalLmInputs::new(
                    &Tensor::from_vec(ids.clone(), [batch, seq]).unwrap(),
                    config.vocab_size,
                )
                .unwrap();
                let found = inputs
                    .named()
                    .into_iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, t)| t.clone());
                found.unwrap()
            }
            // Decode at position 3 of caches that hold random history.
            "positions" => Tensor::from_vec(vec![3i64; batch], [batch]).unwrap(),
            "cache_positions" => Tensor::from_vec(vec![0i64; batch], [batch]).unwrap(),
            "step" => Tensor::from_vec(vec![1i64], kiln_ir::Shape::scalar()).unwrap(),
            "lr" => Tensor::scalar(1e-3, DType::F64),
            "loss_seed" => Tensor::scalar(1.0, DType::F32),
            _ if input_kind == kiln_ir::InputKind::State && name.starts_with("cache.") => {
                let values = testing::signed(rng, ty.shape.numel());
                Tensor::from_vec(testing::to_f32(&values), ty.shape.clone()).unwrap()
            }
            _ => Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu),
        };
        values.insert(name.to_string(), tensor);
    }
    values
}

#[test]
fn planned_executor_equals_interpreter_bit_for_bit() {
    let mut rng = testing::rng("planned_executor");
    let config = ModelConfig::tiny();
    let options = ProgramOptions {
        batch: 2,
        seq: 6,
        max_seq: Some(12),
        ..Default::default()
    };
    // The rank programs of a world of one, whose all-reduces (on the communication stream)
    // the reference kernels run as the identity.
    let data_parallel = ProgramOptions {
        data_parallel: Some(kiln_frontend::programs::DataParallel {
            bucket_bytes: 40_000,
        }),
        ..options.clone()
    };
    let tensor_parallel = ProgramOptions {
        tensor_parallel: Some(1),
        ..options.clone()
    };
    for (kind, options) in [
        (ProgramKind::Prefill, &options),
        (ProgramKind::Decode, &options),
        (ProgramKind::Train, &options),
        (ProgramKind::Train, &data_parallel),
        (ProgramKind::Decode, &tensor_parallel),
    ] {
        let graph = build(kind, &config, options).unwrap();
        let values = bindings(&mut rng, &config, kind, options);
        let mut reference_values = values.clone();
        let reference = interpret(&graph, &mut reference_values).unwrap();
        for streams in [1, 2] {
            let planned = plan(
                &graph,
                &PlanOptions {
                    streams,
                    ..Default::default()
                },
                &kiln_runtime::Workspaces::Cpu,
            )
            .unwrap();
            verify_plan(&graph, &planned, &kiln_runtime::Workspaces::Cpu).unwrap();
            let mut planned_values = values.clone();
            let outputs = execute(&graph, &planned, &mut planned_values, true).unwrap();
            assert_eq!(
                outputs.keys().collect::<Vec<_>>(),
                reference.keys().collect::<Vec<_>>()
            );
            for (name, tensor) in &outputs {
                assert_eq!(
                    bits(tensor),
                    bits(&reference[name]),
                    "{} streams={streams}: output {name}",
                    kind.name()
                );
            }
            for (name, _) in graph.writes() {
                assert_eq!(
                    bits(&planned_values[name]),
                    bits(&reference_values[name]),
                    "{} streams={streams}: write {name}",
                    kind.name()
                );
            }
        }
    }
}
