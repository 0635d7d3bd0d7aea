//! Structure of the backward graphs `append_backward` builds: which ops, with which attributes
//! and operands, in which order (the tape's), and its errors. Numeric equality with the eager
//! oracle is checked by running both, outside this crate (it has no kernels).

use petgraph::stable_graph::NodeIndex;

use super::append_backward;
use crate::graph::NodeKind;
use crate::{DType, Error, Graph, InputKind, Op, Shape, TensorType, ValueId};

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims).unwrap()
}

fn i64t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::I64, dims).unwrap()
}

fn param(g: &mut Graph, name: &str, ty: TensorType) -> ValueId {
    g.input(name, InputKind::Param, ty).unwrap()
}

fn data(g: &mut Graph, name: &str, ty: TensorType) -> ValueId {
    g.input(name, InputKind::Input, ty).unwrap()
}

fn seed_for(g: &mut Graph, loss: ValueId) -> ValueId {
    let ty = g.value_type(loss).unwrap().clone();
    data(g, "loss_seed", ty)
}

/// The scalar sum of all elements of `v`.
fn sum_all(g: &mut Graph, v: ValueId) -> ValueId {
    let shape = Shape::scalar();
    g.op1(Op::SumToShape { shape }, &[v]).unwrap()
}

fn cross_entropy(g: &mut Graph, logits: ValueId, targets: ValueId, ignore_index: i64) -> ValueId {
    g.op1(Op::CrossEntropy { ignore_index }, &[logits, targets])
        .unwrap()
}

fn reshape(g: &mut Graph, v: ValueId, dims: &[usize]) -> ValueId {
    g.op1(Op::Reshape { shape: dims.into() }, &[v]).unwrap()
}

fn matmul(transpose_a: bool, transpose_b: bool) -> Op {
    Op::MatMul {
        transpose_a,
        transpose_b,
    }
}

/// The rule an `Error::Invalid` names ("" for any other error).
fn rule_of(err: &Error) -> &'static str {
    match err {
        Error::Invalid { rule, .. } => rule,
        _ => "",
    }
}

fn owned(expected: &[(&str, Vec<ValueId>)]) -> Vec<(String, Vec<ValueId>)> {
    expected
        .iter()
        .map(|(op, v)| (op.to_string(), v.clone()))
        .collect()
}

/// Result `port` of node `index`.
fn val(index: usize, port: usize) -> ValueId {
    ValueId {
        node: NodeIndex::new(index),
        port,
    }
}

/// The next node index the graph will give (where the backward nodes start).
fn next_index(g: &Graph) -> usize {
    g.node_indices().count()
}

/// The ops appended from node `first` on: (op text, operands).
fn appended(g: &Graph, first: usize) -> Vec<(String, Vec<ValueId>)> {
    g.node_indices()
        .filter(|n| n.index() >= first)
        .map(|n| match &g.node(n).unwrap().kind {
            NodeKind::Op(op) => (op.to_string(), g.operands(n)),
            NodeKind::Input { name, .. } => (format!("input {name}"), vec![]),
        })
        .collect()
}

fn names(ops: &[(String, Vec<ValueId>)]) -> Vec<&str> {
    ops.iter().map(|(op, _)| op.as_str()).collect()
}

/// Every op node's results are its type rule applied to its operands, and each gradient has
/// its value's type.
fn assert_typed(g: &Graph, wrt: &[ValueId], grads: &[Option<ValueId>]) {
    for n in g.node_indices() {
        let node = g.node(n).unwrap();
        if let NodeKind::Op(op) = &node.kind {
            let types: Vec<TensorType> = g
                .operands(n)
                .iter()
                .map(|&v| g.value_type(v).unwrap().clone())
                .collect();
            assert_eq!(op.infer(&types).unwrap(), node.outputs, "node {n:?} {op}");
        }
    }
    for (&value, grad) in wrt.iter().zip(grads) {
        if let Some(grad) = grad {
            assert_eq!(g.value_type(*grad).unwrap(), g.value_type(value).unwrap());
        }
    }
}

#[test]
fn embedding_linear_rmsnorm_cross_entropy() {
    let mut g = Graph::new("lm");
    let wte = param(&mut g, "wte", f32t(&[10, 4])); // 0
    let ids = data(&mut g, "ids", i64t(&[2, 3])); // 1
    let w = param(&mut g, "w", f32t(&[10, 4])); // 2
    let bias = param(&mut g, "bias", f32t(&[10])); // 3
    let norm_w = param(&mut g, "norm_w", f32t(&[10])); // 4
    let targets = data(&mut g, "targets", i64t(&[6])); // 5
    let unused = param(&mut g, "unused", f32t(&[10])); // 6
    let emb = g.op1(Op::Embedding, &[wte, ids]).unwrap(); // 7
    let flat = reshape(&mut g, emb, &[6, 4]); // 8
    let mm = g.op1(matmul(false, true), &[flat, w]).unwrap(); // 9
    let h = g.op1(Op::Add, &[mm, bias]).unwrap(); // 10
    let n = g.op1(Op::RmsNorm { eps: 1e-6 }, &[h, norm_w]).unwrap(); // 11

    // A branch that does not reach the loss gets no backward nodes.
    g.op1(Op::Mul, &[n, unused]).unwrap(); // 12
    let ce = Op::CrossEntropy { ignore_index: -100 };
    let loss = g.op1(ce, &[n, targets]).unwrap(); // 13
    let seed = seed_for(&mut g, loss); // 14
    let first = next_index(&g);
    let wrt = [wte, w, bias, norm_w, unused];
    let grads = append_backward(&mut g, loss, seed, &wrt).unwrap();

    let ops = appended(&g, first);
    assert_eq!(
        names(&ops),
        [
            "cross_entropy_backward{ignore_index=-100}",
            "rmsnorm_backward{eps=1e-6}",
            "sum_to_shape{shape=[10]}",
            "matmul{transpose_a=false, transpose_b=false}",
            "matmul{transpose_a=true, transpose_b=false}",
            "reshape{shape=[2,3,4]}",
            "embedding_backward{vocab=10, onto=false}",
        ]
    );
    let at = |k: usize, port: usize| val(first + k, port);
    let operands: Vec<&[ValueId]> = ops.iter().map(|(_, o)| o.as_slice()).collect();
    assert_eq!(operands[0], [n, targets, seed]);
    assert_eq!(operands[1], [h, norm_w, at(0, 0)]);
    assert_eq!(operands[2], [at(1, 0)]);
    assert_eq!(operands[3], [at(1, 0), w]);
    assert_eq!(operands[4], [at(1, 0), flat]);
    assert_eq!(operands[5], [at(3, 0)]);
    assert_eq!(operands[6], [ids, at(5, 0)]);
    let expected = [
        Some(at(6, 0)),
        Some(at(4, 0)),
        Some(at(2, 0)),
        Some(at(1, 1)),
        None,
    ];
    assert_eq!(grads, expected);
    assert_typed(&g, &wrt, &grads);
}

#[test]
fn a_leaf_used_twice_accumulates_first_then_second() {
    let mut g = Graph::new("fan_in");
    let x = param(&mut g, "x", f32t(&[2, 3])); // 0
    let u = g.op1(Op::Scale { alpha: 3.0 }, &[x]).unwrap(); // 1
    let v = g.op1(Op::Mul, &[x, u]).unwrap(); // 2
    let loss = sum_all(&mut g, v); // 3
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[x]).unwrap();
    let at = |k: usize| val(first + k, 0);
    let expected = [
        ("broadcast_to{shape=[2,3]}", vec![seed]),
        ("mul", vec![at(0), u]), // grad of x through Mul's first operand
        ("mul", vec![at(0), x]), // grad of u
        ("scale{alpha=3.0}", vec![at(2)]), // grad of x through u, visited later
        ("add", vec![at(1), at(3)]), // (previous, new)
    ];
    assert_eq!(appended(&g, first), owned(&expected));
    assert_eq!(grads, [Some(at(4))]);
    assert_typed(&g, &[x], &grads);
}

#[test]
fn an_op_result_used_twice_accumulates_before_its_producer_runs() {
    let mut g = Graph::new("fan_in_op");
    let x = param(&mut g, "x", f32t(&[4])); // 0
    let h = g.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap(); // 1
    let p = g.op1(Op::Mul, &[h, h]).unwrap(); // 2
    let loss = sum_all(&mut g, p);
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[x]).unwrap();
    let at = |k: usize| val(first + k, 0);
    let ops = appended(&g, first);
    assert_eq!(
        names(&ops),
        [
            "broadcast_to{shape=[4]}",
            "mul",
            "mul",
            "add",
            "scale{alpha=2.0}"
        ]
    );
    assert_eq!(ops[3].1, [at(1), at(2)]);
    assert_eq!(ops[4].1, [at(3)]);
    assert_eq!(grads, [Some(at(4))]);
}

#[test]
fn softmax_swiglu_fan_in_uses_the_softmax_result() {
    let mut g = Graph::new("act");
    let x = param(&mut g, "x", f32t(&[2, 5])); // 0
    let targets = data(&mut g, "targets", i64t(&[2])); // 1
    let y = g.op1(Op::Softmax, &[x]).unwrap(); // 2
    let s = g.op1(Op::SwiGlu, &[y, x]).unwrap(); // 3
    let loss = cross_entropy(&mut g, s, targets, 0);
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[x]).unwrap();
    let at = |k: usize, port: usize| val(first + k, port);
    let ops = appended(&g, first);
    assert_eq!(
        names(&ops),
        [
            "cross_entropy_backward{ignore_index=0}",
            "swiglu_backward",
            "softmax_backward",
            "add"
        ]
    );
    assert_eq!(ops[1].1, [y, x, at(0, 0)]);
    assert_eq!(ops[2].1, [y, at(1, 0)]);
    // x got grad_up from swiglu first (node 3), then the softmax gradient (node 2).
    assert_eq!(ops[3].1, [at(1, 1), at(2, 0)]);
    assert_eq!(grads, [Some(at(3, 0))]);
    assert_typed(&g, &[x], &grads);
}

/// `(x, residual, weight, targets)` params/inputs and the add_rmsnorm results.
fn add_rmsnorm_graph(g: &mut Graph) -> [ValueId; 6] {
    let x = param(g, "x", f32t(&[2, 4]));
    let r = param(g, "r", f32t(&[2, 4]));
    let w = param(g, "w", f32t(&[4]));
    let targets = data(g, "targets", i64t(&[2]));
    let results = g.op(Op::AddRmsNorm { eps: 1e-5 }, &[x, r, w]).unwrap();
    [x, r, w, targets, results[0], results[1]]
}

#[test]
fn add_rmsnorm_with_unused_sum_gets_three_operands() {
    let mut g = Graph::new("arn");
    let [x, r, w, targets, sum, out] = add_rmsnorm_graph(&mut g);
    let loss = cross_entropy(&mut g, out, targets, -1);
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[x, r, w]).unwrap();
    let ops = appended(&g, first);
    assert_eq!(
        names(&ops),
        [
            "cross_entropy_backward{ignore_index=-1}",
            "add_rmsnorm_backward{eps=1e-5}"
        ]
    );
    assert_eq!(ops[1].1, [sum, w, val(first, 0)]);
    let backward = val(first + 1, 0);
    assert_eq!(
        grads,
        [Some(backward), Some(backward), Some(val(first + 1, 1))]
    );
    assert_typed(&g, &[x, r, w], &grads);
}

#[test]
fn add_rmsnorm_with_both_results_used_passes_grad_sum_last() {
    let mut g = Graph::new("arn2");
    let [x, r, w, targets, sum, out] = add_rmsnorm_graph(&mut g);
    let z = g.op1(Op::Add, &[out, sum]).unwrap();
    let loss = cross_entropy(&mut g, z, targets, -1);
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[x, r, w]).unwrap();
    let ops = appended(&g, first);
    let g_z = val(first, 0);
    // Add hands g_z to both operands as is (same shapes), so out and sum get the same value.
    assert_eq!(ops[1].0, "add_rmsnorm_backward{eps=1e-5}");
    assert_eq!(ops[1].1, [sum, w, g_z, g_z]);
    assert_eq!(ops.len(), 2);
    assert_typed(&g, &[x, r, w], &grads);
}

#[test]
fn add_rmsnorm_with_only_sum_used_is_an_error_naming_it() {
    let mut g = Graph::new("arn3");
    let [x, _, _, targets, sum, _] = add_rmsnorm_graph(&mut g);
    let loss = cross_entropy(&mut g, sum, targets, -1);
    let seed = seed_for(&mut g, loss);
    let err = append_backward(&mut g, loss, seed, &[x]).unwrap_err();
    assert!(err.to_string().contains("add_rmsnorm{eps=1e-5}"), "{err}");
}

#[test]
fn rope_attention_transpose_block() {
    let mut g = Graph::new("attn");
    let x = param(&mut g, "x", f32t(&[1, 2, 2, 4])); // [B,T,H,D]
    let pos = data(&mut g, "pos", i64t(&[1, 2]));
    let bias = param(&mut g, "bias", f32t(&[8]));
    let k = param(&mut g, "k", f32t(&[1, 1, 2, 4]));
    let v = param(&mut g, "v", f32t(&[1, 1, 2, 4]));
    let targets = data(&mut g, "targets", i64t(&[2]));
    let rope = Op::Rope {
        theta: 10000.0,
        bias: true,
    };
    let q = g.op1(rope, &[x, pos, bias]).unwrap();
    let attn = g.op(Op::Attention { scale: 0.5 }, &[q, k, v]).unwrap();
    let (out, probs) = (attn[0], attn[1]);
    let t = g.op1(Op::Transpose { dim0: 1, dim1: 2 }, &[out]).unwrap();
    let c = g.op1(Op::Contiguous, &[t]).unwrap();
    let flat = reshape(&mut g, c, &[2, 8]);
    let loss = cross_entropy(&mut g, flat, targets, -100);
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let wrt = [x, bias, k, v];
    let grads = append_backward(&mut g, loss, seed, &wrt).unwrap();
    let at = |k: usize, port: usize| val(first + k, port);
    let ops = appended(&g, first);
    assert_eq!(
        names(&ops),
        [
            "cross_entropy_backward{ignore_index=-100}",
            "reshape{shape=[1,2,2,4]}",
            "transpose{dim0=1, dim1=2}",
            "contiguous",
            "attention_backward{scale=0.5}",
            "rope_backward{theta=10000.0}",
            "reshape{shape=[2,8]}",
            "sum_to_shape{shape=[8]}",
        ]
    );
    // contiguous passes the reshape's gradient through unchanged.
    assert_eq!(ops[2].1, [at(1, 0)]);
    assert_eq!(ops[4].1, [q, k, v, probs, at(3, 0)]);
    assert_eq!(ops[5].1, [at(4, 0), pos]);
    assert_eq!(ops[6].1, [at(5, 0)]);
    let expected = [
        Some(at(5, 0)),
        Some(at(7, 0)),
        Some(at(4, 1)),
        Some(at(4, 2)),
    ];
    assert_eq!(grads, expected);
    assert_typed(&g, &wrt, &grads);
}

#[test]
fn bf16_matmul_casts_the_gradient_down_and_back() {
    let mut g = Graph::new("bf16");
    let a = param(&mut g, "a", f32t(&[3, 2]));
    let b = param(&mut g, "b", TensorType::new(DType::BF16, [4, 3]).unwrap());
    let a16 = g.op1(Op::Cast { to: DType::BF16 }, &[a]).unwrap();
    let mm = g.op1(matmul(true, true), &[a16, b]).unwrap(); // f32 [2,4]
    let loss = sum_all(&mut g, mm);
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[a, b]).unwrap();
    let at = |k: usize| val(first + k, 0);
    const MM_TT: &str = "matmul{transpose_a=true, transpose_b=true}";
    let expected = [
        ("broadcast_to{shape=[2,4]}", vec![seed]),
        // The bf16 copy of the param is made again, not kept alive from the forward.
        ("cast{to=bf16}", vec![a]),
        ("cast{to=bf16}", vec![at(0)]),
        // a transposed: op(b)·Gᵀ; b transposed: Gᵀ·op(a).
        (MM_TT, vec![b, at(2)]),
        (MM_TT, vec![at(2), at(1)]),
        ("cast{to=bf16}", vec![at(3)]),
        ("cast{to=bf16}", vec![at(4)]),
        ("cast{to=f32}", vec![at(5)]),
    ];
    assert_eq!(appended(&g, first), owned(&expected));
    assert_eq!(grads, [Some(at(7)), Some(at(6))]);
    assert_typed(&g, &[a, b], &grads);
}

/// The flag algebra of frontend/src/ops/matmul.rs, written out per case.
#[test]
fn matmul_gradients_for_every_transpose_combination() {
    // (ta, tb) -> grad_a (flags, b first?), grad_b (flags, g first?)
    let cases = [
        (
            (false, false),
            ((false, true), false),
            ((true, false), false),
        ),
        (
            (false, true),
            ((false, false), false),
            ((true, false), true),
        ),
        (
            (true, false),
            ((false, true), true),
            ((false, false), false),
        ),
        ((true, true), ((true, true), true), ((true, true), true)),
    ];
    for ((ta, tb), (flags_a, b_first), (flags_b, g_first)) in cases {
        let mut g = Graph::new("mm");
        let a = param(&mut g, "a", f32t(if ta { &[3, 2] } else { &[2, 3] }));
        let b = param(&mut g, "b", f32t(if tb { &[4, 3] } else { &[3, 4] }));
        let mm = g.op1(matmul(ta, tb), &[a, b]).unwrap();
        let loss = sum_all(&mut g, mm);
        let seed = seed_for(&mut g, loss);
        let first = next_index(&g);
        let grads = append_backward(&mut g, loss, seed, &[a, b]).unwrap();
        let grad_out = val(first, 0);
        let expected = [
            ("broadcast_to{shape=[2,4]}".to_string(), vec![seed]),
            (
                matmul(flags_a.0, flags_a.1).to_string(),
                if b_first {
                    vec![b, grad_out]
                } else {
                    vec![grad_out, b]
                },
            ),
            (
                matmul(flags_b.0, flags_b.1).to_string(),
                if g_first {
                    vec![grad_out, a]
                } else {
                    vec![a, grad_out]
                },
            ),
        ];
        assert_eq!(appended(&g, first), expected, "ta={ta} tb={tb}");
        assert_eq!(grads, [Some(val(first + 1, 0)), Some(val(first + 2, 0))]);
        assert_typed(&g, &[a, b], &grads);
    }
}

#[test]
fn only_wanted_operands_get_backward_nodes() {
    let mut g = Graph::new("partial");
    let x = data(&mut g, "x", f32t(&[2, 3])); // data, not differentiated
    let w = param(&mut g, "w", f32t(&[3]));
    let y = g.op1(Op::Mul, &[x, w]).unwrap();
    let loss = sum_all(&mut g, y);
    let seed = seed_for(&mut g, loss);
    let first = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[w]).unwrap();
    let ops = appended(&g, first);
    // No mul(g, w) for x: only grad_b = sum_to(mul(g, x)).
    assert_eq!(
        names(&ops),
        [
            "broadcast_to{shape=[2,3]}",
            "mul",
            "sum_to_shape{shape=[3]}"
        ]
    );
    assert_eq!(ops[1].1, [val(first, 0), x]);
    assert_eq!(grads, [Some(val(first + 2, 0))]);
}

#[test]
fn a_loss_independent_of_wrt_appends_nothing() {
    let mut g = Graph::new("constant");
    let x = data(&mut g, "x", f32t(&[3]));
    let w = param(&mut g, "w", f32t(&[3]));
    let loss = sum_all(&mut g, x);
    let seed = seed_for(&mut g, loss);
    let before = next_index(&g);
    let grads = append_backward(&mut g, loss, seed, &[w, loss]).unwrap();
    assert_eq!(grads, [None, Some(seed)]);
    assert_eq!(next_index(&g), before);
}

#[test]
fn bad_losses_and_seeds_are_errors() {
    let mut g = Graph::new("errors");
    let x = param(&mut g, "x", f32t(&[2, 3]));
    let ids = data(&mut g, "ids", i64t(&[1]));
    let loss = sum_all(&mut g, x);
    let seed = seed_for(&mut g, loss);
    let wide_seed = data(&mut g, "wide_seed", f32t(&[2, 3]));
    let f64_seed = data(&mut g, "f64_seed", TensorType::new(DType::F64, []).unwrap());
    let shaped_seed = data(&mut g, "shaped_seed", f32t(&[1]));

    let err = append_backward(&mut g, x, wide_seed, &[x]).unwrap_err();
    assert_eq!(rule_of(&err), "backward: loss", "{err}");
    for bad in [f64_seed, shaped_seed] {
        let err = append_backward(&mut g, loss, bad, &[x]).unwrap_err();
        assert_eq!(rule_of(&err), "backward: seed", "{err}");
    }
    let missing = val(999, 0);
    let err = append_backward(&mut g, missing, seed, &[x]).unwrap_err();
    assert!(matches!(err, Error::NoSuchValue { .. }), "{err}");
    let err = append_backward(&mut g, val(loss.node.index(), 1), seed, &[x]).unwrap_err();
    assert!(matches!(err, Error::NoSuchValue { .. }), "{err}");
    let err = append_backward(&mut g, loss, seed, &[missing]).unwrap_err();
    assert!(matches!(err, Error::NoSuchValue { .. }), "{err}");
    let err = append_backward(&mut g, loss, seed, &[ids]).unwrap_err();
    assert_eq!(rule_of(&err), "backward: wrt", "{err}");
}

#[test]
fn an_op_without_a_gradient_rule_on_the_path_is_named() {
    let mut g = Graph::new("cache");
    let cache = g
        .input("cache", InputKind::State, f32t(&[1, 1, 4, 2]))
        .unwrap();
    let new = param(&mut g, "new", f32t(&[1, 1, 2, 2]));
    let pos = data(&mut g, "pos", i64t(&[1]));
    let written = g.op1(Op::KvCacheWrite, &[cache, new, pos]).unwrap();
    let loss = sum_all(&mut g, written);
    let seed = seed_for(&mut g, loss);
    let err = append_backward(&mut g, loss, seed, &[new]).unwrap_err();
    assert!(matches!(err, Error::Invalid { .. }), "{err}");
    assert!(err.to_string().contains("`kv_cache_write`"), "{err}");
}

#[test]
fn a_gradient_on_attention_probs_is_an_error() {
    let mut g = Graph::new("probs");
    let q = param(&mut g, "q", f32t(&[1, 1, 2, 2]));
    let kv = param(&mut g, "kv", f32t(&[1, 1, 2, 2]));
    let attn = g.op(Op::Attention { scale: 1.0 }, &[q, kv, kv]).unwrap();
    let loss = sum_all(&mut g, attn[1]);
    let seed = seed_for(&mut g, loss);
    let err = append_backward(&mut g, loss, seed, &[q]).unwrap_err();
    assert!(err.to_string().contains("probs"), "{err}");
}

#[test]
fn flash_attention_rounding_to_f16_has_no_backward() {
    let mut g = Graph::new("f16");
    let q = param(&mut g, "q", f32t(&[1, 1, 2, 2]));
    let kv = param(&mut g, "kv", f32t(&[1, 1, 2, 2]));
    let op = Op::FlashAttention {
        scale: 1.0,
        rounding: DType::F16,
    };
    let attn = g.op(op, &[q, kv, kv]).unwrap();
    let loss = sum_all(&mut g, attn[0]);
    let seed = seed_for(&mut g, loss);
    let err = append_backward(&mut g, loss, seed, &[q]).unwrap_err();
    assert!(err.to_string().contains("only the bf16"), "{err}");
}
