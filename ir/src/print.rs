//! Stable IR text: one line per node, for reading, diffing and golden tests.
//!
//! ```text
//! program <name>
//!   param  %0 model.embed_tokens.weight : f32[97,64]
//!   input  %1 tokens : i64[2,16]
//!   %2 = embedding(%0, %1) : f32[2,16,64]
//!   output hidden = %2
//!   write cache.k.0 = %12
//! ```
//!
//! Invariants:
//! 1. Inputs come first, grouped as params, inputs, states (each group in node order), then op
//!    nodes in node order, then outputs and writes in insertion order.
//! 2. Values are numbered densely `%0, %1, ...` in printing order, so the text does not depend
//!    on petgraph indices (holes left by removed nodes do not show).
//! 3. The text is a pure function of the graph, byte for byte; nothing iterates a hash map.
//! 4. Printing never panics, even on a graph the verifier rejects: a value the graph does not
//!    have prints as `<missing %node.port>` with its raw id.

use std::collections::BTreeMap;

use petgraph::stable_graph::NodeIndex;

use crate::graph::{Node, NodeKind};
use crate::{Graph, InputKind, TensorType, ValueId};

/// The IR text of `graph` (see the module doc for the format).
pub fn print(graph: &Graph) -> String {
    let order = printing_order(graph);
    // Number every result of every node first, so operands that point forward (in a graph the
    // verifier would reject) still print with their number.
    let mut numbers = BTreeMap::new();
    for &(node, weight) in &order {
        for port in 0..weight.outputs.len() {
            let next = numbers.len();
            numbers.insert(ValueId { node, port }, next);
        }
    }
    let value = |v: ValueId| match numbers.get(&v) {
        Some(n) => format!("%{n}"),
        None => format!("<missing {v}>"),
    };
    let results = |node: NodeIndex, weight: &Node| {
        let names: Vec<String> = (0..weight.outputs.len())
            .map(|port| value(ValueId { node, port }))
            .collect();
        names.join(", ")
    };

    let mut lines = vec![format!("program {}", graph.name())];
    for &(node, weight) in &order {
        let types = type_list(&weight.outputs);
        match &weight.kind {
            NodeKind::Input { name, kind } => lines.push(format!(
                "  {}  {} {name} : {types}",
                kind.name(),
                results(node, weight)
            )),
            NodeKind::Op(op) => {
                let operands: Vec<String> = graph.operands(node).into_iter().map(value).collect();
                lines.push(format!(
                    "  {} = {op}({}) : {types}",
                    results(node, weight),
                    operands.join(", ")
                ));
            }
        }
    }
    for (name, v) in graph.outputs() {
        lines.push(format!("  output {name} = {}", value(*v)));
    }
    for (name, v) in graph.writes() {
        lines.push(format!("  write {name} = {}", value(*v)));
    }
    for (state, from) in graph.derived() {
        lines.push(format!("  derive {state} = cast({from})"));
    }
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

/// Nodes in printing order: params, inputs, states, then ops; node order within each group.
fn printing_order(graph: &Graph) -> Vec<(NodeIndex, &Node)> {
    let mut order: Vec<(NodeIndex, &Node)> = graph
        .node_indices()
        .filter_map(|node| Some((node, graph.node(node)?)))
        .collect();
    let group = |weight: &Node| match &weight.kind {
        NodeKind::Input {
            kind: InputKind::Param,
            ..
        } => 0,
        NodeKind::Input {
            kind: InputKind::Input,
            ..
        } => 1,
        NodeKind::Input {
            kind: InputKind::State,
            ..
        } => 2,
        NodeKind::Op(_) => 3,
    };
    // A stable sort keeps node order inside each group.
    order.sort_by_key(|&(_, weight)| group(weight));
    order
}

fn type_list(types: &[TensorType]) -> String {
    let names: Vec<String> = types.iter().map(TensorType::to_string).collect();
    names.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Op};

    fn f32t(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims).unwrap()
    }

    /// Inputs added out of group order, a param after an op, a multi-output op, a view,
    /// outputs added out of alphabetical order, and a write.
    fn sample() -> Graph {
        let mut g = Graph::new("tiny");
        let acc = g.input("acc", InputKind::State, f32t(&[1, 2, 4])).unwrap();
        let tokens = g
            .input(
                "tokens",
                InputKind::Input,
                TensorType::new(DType::I64, [1, 2]).unwrap(),
            )
            .unwrap();
        let embed = g.input("embed", InputKind::Param, f32t(&[5, 4])).unwrap();
        let x = g.op1(Op::Embedding, &[embed, tokens]).unwrap();
        let weight = g
            .input("norm.weight", InputKind::Param, f32t(&[4]))
            .unwrap();
        let norm = g
            .op(Op::AddRmsNorm { eps: 1e-6 }, &[x, acc, weight])
            .unwrap();
        let t = g
            .op1(Op::Transpose { dim0: 1, dim1: 2 }, &[norm[1]])
            .unwrap();
        g.output("logits", t).unwrap();
        g.output("hidden", norm[1]).unwrap();
        g.write("acc", norm[0]).unwrap();
        g
    }

    #[test]
    fn prints_the_exact_text() {
        let expected = "\
program tiny
  param  %0 embed : f32[5,4]
  param  %1 norm.weight : f32[4]
  input  %2 tokens : i64[1,2]
  state  %3 acc : f32[1,2,4]
  %4 = embedding(%0, %2) : f32[1,2,4]
  %5, %6 = add_rmsnorm{eps=1e-6}(%4, %3, %1) : f32[1,2,4], f32[1,2,4]
  %7 = transpose{dim0=1, dim1=2}(%6) : f32[1,4,2]
  output logits = %7
  output hidden = %6
  write acc = %5
";
        assert_eq!(print(&sample()), expected);
    }

    #[test]
    fn printing_is_deterministic() {
        let g = sample();
        let first = print(&g);
        assert_eq!(print(&g), first);
        assert_eq!(print(&g.clone()), first);
    }

    #[test]
    fn numbering_ignores_holes_left_by_removed_nodes() {
        let mut g = Graph::new("holes");
        let a = g.input("a", InputKind::Param, f32t(&[3])).unwrap();
        let dead = g.op1(Op::Scale { alpha: 2.0 }, &[a]).unwrap();
        let live = g.op1(Op::Scale { alpha: 0.5 }, &[a]).unwrap();
        g.output("y", live).unwrap();
        g.raw_mut().remove_node(dead.node);
        let expected = "\
program holes
  param  %0 a : f32[3]
  %1 = scale{alpha=0.5}(%0) : f32[3]
  output y = %1
";
        assert_eq!(print(&g), expected);
    }

    #[test]
    fn a_missing_value_prints_its_raw_id() {
        let mut g = Graph::new("dangling");
        let a = g.input("a", InputKind::Param, f32t(&[3])).unwrap();
        let gone = ValueId {
            node: a.node,
            port: 1,
        };
        g.push_unchecked(Some(("y".to_string(), gone)), None);
        assert_eq!(
            print(&g),
            format!("program dangling\n  param  %0 a : f32[3]\n  output y = <missing {gone}>\n")
        );
    }
}
