//! Which values can be recomputed and where their clones go. That the recomputed step gives
//! the same bits is checked by running it (tests/programs.rs): this crate has no kernels.

use super::*;
use crate::{append_backward, verify, DType, InputKind, Shape, TensorType};

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims).unwrap()
}

/// `loss = Σ cast_f32(cast_bf16(swiglu(x·w1, x·w2)))·w3`: an MLP whose bf16 activation (a
/// cast of the SwiGLU, two cheap ops from the kept products) and products can be recomputed.
fn mlp() -> (Graph, ValueId, [ValueId; 4]) {
    let mut g = Graph::new("mlp");
    let x = g.input("x", InputKind::Input, f32t(&[4, 8])).unwrap();
    let w = |g: &mut Graph, name: &str, dims: &[usize]| {
        g.input(name, InputKind::Param, f32t(dims)).unwrap()
    };
    let (w1, w2, w3) = (
        w(&mut g, "w1", &[8, 6]),
        w(&mut g, "w2", &[8, 6]),
        w(&mut g, "w3", &[6, 3]),
    );
    let mm = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let gate = g.op1(mm.clone(), &[x, w1]).unwrap();
    let up = g.op1(mm.clone(), &[x, w2]).unwrap();
    let act = g.op1(Op::SwiGlu, &[gate, up]).unwrap();
    let rounded = g.op1(Op::Cast { to: DType::BF16 }, &[act]).unwrap();
    let wide = g.op1(Op::Cast { to: DType::F32 }, &[rounded]).unwrap();
    let out = g.op1(mm, &[wide, w3]).unwrap();
    let loss = g
        .op1(
            Op::SumToShape {
                shape: Shape::scalar(),
            },
            &[out],
        )
        .unwrap();
    g.output("loss", loss).unwrap();
    let seed = g.input("loss_seed", InputKind::Input, f32t(&[])).unwrap();
    let grads = append_backward(&mut g, loss, seed, &[w1, w2, w3]).unwrap();
    for (name, grad) in ["g1", "g2", "g3"].into_iter().zip(grads) {
        g.output(name, grad.unwrap()).unwrap();
    }
    (g, seed, [gate, up, wide, rounded])
}

#[test]
fn saved_values_with_cheap_chains_are_candidates_and_others_are_not() {
    let (g, seed, [gate, up, wide, _]) = mlp();
    let start = backward_start(&g, seed).unwrap();
    let found = candidates(&g, start).unwrap();
    let values: Vec<ValueId> = found.iter().map(|c| c.value).collect();
    // gate and up (products of an input and a param) and the f32 activation the last
    // product's weight gradient reads; each costs what its clones do.
    assert_eq!(values, vec![gate, up, wide]);
    let wide_chain = &found[2];
    assert_eq!(
        wide_chain.nodes.len(),
        3,
        "swiglu, the bf16 cast and the f32 cast: {wide_chain:?}"
    );
    assert_eq!(wide_chain.bytes, 4 * 6 * 4);
    assert_eq!(wide_chain.flops, 0);
    assert!(wide_chain.moved_bytes > 0 && wide_chain.estimated_us() > 0.0);
    assert_eq!(found[0].flops, 2 * 4 * 6 * 8);
    assert_eq!(found[0].nodes, vec![gate.node]);
}

#[test]
fn a_recomputed_value_is_cloned_before_its_first_backward_reader_which_read_the_clone() {
    let (g, seed, [_, _, wide, _]) = mlp();
    let start = backward_start(&g, seed).unwrap();
    let all = candidates(&g, start).unwrap();
    let chosen: Vec<Candidate> = all.iter().filter(|c| c.value == wide).cloned().collect();
    let (new, clones) = recompute(&g, &chosen, start).unwrap();
    verify(&new).unwrap();
    let ops = |g: &Graph| g.node_indices().filter(|&n| op_of(g, n).is_some()).count();
    assert_eq!(ops(&new), ops(&g) + 3);
    // In the new graph the original `wide` is read only by the forward product, and the
    // clone (the same op on a clone of its chain) by the backward.
    let new_seed = (new.inputs().into_iter())
        .find(|(_, name, _, _)| *name == "loss_seed")
        .unwrap()
        .0;
    let new_start = backward_start(&new, new_seed).unwrap();
    let readers = readers(&new);
    // The clone: a cast to f32 of a cast to bf16 of a SwiGLU (the backward's own casts read
    // gradients).
    let of_rounding = |n: NodeIndex| {
        let rounding = new.operands(n)[0].node;
        let swiglu = new.operands(rounding).first().map(|v| v.node);
        op_of(&new, rounding) == Some(&Op::Cast { to: DType::BF16 })
            && swiglu.and_then(|n| op_of(&new, n)) == Some(&Op::SwiGlu)
    };
    let casts: Vec<NodeIndex> = new
        .node_indices()
        .filter(|&n| op_of(&new, n) == Some(&Op::Cast { to: DType::F32 }) && of_rounding(n))
        .collect();
    assert_eq!(casts.len(), 2);
    let (original, clone) = (casts[0], casts[1]);
    assert_eq!(original, wide.node, "the forward is rebuilt as it was");
    assert_eq!(
        clones,
        vec![(
            wide,
            ValueId {
                node: clone,
                port: 0
            }
        )]
    );
    assert!(original < new_start && clone > new_start);
    let read_by = |node| readers[&ValueId { node, port: 0 }].clone();
    assert!(read_by(original).iter().all(|&n| n < new_start));
    assert!(read_by(clone).iter().all(|&n| n > clone));
    assert_eq!(new.outputs().len(), g.outputs().len());
}

#[test]
fn nothing_chosen_rebuilds_the_same_graph() {
    let (g, seed, _) = mlp();
    let start = backward_start(&g, seed).unwrap();
    let (new, clones) = recompute(&g, &[], start).unwrap();
    assert!(clones.is_empty());
    assert_eq!(crate::print(&new), crate::print(&g));
}

#[test]
fn a_candidate_without_a_backward_reader_is_an_error() {
    let (g, seed, [gate, ..]) = mlp();
    let start = backward_start(&g, seed).unwrap();
    let mut bad = candidates(&g, start).unwrap()[0].clone();
    bad.value = ValueId {
        node: gate.node,
        port: 0,
    };
    // Moving the backward past every node leaves no backward reader.
    let end = NodeIndex::new(g.node_indices().count() + 10);
    let error = recompute(&g, &[bad], end).unwrap_err().to_string();
    assert!(error.contains("not read"), "{error}");
}

#[test]
fn an_op_writing_rounded_results_is_as_cheap_as_its_op() {
    let (g, _, _) = mlp();
    // The fusion pass makes the SwiGLU and its cast one op writing bf16.
    let fused = crate::fuse(&g).unwrap();
    let seed = fused.input_named("loss_seed").unwrap();
    let start = backward_start(&fused, seed).unwrap();
    let found = candidates(&fused, start).unwrap();
    let rounded = Op::Rounded(Box::new(Op::SwiGlu));
    let chain = (found.iter())
        .find(|c| c.nodes.iter().any(|&n| op_of(&fused, n) == Some(&rounded)))
        .expect("the rounded SwiGLU's chain is a candidate");
    assert_eq!(chain.flops, 0, "{chain:?}");
    assert!(cheap(&rounded));
    let product = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    assert!(!cheap(&Op::Rounded(Box::new(product))));
}
