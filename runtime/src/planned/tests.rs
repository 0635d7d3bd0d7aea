//! The planned executor against the interpreter, bit for bit with poison on, on small
//! hand-built graphs with hand-made plans (each checked by the plan verifier first).

mod kernels;
mod plans;
mod wrong;

use std::collections::BTreeMap;

use half::bf16;
use kiln_ir::{DType, Graph, InputKind, Shape, TensorType, ValueId};
use kiln_kernels::testing;
use kiln_planner::{verify_plan, Plan};
use rand::rngs::StdRng;

use super::execute;
use crate::placed::bytes;
use crate::{interpret, Tensor};
use plans::{arena, bound, make_plan, output};

/// An f32 tensor of uniform values in `[-1, 1)`.
fn random(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let values = testing::to_f32(&testing::signed(rng, dims.iter().product()));
    Tensor::from_vec(values, dims).unwrap()
}

/// A bf16 tensor of uniform values in `[-1, 1)`.
fn random_bf16(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let values = testing::signed(rng, dims.iter().product());
    Tensor::from_vec(
        values.into_iter().map(bf16::from_f64).collect::<Vec<_>>(),
        dims,
    )
    .unwrap()
}

/// Declares `tensor` as graph input `name` of `kind` and binds it in `values`.
fn bind(
    graph: &mut Graph,
    values: &mut BTreeMap<String, Tensor>,
    name: &str,
    kind: InputKind,
    tensor: &Tensor,
) -> ValueId {
    values.insert(name.to_string(), tensor.clone());
    let ty = TensorType::new(tensor.dtype(), tensor.shape().clone()).unwrap();
    graph.input(name, kind, ty).unwrap()
}

/// The dtype, dims and raw bytes of a tensor's elements in row-major order.
fn raw(tensor: &Tensor) -> (DType, Vec<usize>, Vec<u8>) {
    let dense = tensor.deep_clone().unwrap();
    let bytes = dense
        .read_with(|v| bytes::of_data(v.data()).to_vec())
        .unwrap();
    (tensor.dtype(), tensor.dims().to_vec(), bytes)
}

fn raw_map(map: &BTreeMap<String, Tensor>) -> BTreeMap<String, (DType, Vec<usize>, Vec<u8>)> {
    map.iter().map(|(k, t)| (k.clone(), raw(t))).collect()
}

/// Runs the interpreter and the executor (with `poison`) on copies of `values`; returns
/// (interpreter outputs and values after, executor outputs and values after), as raw bytes.
#[allow(clippy::type_complexity)]
fn both(
    graph: &Graph,
    plan: &Plan,
    values: &BTreeMap<String, Tensor>,
    poison: bool,
) -> [(
    BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>,
    BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>,
); 2] {
    let before = raw_map(values);
    let mut want_values = values.clone();
    let want = interpret(graph, &mut want_values).unwrap();
    let mut got_values = values.clone();
    let got = execute(graph, plan, &mut got_values, poison).unwrap();
    // Nothing bound was written: the caller's tensors hold what they held.
    assert_eq!(raw_map(values), before, "bound tensors changed");
    [
        (raw_map(&want), raw_map(&want_values)),
        (raw_map(&got), raw_map(&got_values)),
    ]
}

/// Checks `plan` with the verifier, then the executor with poison against the interpreter.
#[track_caller]
fn assert_matches_interpret(graph: &Graph, plan: &Plan, values: &BTreeMap<String, Tensor>) {
    verify_plan(graph, plan, &crate::Workspaces::Any).unwrap();
    let [want, got] = both(graph, plan, values, true);
    assert!(!want.0.is_empty(), "the graph has outputs");
    assert_eq!(got, want);
    // Never all zeros: every output holds some nonzero byte.
    for (name, (_, _, bytes)) in &want.0 {
        assert!(
            bytes.iter().any(|&b| b != 0),
            "output `{name}` is all zeros"
        );
    }
}

/// The offsets of two buffers share arena bytes.
fn share_bytes(plan: &Plan, a: usize, b: usize) -> bool {
    let (a, b) = (&plan.buffers[a], &plan.buffers[b]);
    let (a0, b0) = (a.offset.unwrap(), b.offset.unwrap());
    a0 < b0 + b.size && b0 < a0 + a.size
}

/// `x -> scale -> softmax -> scale -> add(w)`: the second scale reuses the first one's bytes
/// (lifetimes [0,1] and [2,3]), and the add writes in place over it.
pub(super) fn chain(rng: &mut StdRng) -> (Graph, Plan, BTreeMap<String, Tensor>) {
    use kiln_ir::Op;
    let mut graph = Graph::new("chain");
    let mut values = BTreeMap::new();
    let x = bind(
        &mut graph,
        &mut values,
        "x",
        InputKind::Input,
        &random(rng, &[4, 8]),
    );
    let w = bind(
        &mut graph,
        &mut values,
        "w",
        InputKind::Param,
        &random(rng, &[8]),
    );
    let a = graph.op1(Op::Scale { alpha: 3.0 }, &[x]).unwrap();
    let b = graph.op1(Op::Softmax, &[a]).unwrap();
    let c = graph.op1(Op::Scale { alpha: -0.5 }, &[b]).unwrap();
    let d = graph.op1(Op::Add, &[c, w]).unwrap();
    let e = graph.op1(Op::Mul, &[d, b]).unwrap();
    graph.output("e", e).unwrap();
    let plan = make_plan(
        &graph,
        &[
            bound(&[x]),
            bound(&[w]),
            arena(0, &[a]),
            arena(256, &[b]),
            arena(0, &[c, d]),
            output(&[e]),
        ],
    );
    (graph, plan, values)
}

#[test]
fn a_chain_reusing_arena_bytes_matches_the_interpreter() {
    let mut rng = testing::rng("a_chain_reusing_arena_bytes_matches_the_interpreter");
    let (graph, plan, values) = chain(&mut rng);
    assert!(
        share_bytes(&plan, 2, 4),
        "a and c share bytes at different times"
    );
    assert_matches_interpret(&graph, &plan, &values);
}

#[test]
fn views_of_activations_and_inputs_match_the_interpreter() {
    use kiln_ir::Op;
    let mut rng = testing::rng("views_of_activations_and_inputs_match_the_interpreter");
    let mut graph = Graph::new("views");
    let mut values = BTreeMap::new();
    let x = bind(
        &mut graph,
        &mut values,
        "x",
        InputKind::Input,
        &random(&mut rng, &[2, 3, 4]),
    );
    let p = bind(
        &mut graph,
        &mut values,
        "p",
        InputKind::Param,
        &random(&mut rng, &[4, 6]),
    );
    let a = graph.op1(Op::Scale { alpha: 1.5 }, &[x]).unwrap();
    let shape = Shape::new(&[6, 4]);
    let r = graph.op1(Op::Reshape { shape }, &[a]).unwrap();
    let t = graph.op1(Op::Transpose { dim0: 0, dim1: 1 }, &[r]).unwrap();
    let s = graph
        .op1(
            Op::Slice {
                axis: 1,
                start: 2,
                end: 5,
            },
            &[t],
        )
        .unwrap();
    // A kernel reading a strided view of an activation at a nonzero element offset.
    let c = graph.op1(Op::Contiguous, &[s]).unwrap();
    // And views of a bound param.
    let pt = graph.op1(Op::Transpose { dim0: 0, dim1: 1 }, &[p]).unwrap();
    let ps = graph
        .op1(
            Op::Slice {
                axis: 0,
                start: 1,
                end: 4,
            },
            &[pt],
        )
        .unwrap();
    let pc = graph.op1(Op::Contiguous, &[ps]).unwrap();
    let m = graph
        .op1(
            Op::MatMul {
                transpose_a: false,
                transpose_b: false,
            },
            &[c, pc],
        )
        .unwrap();
    graph.output("m", m).unwrap();
    graph.output("s", s).unwrap();
    graph.output("pt", pt).unwrap();
    let plan = make_plan(
        &graph,
        &[
            bound(&[x]),
            bound(&[p, pt, ps]),
            arena(256, &[a, r, t, s]),
            output(&[c]),
            arena(0, &[pc]),
            output(&[m]),
        ],
    );
    // `s` is an output that lives in an activation, kept to the last step.
    assert_eq!(plan.buffers[2].end, plan.schedule.len() - 1);
    assert_matches_interpret(&graph, &plan, &values);
}

#[test]
fn an_in_place_add_matches_the_interpreter() {
    use kiln_ir::Op;
    let mut rng = testing::rng("an_in_place_add_matches_the_interpreter");
    let mut graph = Graph::new("in_place");
    let mut values = BTreeMap::new();
    let x = bind(
        &mut graph,
        &mut values,
        "x",
        InputKind::Input,
        &random(&mut rng, &[3, 5]),
    );
    let y = bind(
        &mut graph,
        &mut values,
        "y",
        InputKind::Input,
        &random(&mut rng, &[5]),
    );
    let a = graph.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap();
    let b = graph.op1(Op::Add, &[a, y]).unwrap();
    let c = graph.op1(Op::Mul, &[b, b]).unwrap();
    let d = graph.op1(Op::Scale { alpha: -1.0 }, &[c]).unwrap();
    graph.output("d", d).unwrap();
    // b overwrites a; c overwrites b while reading it twice.
    let plan = make_plan(
        &graph,
        &[bound(&[x]), bound(&[y]), arena(0, &[a, b, c]), output(&[d])],
    );
    assert_matches_interpret(&graph, &plan, &values);

    // The same graph with the in-place chain in the input `x`'s own buffer: a private copy.
    let plan = make_plan(&graph, &[bound(&[x, a, b, c]), bound(&[y]), output(&[d])]);
    assert_matches_interpret(&graph, &plan, &values);
}
