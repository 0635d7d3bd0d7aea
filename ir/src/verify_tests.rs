//! Verifier tests: a well-formed graph passes; graphs broken through the unchecked API fail
//! with the rule's name and a detail naming the offending node, value or name.

use petgraph::stable_graph::NodeIndex;
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use super::verify;
use crate::graph::{Edge, Node, NodeKind};
use crate::{DType, Error, Graph, InputKind, Op, TensorType, ValueId};

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims).unwrap()
}

/// The values of [`well_formed`], to break it in targeted ways.
struct Sample {
    graph: Graph,
    tokens: ValueId,
    x: ValueId,
    sum: ValueId,
    t: ValueId,
}

/// Params, an input, a state, a multi-output op (AddRmsNorm), a view (Transpose), writes of a
/// state and a param, and outputs.
fn well_formed() -> Sample {
    let mut g = Graph::new("sample");
    let embed = g.input("embed", InputKind::Param, f32t(&[7, 4])).unwrap();
    let norm = g.input("norm", InputKind::Param, f32t(&[4])).unwrap();
    let tokens = g
        .input(
            "tokens",
            InputKind::Input,
            TensorType::new(DType::I64, [2, 3]).unwrap(),
        )
        .unwrap();
    let acc = g.input("acc", InputKind::State, f32t(&[2, 3, 4])).unwrap();
    let x = g.op1(Op::Embedding, &[embed, tokens]).unwrap();
    let both = g.op(Op::AddRmsNorm { eps: 1e-5 }, &[x, acc, norm]).unwrap();
    let t = g
        .op1(Op::Transpose { dim0: 1, dim1: 2 }, &[both[1]])
        .unwrap();
    let decayed = g.op1(Op::Scale { alpha: 0.9 }, &[norm]).unwrap();
    g.write("acc", both[0]).unwrap();
    g.write("norm", decayed).unwrap();
    g.output("t", t).unwrap();
    g.output("normed", both[1]).unwrap();
    Sample {
        graph: g,
        tokens,
        x,
        sum: both[0],
        t,
    }
}

/// Asserts `graph` fails `rule` with a detail containing every one of `needles`.
#[track_caller]
fn rejects(graph: &Graph, rule: &str, needles: &[&str]) {
    match verify(graph) {
        Err(Error::Invalid { rule: got, detail }) => {
            assert_eq!(got, rule, "detail: {detail}");
            for needle in needles {
                assert!(detail.contains(needle), "`{needle}` not in: {detail}");
            }
        }
        other => panic!("expected a `{rule}` violation, got {other:?}"),
    }
}

fn node_name(v: ValueId) -> String {
    format!("node {}", v.node.index())
}

/// The edge into operand `to_port` of `node`.
fn edge_into(g: &Graph, node: NodeIndex, to_port: usize) -> petgraph::stable_graph::EdgeIndex {
    g.raw()
        .edges_directed(node, Direction::Incoming)
        .find(|e| e.weight().to_port == to_port)
        .map(|e| e.id())
        .unwrap()
}

#[test]
fn accepts_a_well_formed_graph() {
    assert_eq!(verify(&well_formed().graph), Ok(()));
}

#[test]
fn accepts_holes_left_by_removed_nodes() {
    let mut s = well_formed();
    let unused = s.graph.op1(Op::Scale { alpha: 3.0 }, &[s.t]).unwrap();
    s.graph.raw_mut().remove_node(unused.node);
    assert_eq!(verify(&s.graph), Ok(()));
}

#[test]
fn types_rejects_stored_results_the_rule_does_not_give() {
    let mut s = well_formed();
    s.graph.raw_mut()[s.x.node].outputs = vec![f32t(&[2, 3, 5])];
    rejects(
        &s.graph,
        "types",
        &[&node_name(s.x), "embedding", "f32[2,3,5]", "f32[2,3,4]"],
    );
}

#[test]
fn types_rejects_operands_the_rule_rejects() {
    let mut s = well_formed();
    s.graph.raw_mut()[s.x.node].kind = NodeKind::Op(Op::Mul);
    rejects(&s.graph, "types", &[&node_name(s.x), "mul", "operand 1"]);
}

#[test]
fn types_rejects_an_input_without_exactly_one_result() {
    let mut s = well_formed();
    s.graph.raw_mut()[s.tokens.node].outputs.push(f32t(&[1]));
    rejects(
        &s.graph,
        "types",
        &[&node_name(s.tokens), "tokens", "2 results"],
    );
}

#[test]
fn types_rejects_an_input_too_large_to_address() {
    // Only the unchecked API can store such a type; `TensorType::new` refuses it.
    let mut s = well_formed();
    s.graph.raw_mut()[s.tokens.node].outputs = vec![TensorType {
        dtype: DType::I64,
        shape: [1usize << 32, 1 << 32].into(),
    }];
    rejects(
        &s.graph,
        "types",
        &[
            &node_name(s.tokens),
            "i64[4294967296,4294967296] is too large",
        ],
    );
}

#[test]
fn types_rejects_an_input_without_results() {
    // An unused input: with no edges out, only the `types` rule can notice.
    let mut s = well_formed();
    let empty = s.graph.raw_mut().add_node(Node {
        kind: NodeKind::Input {
            name: "empty".to_string(),
            kind: InputKind::Input,
        },
        outputs: vec![],
    });
    let detail = format!("node {}", empty.index());
    rejects(&s.graph, "types", &[&detail, "`empty`", "0 results"]);
}

#[test]
fn ports_rejects_an_unconnected_operand() {
    let mut s = well_formed();
    let edge = edge_into(&s.graph, s.x.node, 0);
    s.graph.raw_mut().remove_edge(edge);
    rejects(
        &s.graph,
        "ports",
        &[&node_name(s.x), "operand 0", "not connected"],
    );
}

#[test]
fn ports_rejects_an_operand_connected_twice() {
    let mut s = well_formed();
    let edge = Edge {
        from_port: 0,
        to_port: 1,
    };
    s.graph.raw_mut().add_edge(s.tokens.node, s.x.node, edge);
    rejects(&s.graph, "ports", &[&node_name(s.x), "operand 1", "twice"]);
}

#[test]
fn ports_rejects_reading_a_result_the_source_lacks() {
    let mut s = well_formed();
    let edge = edge_into(&s.graph, s.x.node, 1);
    s.graph.raw_mut()[edge].from_port = 1;
    rejects(
        &s.graph,
        "ports",
        &[&node_name(s.x), &node_name(s.tokens), "result 1"],
    );
}

#[test]
fn ports_rejects_an_edge_into_an_input() {
    let mut s = well_formed();
    let edge = Edge {
        from_port: 0,
        to_port: 0,
    };
    s.graph.raw_mut().add_edge(s.x.node, s.tokens.node, edge);
    rejects(
        &s.graph,
        "ports",
        &[&node_name(s.tokens), "`tokens`", "incoming"],
    );
}

/// `p`, `a = scale(p)`, `b = scale(p)`: node 1 and node 2 both read node 0.
fn chain() -> (Graph, ValueId, ValueId, ValueId) {
    let mut g = Graph::new("chain");
    let p = g.input("p", InputKind::Param, f32t(&[3])).unwrap();
    let a = g.op1(Op::Scale { alpha: 2.0 }, &[p]).unwrap();
    let b = g.op1(Op::Scale { alpha: 3.0 }, &[p]).unwrap();
    (g, p, a, b)
}

/// Makes `from` the operand of `to` in place of `p`.
fn rewire(g: &mut Graph, from: ValueId, to: ValueId) {
    let edge = edge_into(g, to.node, 0);
    g.raw_mut().remove_edge(edge);
    let edge = Edge {
        from_port: 0,
        to_port: 0,
    };
    g.raw_mut().add_edge(from.node, to.node, edge);
}

#[test]
fn acyclic_rejects_a_cycle() {
    let (mut g, _, a, b) = chain();
    rewire(&mut g, a, b);
    rewire(&mut g, b, a);
    // Either node of the two-node cycle is a valid witness.
    let detail = match verify(&g) {
        Err(Error::Invalid {
            rule: "acyclic",
            detail,
        }) => detail,
        other => panic!("expected an `acyclic` violation, got {other:?}"),
    };
    assert!(
        detail.contains(&node_name(a)) || detail.contains(&node_name(b)),
        "{detail}"
    );
    assert!(detail.contains("cycle"), "{detail}");
}

#[test]
fn acyclic_rejects_a_self_loop() {
    let (mut g, _, a, _) = chain();
    rewire(&mut g, a, a);
    rejects(&g, "acyclic", &[&node_name(a), "cycle"]);
}

#[test]
fn order_rejects_an_edge_from_a_later_node() {
    let (mut g, _, a, b) = chain();
    // a reads b: acyclic, but b comes after a in index order.
    rewire(&mut g, b, a);
    rejects(&g, "order", &[&node_name(a), &node_name(b), "later"]);
}

fn missing() -> ValueId {
    ValueId {
        node: NodeIndex::new(99),
        port: 0,
    }
}

#[test]
fn writes_rejects_a_name_that_is_no_input() {
    let mut s = well_formed();
    s.graph
        .push_unchecked(None, Some(("ghost".to_string(), s.sum)));
    rejects(&s.graph, "writes", &["`ghost`", "no input"]);
}

#[test]
fn writes_rejects_writing_an_input_kind_input() {
    let mut s = well_formed();
    s.graph
        .push_unchecked(None, Some(("tokens".to_string(), s.tokens)));
    rejects(&s.graph, "writes", &["`tokens`", "input"]);
}

#[test]
fn writes_rejects_a_value_of_another_type() {
    let mut s = well_formed();
    s.graph
        .push_unchecked(None, Some(("embed".to_string(), s.t)));
    rejects(&s.graph, "writes", &["`embed`", "f32[7,4]", "f32[2,4,3]"]);
}

#[test]
fn writes_rejects_a_missing_value() {
    let mut s = well_formed();
    s.graph
        .push_unchecked(None, Some(("embed".to_string(), missing())));
    rejects(&s.graph, "writes", &["`embed`", "%99.0"]);
}

#[test]
fn writes_rejects_a_second_write_of_a_name() {
    let mut s = well_formed();
    s.graph
        .push_unchecked(None, Some(("acc".to_string(), s.sum)));
    rejects(&s.graph, "writes", &["`acc`", "twice"]);
}

#[test]
fn outputs_rejects_a_missing_node() {
    let mut s = well_formed();
    s.graph
        .push_unchecked(Some(("ghost".to_string(), missing())), None);
    rejects(&s.graph, "outputs", &["`ghost`", "%99.0"]);
}

#[test]
fn outputs_rejects_a_missing_result_port() {
    let mut s = well_formed();
    let port_1 = ValueId {
        node: s.t.node,
        port: 1,
    };
    s.graph
        .push_unchecked(Some(("wide".to_string(), port_1)), None);
    rejects(&s.graph, "outputs", &["`wide`", &port_1.to_string()]);
}

#[test]
fn outputs_rejects_a_duplicate_output_name() {
    let mut s = well_formed();
    s.graph.push_unchecked(Some(("t".to_string(), s.x)), None);
    rejects(&s.graph, "outputs", &["`t`", "twice"]);
}

#[test]
fn outputs_rejects_a_duplicate_input_name() {
    let mut s = well_formed();
    let twin = s.graph.raw_mut().add_node(Node {
        kind: NodeKind::Input {
            name: "tokens".to_string(),
            kind: InputKind::Input,
        },
        outputs: vec![f32t(&[1])],
    });
    rejects(
        &s.graph,
        "outputs",
        &[
            "`tokens`",
            &node_name(s.tokens),
            &format!("node {}", twin.index()),
        ],
    );
}

/// A param `w` with a derived bf16 copy `bf16.w`, updated by `w + w`; the copy rewritten as
/// `copy_of`'s cast when given.
fn derived_sample(copy_of: Option<bool>) -> Graph {
    let mut g = Graph::new("derived");
    let w = g.input("w", InputKind::Param, f32t(&[3, 2])).unwrap();
    let bf16 = TensorType::new(DType::BF16, [3, 2]).unwrap();
    g.input("bf16.w", InputKind::State, bf16).unwrap();
    g.derive("bf16.w", "w").unwrap();
    let updated = g.op1(Op::Add, &[w, w]).unwrap();
    g.write("w", updated).unwrap();
    if let Some(of_update) = copy_of {
        // The cast of the updated param, or (wrongly) of the old one.
        let source = if of_update { updated } else { w };
        let cast = g.op1(Op::Cast { to: DType::BF16 }, &[source]).unwrap();
        g.write("bf16.w", cast).unwrap();
    }
    g
}

#[test]
fn a_derived_copy_is_rewritten_as_the_cast_of_its_updated_param() {
    verify(&derived_sample(Some(true))).unwrap();
    for (graph, says) in [
        (
            derived_sample(None),
            "is written but its derived `bf16.w` is not",
        ),
        (derived_sample(Some(false)), "not a cast of `w`'s new value"),
    ] {
        let error = verify(&graph).unwrap_err().to_string();
        assert!(
            error.contains("derived states") && error.contains(says),
            "{error}"
        );
    }
    // A written copy of a param that is not written.
    let mut g = Graph::new("stale");
    let w = g.input("w", InputKind::Param, f32t(&[2])).unwrap();
    g.input(
        "copy",
        InputKind::State,
        TensorType::new(DType::BF16, [2]).unwrap(),
    )
    .unwrap();
    g.derive("copy", "w").unwrap();
    let cast = g.op1(Op::Cast { to: DType::BF16 }, &[w]).unwrap();
    g.write("copy", cast).unwrap();
    assert!(verify(&g)
        .unwrap_err()
        .to_string()
        .contains("but `w` is not"));
}

#[test]
fn derive_refuses_what_is_not_a_state_of_a_params_shape() {
    let mut g = Graph::new("bad");
    g.input("w", InputKind::Param, f32t(&[3, 2])).unwrap();
    g.input("x", InputKind::Input, f32t(&[3, 2])).unwrap();
    g.input("short", InputKind::State, f32t(&[2])).unwrap();
    g.input("copy", InputKind::State, f32t(&[3, 2])).unwrap();
    for (state, from, says) in [
        ("x", "w", "must be a state"),
        ("copy", "x", "must be a state"),
        ("short", "w", "its param `w`"),
        ("nothing", "w", "no input named `nothing`"),
    ] {
        let error = g.derive(state, from).unwrap_err().to_string();
        assert!(error.contains(says), "{state} from {from}: {error}");
    }
    g.derive("copy", "w").unwrap();
    let twice = g.derive("copy", "w").unwrap_err().to_string();
    assert!(twice.contains("derived twice"), "{twice}");
}

/// A fused linear's weights are params the program leaves unwritten: a weight that is a
/// per-run input, or a param the program also writes, is refused; a rounded linear's too.
#[test]
fn linear_weights_rejects_a_weight_that_is_no_param_or_is_written() {
    let bf16 = |dims: &[usize]| TensorType::new(DType::BF16, dims).unwrap();
    let linear = Op::Linear {
        biases: vec![false, false],
        swiglu: true,
        add_rmsnorm: None,
        rope_kv: None,
    };
    let rounded = Op::Rounded(Box::new(linear.clone()));
    for (op, name) in [(linear, "linear"), (rounded, "rounded_linear")] {
        let build = |kind: InputKind| {
            let mut g = Graph::new("linear");
            let x = g.input("x", InputKind::Input, f32t(&[40, 8])).unwrap();
            let w = g.input("w", kind, bf16(&[3, 8])).unwrap();
            let up = g.input("up", InputKind::Param, bf16(&[3, 8])).unwrap();
            let y = g.op1(op.clone(), &[x, w, up]).unwrap();
            g.output("y", y).unwrap();
            (g, w)
        };
        let (graph, _) = build(InputKind::Param);
        verify(&graph).unwrap();
        let (graph, _) = build(InputKind::Input);
        let node = format!("node 3 ({name}");
        rejects(&graph, "linear weights", &[&node, "not a param"]);
        let (mut graph, w) = build(InputKind::Param);
        let scaled = graph.op1(Op::Cast { to: DType::BF16 }, &[w]).unwrap();
        graph.write("w", scaled).unwrap();
        rejects(&graph, "linear weights", &["`w`", "writes"]);
    }
}

/// A cached attention reads indices that are inputs and caches that are inputs or KV writes
/// into inputs at its own positions: caches computed otherwise, or written at other positions,
/// are refused.
#[test]
fn attention_caches_rejects_caches_written_elsewhere_or_computed() {
    let i64t = |dims: &[usize]| TensorType::new(DType::I64, dims).unwrap();
    let attention = Op::CachedAttention { scale: 0.5 };
    // kind 0: the state itself; 1: a KV write at the positions; 2: at other positions;
    // 3: a cache scaled by an op; 4: positions computed by an op.
    let build = |kind: usize| {
        let mut g = Graph::new("decode");
        let q = g.input("q", InputKind::Input, f32t(&[1, 2, 1, 4])).unwrap();
        let positions = g.input("positions", InputKind::Input, i64t(&[1])).unwrap();
        let other = g.input("other", InputKind::Input, i64t(&[1])).unwrap();
        let k = g.input("k", InputKind::State, f32t(&[1, 1, 8, 4])).unwrap();
        let v = g.input("v", InputKind::State, f32t(&[1, 1, 8, 4])).unwrap();
        let fresh = g
            .input("fresh", InputKind::Input, f32t(&[1, 1, 1, 4]))
            .unwrap();
        let mut at = positions;
        let k_read = match kind {
            1 | 2 => {
                let where_ = if kind == 1 { positions } else { other };
                g.op1(Op::KvCacheWrite, &[k, fresh, where_]).unwrap()
            }
            3 => g.op1(Op::Scale { alpha: 2.0 }, &[k]).unwrap(),
            4 => {
                let scores = g.input("scores", InputKind::Input, f32t(&[1, 8])).unwrap();
                at = g.op1(Op::Argmax, &[scores]).unwrap();
                k
            }
            _ => k,
        };
        let out = g.op1(attention.clone(), &[q, k_read, v, at]).unwrap();
        g.output("out", out).unwrap();
        g
    };
    verify(&build(0)).unwrap();
    verify(&build(1)).unwrap();
    rejects(
        &build(2),
        "attention caches",
        &["cached_attention", "other indices"],
    );
    rejects(
        &build(3),
        "attention caches",
        &["neither an input nor a KV write"],
    );
    rejects(&build(4), "attention caches", &["not a graph input"]);
}
