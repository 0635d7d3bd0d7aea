//! AdamW in the reference interpreter: one optimizer step, bit for bit against the kernel,
//! with param and moments written back as new tensors.

mod common;

use std::collections::BTreeMap;

use common::{bind, bits, f32_bits, random_f32, view, view_mut};
use kiln_ir::{AdamWConfig, Graph, InputKind, Op, Shape};
use kiln_kernels::testing;
use kiln_runtime::{interpret, Error, Tensor};

/// One AdamW step as a training graph does it: param and moments written back.
fn adamw_graph(
    values: &mut BTreeMap<String, Tensor>,
    tensors: [&Tensor; 6],
    config: AdamWConfig,
) -> Graph {
    let mut graph = Graph::new("adamw");
    let names = ["w", "grad", "m", "v", "step", "lr"];
    let kinds = [
        InputKind::Param,
        InputKind::Input,
        InputKind::State,
        InputKind::State,
        InputKind::Input,
        InputKind::Input,
    ];
    let ids: Vec<_> = (0..6)
        .map(|i| bind(&mut graph, values, names[i], kinds[i], tensors[i]))
        .collect();
    let updated = graph.op(Op::AdamW(config), &ids).unwrap();
    for (name, value) in ["w", "m", "v"].into_iter().zip(updated) {
        graph.write(name, value).unwrap();
    }
    graph
}

#[test]
fn adamw_matches_the_kernel_and_replaces_param_and_moments() {
    let mut rng = testing::rng("adamw_matches_the_kernel_and_replaces_param_and_moments");
    let dims = [3, 7];
    let (w, w_v) = random_f32(&mut rng, &dims);
    let (grad, grad_v) = random_f32(&mut rng, &dims);
    let (m, m_v) = random_f32(&mut rng, &dims);
    // Second moments are non-negative.
    let v_v: Vec<f32> = testing::to_f32(&testing::uniform(&mut rng, 21, 0.0, 0.1));
    let v = Tensor::from_vec(v_v.clone(), dims).unwrap();
    let step = Tensor::from_vec(vec![3i64], Shape::scalar()).unwrap();
    let lr = Tensor::scalar(1e-2, kiln_ir::DType::F64);
    let config = AdamWConfig {
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut values = BTreeMap::new();
    let graph = adamw_graph(&mut values, [&w, &grad, &m, &v, &step, &lr], config);
    let outputs = interpret(&graph, &mut values).unwrap();
    assert!(outputs.is_empty());

    let (mut w_want, mut m_want, mut v_want) = (w_v.clone(), m_v.clone(), v_v.clone());
    let kernel_config = kiln_kernels::optim::AdamW {
        lr: 1e-2,
        beta1: config.beta1,
        beta2: config.beta2,
        eps: config.eps,
        weight_decay: config.weight_decay,
    };
    kiln_kernels::optim::adamw(
        &mut view_mut(&mut w_want, &dims),
        &view(&grad_v, &dims),
        &mut view_mut(&mut m_want, &dims),
        &mut view_mut(&mut v_want, &dims),
        (3, None),
        &kernel_config,
    )
    .unwrap();
    assert_eq!(bits(&values["w"]), f32_bits(&w_want));
    assert_eq!(bits(&values["m"]), f32_bits(&m_want));
    assert_eq!(bits(&values["v"]), f32_bits(&v_want));
    assert_ne!(w_want, w_v);
    // The tensors bound before the run are untouched: the new values are new tensors.
    assert_eq!(bits(&w), f32_bits(&w_v));
    assert_eq!(bits(&m), f32_bits(&m_v));
    assert_eq!(bits(&v), f32_bits(&v_v));
    assert!(!values["w"].storage().same(w.storage()));
}

#[test]
fn adamw_refuses_a_step_below_one_naming_the_node() {
    let mut rng = testing::rng("adamw_refuses_a_step_below_one_naming_the_node");
    let dims = [2, 3];
    let tensors: Vec<Tensor> = (0..4).map(|_| random_f32(&mut rng, &dims).0).collect();
    let lr = Tensor::scalar(1e-3, kiln_ir::DType::F64);
    for step in [0i64, -2] {
        let step = Tensor::from_vec(vec![step], Shape::scalar()).unwrap();
        let mut values = BTreeMap::new();
        let all = [
            &tensors[0],
            &tensors[1],
            &tensors[2],
            &tensors[3],
            &step,
            &lr,
        ];
        let graph = adamw_graph(
            &mut values,
            all,
            AdamWConfig {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.0,
            },
        );
        let before = values.clone();
        let err = interpret(&graph, &mut values).unwrap_err();
        assert!(matches!(err, Error::Node { node: 6, .. }), "{err}");
        let message = err.to_string();
        assert!(message.contains("node %6 (adamw"), "{message}");
        assert!(message.contains("`step`"), "{message}");
        // A failed run writes nothing.
        for (name, tensor) in &before {
            assert!(values[name].storage().same(tensor.storage()), "{name}");
        }
    }
}
