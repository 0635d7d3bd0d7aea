//! The reference interpreter's checks: input bindings, graph order, writes, node errors, and
//! the storage rules (fresh results, zero-copy views).

mod common;

use std::collections::BTreeMap;

use common::{bits, random_f32, type_of};
use kiln_ir::{DType, Graph, InputKind, Op, Shape, TensorType};
use kiln_kernels::testing;
use kiln_runtime::{interpret, Error, Tensor};

/// `y = 2·x` over an f32 input `x [2,3]`, output `y`.
fn doubling() -> Graph {
    let mut graph = Graph::new("double");
    let x = graph
        .input(
            "x",
            InputKind::Input,
            TensorType::new(DType::F32, [2, 3]).unwrap(),
        )
        .unwrap();
    let y = graph.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap();
    graph.output("y", y).unwrap();
    graph
}

#[test]
fn a_missing_binding_is_refused_by_name() {
    let mut values = BTreeMap::new();
    values.insert("z".to_string(), Tensor::scalar(1.0, DType::F32));
    let err = interpret(&doubling(), &mut values).unwrap_err();
    assert!(
        matches!(&err, Error::MissingInput { name, .. } if name == "x"),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("`x`") && message.contains("f32[2,3]"),
        "{message}"
    );
}

#[test]
fn a_binding_of_another_type_is_refused_naming_both_types() {
    let mut rng = testing::rng("a_binding_of_another_type_is_refused_naming_both_types");
    let wrong_shape = random_f32(&mut rng, &[3, 2]).0;
    let wrong_dtype = Tensor::from_vec(testing::signed(&mut rng, 6), [2, 3]).unwrap();
    for (tensor, found) in [(wrong_shape, "f32[3,2]"), (wrong_dtype, "f64[2,3]")] {
        let mut values = BTreeMap::from([("x".to_string(), tensor)]);
        let err = interpret(&doubling(), &mut values).unwrap_err();
        assert!(matches!(err, Error::InputType { .. }), "{err}");
        let message = err.to_string();
        for part in ["`x`", "f32[2,3]", found] {
            assert!(message.contains(part), "{message} lacks {part}");
        }
    }
}

#[test]
fn a_graph_whose_node_order_is_not_topological_is_refused() {
    let mut graph = Graph::new("out_of_order");
    let x = graph
        .input(
            "x",
            InputKind::Input,
            TensorType::new(DType::F32, [4]).unwrap(),
        )
        .unwrap();
    let a = graph.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap();
    let b = graph.op1(Op::Scale { alpha: 3.0 }, &[a]).unwrap();
    graph.output("b", b).unwrap();
    // Rewire: node a now reads node b, defined after it.
    let raw = graph.raw_mut();
    let edge = raw.find_edge(x.node, a.node).unwrap();
    let weight = raw.remove_edge(edge).unwrap();
    raw.add_edge(b.node, a.node, weight);
    let mut values = BTreeMap::from([(
        "x".to_string(),
        Tensor::from_vec(vec![1f32, -2.0, 0.5, 3.0], [4]).unwrap(),
    )]);
    let err = interpret(&graph, &mut values).unwrap_err();
    assert!(matches!(err, Error::Graph { .. }), "{err}");
    let message = err.to_string();
    assert!(message.contains("node %1 (scale"), "{message}");
    assert!(message.contains("topological"), "{message}");
}

#[test]
fn a_kernel_error_names_the_node_and_wraps_the_kernel_error() {
    let mut graph = Graph::new("lookup");
    let weight = graph
        .input(
            "weight",
            InputKind::Param,
            TensorType::new(DType::F32, [3, 2]).unwrap(),
        )
        .unwrap();
    let ids = graph
        .input(
            "ids",
            InputKind::Input,
            TensorType::new(DType::I64, [2]).unwrap(),
        )
        .unwrap();
    let e = graph.op1(Op::Embedding, &[weight, ids]).unwrap();
    graph.output("e", e).unwrap();
    let mut values = BTreeMap::from([
        (
            "weight".to_string(),
            Tensor::from_vec(vec![0.5f32, 1.0, -1.5, 2.0, 0.25, -0.75], [3, 2]).unwrap(),
        ),
        (
            "ids".to_string(),
            Tensor::from_vec(vec![1i64, 7], [2]).unwrap(),
        ),
    ]);
    let err = interpret(&graph, &mut values).unwrap_err();
    let Error::Node { node, op, source } = &err else {
        panic!("expected a node error, got {err}");
    };
    assert_eq!((*node, op.as_str()), (2, "embedding"));
    assert!(
        matches!(
            source.as_ref(),
            Error::Kernel(k) if matches!(**k, kiln_kernels::Error::IndexOutOfRange { value: 7, .. })
        ),
        "{source}"
    );
    assert!(err.to_string().contains("`ids`"), "{err}");
}

#[test]
fn writes_replace_state_values_and_outputs_are_returned() {
    let mut graph = Graph::new("counter");
    let ty = TensorType::new(DType::F32, [3]).unwrap();
    let total = graph.input("total", InputKind::State, ty.clone()).unwrap();
    let x = graph.input("x", InputKind::Input, ty).unwrap();
    let sum = graph.op1(Op::Add, &[total, x]).unwrap();
    graph.write("total", sum).unwrap();
    graph.output("sum", sum).unwrap();

    let old = Tensor::from_vec(vec![1f32, 2.0, 3.0], [3]).unwrap();
    let x_value = Tensor::from_vec(vec![0.5f32, -1.0, 4.0], [3]).unwrap();
    let mut values = BTreeMap::from([
        ("total".to_string(), old.clone()),
        ("x".to_string(), x_value.clone()),
    ]);
    let outputs = interpret(&graph, &mut values).unwrap();
    assert_eq!(outputs.keys().collect::<Vec<_>>(), ["sum"]);
    assert_eq!(values["total"].to_vec::<f32>().unwrap(), [1.5, 1.0, 7.0]);
    assert!(values["total"].storage().same(outputs["sum"].storage()));
    // Replaced, not mutated: the old tensor keeps its elements.
    assert_eq!(old.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0]);
    // A second run reads the written state.
    interpret(&graph, &mut values).unwrap();
    assert_eq!(values["total"].to_vec::<f32>().unwrap(), [2.0, 0.0, 11.0]);
    assert_eq!(values.len(), 2);
}

#[test]
fn an_output_naming_no_value_is_refused_and_nothing_is_written() {
    let mut graph = Graph::new("dangling");
    let ty = TensorType::new(DType::F32, [2]).unwrap();
    let state = graph.input("s", InputKind::State, ty).unwrap();
    let doubled = graph.op1(Op::Scale { alpha: 2.0 }, &[state]).unwrap();
    graph.write("s", doubled).unwrap();
    let missing = kiln_ir::ValueId {
        node: doubled.node,
        port: 3,
    };
    graph.push_unchecked(Some(("ghost".to_string(), missing)), None);
    let old = Tensor::from_vec(vec![1f32, 2.0], [2]).unwrap();
    let mut values = BTreeMap::from([("s".to_string(), old.clone())]);
    let err = interpret(&graph, &mut values).unwrap_err();
    assert!(matches!(err, Error::Graph { .. }), "{err}");
    assert!(err.to_string().contains("output `ghost`"), "{err}");
    assert!(values["s"].storage().same(old.storage()));
}

#[test]
fn views_share_storage_and_op_results_are_fresh() {
    let mut rng = testing::rng("views_share_storage_and_op_results_are_fresh");
    let (x, _) = random_f32(&mut rng, &[2, 6]);
    let mut graph = Graph::new("views");
    let x_id = graph.input("x", InputKind::Input, type_of(&x)).unwrap();
    let r = graph
        .op1(
            Op::Reshape {
                shape: Shape::new(&[3, 4]),
            },
            &[x_id],
        )
        .unwrap();
    let t = graph.op1(Op::Transpose { dim0: 0, dim1: 1 }, &[r]).unwrap();
    let s = graph
        .op1(
            Op::Slice {
                axis: 1,
                start: 1,
                end: 3,
            },
            &[t],
        )
        .unwrap();
    let c = graph.op1(Op::Contiguous, &[s]).unwrap();
    let c_of_x = graph.op1(Op::Contiguous, &[x_id]).unwrap();
    let y = graph.op1(Op::Scale { alpha: 1.0 }, &[x_id]).unwrap();
    for (name, value) in [
        ("r", r),
        ("t", t),
        ("s", s),
        ("c", c),
        ("c_of_x", c_of_x),
        ("y", y),
    ] {
        graph.output(name, value).unwrap();
    }
    let mut values = BTreeMap::from([("x".to_string(), x.clone())]);
    let out = interpret(&graph, &mut values).unwrap();
    for name in ["r", "t", "s", "c_of_x"] {
        assert!(
            out[name].storage().same(x.storage()),
            "{name} should be a view of x"
        );
    }
    for name in ["c", "y"] {
        assert!(
            !out[name].storage().same(x.storage()),
            "{name} should be fresh"
        );
    }
    assert!(out["c"].is_contiguous() && !out["s"].is_contiguous());
    assert_eq!(bits(&out["c"]), bits(&out["s"]));
    // s = x viewed [3,4], transposed to [4,3], columns 1..3.
    let xv = x.to_vec::<f32>().unwrap();
    let want: Vec<f32> = (0..4)
        .flat_map(|i| (1..3).map(move |j| (i, j)))
        .map(|(i, j)| xv[j * 4 + i])
        .collect();
    assert_eq!(out["c"].to_vec::<f32>().unwrap(), want);
    assert_eq!(out["c"].dims(), [4, 2]);
}
