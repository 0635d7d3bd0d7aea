//! The verifier: an independent check that a graph keeps the invariants the interpreter, the
//! planner and autodiff rely on. It trusts nothing the builder did, so passes that edit the
//! graph through `Graph::raw_mut` can run it afterwards.
//!
//! Rules, each reported as `Error::Invalid { rule, detail }` with the offending node, value or
//! name in `detail`:
//! - `ports`: an op's incoming edges cover its operand ports 0..n exactly once; every edge reads
//!   an existing result of its source; inputs have no incoming edges.
//! - `types`: an op's stored result types are its type rule applied to its operand types; an
//!   input has exactly one result, of a type whose size fits (`TensorType::checked_size_bytes`).
//! - `acyclic`: the graph has no cycle.
//! - `order`: node index order is a topological order (the interpreter runs nodes in it).
//! - `outputs`: outputs name existing values; output names and input names are unique.
//! - `writes`: a write names a Param or State input, at most once, with a value of its type.
//! - `linear weights`: a fused `Linear`'s weights are Param inputs the program does not write
//!   (its kernels read them before waiting for the kernel before them).
//! - `attention caches`: a `CachedAttention`'s positions (and rows) are graph inputs or views
//!   of them, and each of its caches is a graph input or a KV write (`KvCacheWrite`,
//!   `RopeKvWrite`, a `Linear` with `rope_kv`) into one at those same positions (and rows):
//!   its kernel reads the cache rows below the positions, which no op of the program writes,
//!   before waiting for the kernel before it.
//!
//! Rules run in this order because later ones read what earlier ones establish (`types` reads
//! operands that `ports` has found connected; `writes` looks inputs up by names that `outputs`
//! has found unique). Nodes are visited in index order, edges by operand port, and outputs and
//! writes in insertion order, so the violation reported is deterministic.

use std::collections::BTreeMap;

use petgraph::algo::toposort;
use petgraph::stable_graph::{EdgeReference, NodeIndex};
use petgraph::visit::EdgeRef;
use petgraph::Direction;

use crate::graph::{Edge, Node, NodeKind};
use crate::op::rope_kv::{self, LinearRopeKv, RopeKvParts};
use crate::{Alias, Error, Graph, InputKind, Op, Result, TensorType, ValueId};

/// Checks every rule of the module doc; the first violation found is the error.
pub fn verify(graph: &Graph) -> Result<()> {
    check_ports(graph)?;
    check_types(graph)?;
    check_acyclic(graph)?;
    check_order(graph)?;
    check_outputs(graph)?;
    check_writes(graph)?;
    check_linear_weights(graph)?;
    check_attention_caches(graph)?;
    check_derived(graph)
}

fn invalid(rule: &'static str, detail: String) -> Error {
    Error::Invalid { rule, detail }
}

/// How details name a node: `node 3 (add)` or `node 0 (input `tokens`)`.
fn describe(graph: &Graph, node: NodeIndex) -> String {
    match graph.node(node).map(|n| &n.kind) {
        Some(NodeKind::Op(op)) => format!("node {} ({op})", node.index()),
        Some(NodeKind::Input { name, kind }) => {
            format!("node {} ({} `{name}`)", node.index(), kind.name())
        }
        None => format!("node {} (missing)", node.index()),
    }
}

/// The incoming edges of `node`, by operand port then source (a deterministic order).
fn incoming(graph: &Graph, node: NodeIndex) -> Vec<EdgeReference<'_, Edge>> {
    let mut edges: Vec<_> = graph
        .raw()
        .edges_directed(node, Direction::Incoming)
        .collect();
    edges.sort_by_key(|e| (e.weight().to_port, e.source(), e.weight().from_port));
    edges
}

/// Every input node in index order: node, name, kind and its first result type (read from the
/// raw graph, not `Graph::inputs`, which assumes each input has a result).
fn inputs(graph: &Graph) -> Vec<(NodeIndex, &str, InputKind, Option<&TensorType>)> {
    graph
        .node_indices()
        .filter_map(|node| match graph.node(node)? {
            Node {
                kind: NodeKind::Input { name, kind },
                outputs,
            } => Some((node, name.as_str(), *kind, outputs.first())),
            Node { .. } => None,
        })
        .collect()
}

fn list(types: &[TensorType]) -> String {
    let names: Vec<String> = types.iter().map(TensorType::to_string).collect();
    format!("[{}]", names.join(", "))
}

fn check_ports(graph: &Graph) -> Result<()> {
    for node in graph.node_indices() {
        let edges = incoming(graph, node);
        let is_input = matches!(
            graph.node(node).map(|n| &n.kind),
            Some(NodeKind::Input { .. })
        );
        if let (true, Some(edge)) = (is_input, edges.first()) {
            // An input's value comes from outside the program; an edge into it means nothing.
            return Err(invalid(
                "ports",
                format!(
                    "{} has an incoming edge from {}",
                    describe(graph, node),
                    describe(graph, edge.source())
                ),
            ));
        }
        for (expected, edge) in edges.iter().enumerate() {
            let Edge { from_port, to_port } = *edge.weight();
            let results = graph.node(edge.source()).map_or(0, |n| n.outputs.len());
            if from_port >= results {
                // The edge reads a result its source does not have.
                return Err(invalid(
                    "ports",
                    format!(
                        "operand {to_port} of {} reads result {from_port} of {}, which has {results}",
                        describe(graph, node),
                        describe(graph, edge.source())
                    ),
                ));
            }
            // Sorted ports equal to 0..n exactly when none repeats and none is skipped.
            if to_port < expected {
                // The same port appears twice.
                return Err(invalid(
                    "ports",
                    format!(
                        "operand {to_port} of {} is connected twice",
                        describe(graph, node)
                    ),
                ));
            }
            if to_port > expected {
                // A port below the highest connected one has no edge.
                return Err(invalid(
                    "ports",
                    format!(
                        "operand {expected} of {} is not connected",
                        describe(graph, node)
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_types(graph: &Graph) -> Result<()> {
    for node in graph.node_indices() {
        let Some(weight) = graph.node(node) else {
            // node_indices only yields existing nodes; nothing to check.
            continue;
        };
        let op = match &weight.kind {
            NodeKind::Input { .. } if weight.outputs.len() != 1 => {
                // An input is one value; the interpreter binds exactly one tensor to it.
                return Err(invalid(
                    "types",
                    format!(
                        "{} has {} results; an input has exactly one",
                        describe(graph, node),
                        weight.outputs.len()
                    ),
                ));
            }
            NodeKind::Input { .. } => {
                // Sizes of every later value derive from the inputs'; an op's are checked by its
                // type rule below.
                weight.outputs[0]
                    .checked_size_bytes()
                    .map_err(|e| invalid("types", format!("{}: {e}", describe(graph, node))))?;
                continue;
            }
            NodeKind::Op(op) => op,
        };
        let operand_types = graph
            .operands(node)
            .into_iter()
            .map(|v| graph.value_type(v).cloned())
            .collect::<Result<Vec<_>>>()
            // `ports` has checked every operand exists; this only guards against a change there.
            .map_err(|e| invalid("types", format!("{}: {e}", describe(graph, node))))?;
        // The type rule rejects the operands.
        let inferred = op
            .infer(&operand_types)
            .map_err(|e| invalid("types", format!("{}: {e}", describe(graph, node))))?;
        if inferred != weight.outputs {
            // The stored result types are not what the rule gives for these operands.
            return Err(invalid(
                "types",
                format!(
                    "{} stores results {} but its type rule gives {}",
                    describe(graph, node),
                    list(&weight.outputs),
                    list(&inferred)
                ),
            ));
        }
    }
    Ok(())
}

fn check_acyclic(graph: &Graph) -> Result<()> {
    // toposort fails exactly when there is a cycle (self loops included) and names a node on it.
    toposort(graph.raw(), None).map(|_| ()).map_err(|cycle| {
        invalid(
            "acyclic",
            format!("{} is on a cycle", describe(graph, cycle.node_id())),
        )
    })
}

fn check_order(graph: &Graph) -> Result<()> {
    for node in graph.node_indices() {
        for edge in incoming(graph, node) {
            if edge.source().index() >= node.index() {
                // The interpreter runs nodes in index order: this operand would not exist yet.
                return Err(invalid(
                    "order",
                    format!(
                        "operand {} of {} comes from the later {}",
                        edge.weight().to_port,
                        describe(graph, node),
                        describe(graph, edge.source())
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn check_outputs(graph: &Graph) -> Result<()> {
    let mut input_names = BTreeMap::new();
    for (node, name, _, _) in inputs(graph) {
        if let Some(first) = input_names.insert(name, node) {
            // Inputs are bound and written by name; two would be ambiguous.
            return Err(invalid(
                "outputs",
                format!(
                    "input name `{name}` is used by {} and {}",
                    describe(graph, first),
                    describe(graph, node)
                ),
            ));
        }
    }
    let mut output_names = BTreeMap::new();
    for (name, value) in graph.outputs() {
        if graph.value_type(*value).is_err() {
            // The output refers to a node or result port the graph does not have.
            return Err(invalid(
                "outputs",
                format!("output `{name}` refers to {value}, which does not exist"),
            ));
        }
        if output_names.insert(name.as_str(), *value).is_some() {
            // Outputs are returned by name; two would be ambiguous.
            return Err(invalid(
                "outputs",
                format!("output name `{name}` is used twice"),
            ));
        }
    }
    Ok(())
}

fn check_writes(graph: &Graph) -> Result<()> {
    let inputs: BTreeMap<&str, _> = inputs(graph)
        .into_iter()
        .map(|(_, name, kind, ty)| (name, (kind, ty)))
        .collect();
    let mut written = BTreeMap::new();
    for (name, value) in graph.writes() {
        let Some(&(kind, target_type)) = inputs.get(name.as_str()) else {
            // Only graph inputs have storage that outlives a run.
            return Err(invalid("writes", format!("write `{name}` names no input")));
        };
        if !kind.is_persistent() {
            // Per-run inputs are discarded after the run; writing one would be lost.
            return Err(invalid(
                "writes",
                format!(
                    "write `{name}` targets an {}; only params and states are written",
                    kind.name()
                ),
            ));
        }
        let Ok(value_type) = graph.value_type(*value) else {
            // The written value refers to a node or result port the graph does not have.
            return Err(invalid(
                "writes",
                format!("write `{name}` takes {value}, which does not exist"),
            ));
        };
        if Some(value_type) != target_type {
            // The next run would bind a tensor of the wrong type to the input.
            return Err(invalid(
                "writes",
                format!(
                    "write `{name}`: the input is {}, the value is {value_type}",
                    target_type.map_or("untyped".to_string(), TensorType::to_string)
                ),
            ));
        }
        if written.insert(name.as_str(), *value).is_some() {
            // Two new values for one input: which one wins would be arbitrary.
            return Err(invalid("writes", format!("`{name}` is written twice")));
        }
    }
    Ok(())
}

/// Every weight of a fused `Linear` (rounded or not) is a param no write of the program
/// replaces.
fn check_linear_weights(graph: &Graph) -> Result<()> {
    for node in graph.node_indices() {
        let Some(NodeKind::Op(op)) = graph.node(node).map(|n| &n.kind) else {
            continue;
        };
        let Op::Linear { biases, .. } = op.unrounded() else {
            continue;
        };
        for weight in graph.operands(node).iter().skip(1).take(biases.len()) {
            let param = match graph.node(weight.node).map(|n| &n.kind) {
                Some(NodeKind::Input {
                    name,
                    kind: InputKind::Param,
                }) => Some(name),
                _ => None,
            };
            let written = param.is_some_and(|name| graph.writes().iter().any(|(w, _)| w == name));
            if param.is_none() || written {
                let what = match param {
                    Some(name) => format!("param `{name}`, which the program writes"),
                    None => format!("{weight}, not a param"),
                };
                return Err(invalid(
                    "linear weights",
                    format!("{} reads weight {what}", describe(graph, node)),
                ));
            }
        }
    }
    Ok(())
}

/// `value` itself, or the value a chain of views (ops whose result is `Alias::ViewOf` an
/// operand) reads.
fn through_views(graph: &Graph, mut value: ValueId) -> ValueId {
    while let Some(NodeKind::Op(op)) = graph.node(value.node).map(|n| &n.kind) {
        let Alias::ViewOf(operand) = op.alias(value.port) else {
            break;
        };
        value = graph.operands(value.node)[operand];
    }
    value
}

fn is_input(graph: &Graph, value: ValueId) -> bool {
    matches!(
        graph.node(value.node).map(|n| &n.kind),
        Some(NodeKind::Input { .. })
    )
}

/// Every `CachedAttention` reads indices that are inputs, and caches that are inputs or KV
/// writes into inputs at its own indices (see the rule in the module doc).
fn check_attention_caches(graph: &Graph) -> Result<()> {
    for node in graph.node_indices() {
        let Some(NodeKind::Op(Op::CachedAttention { .. })) = graph.node(node).map(|n| &n.kind)
        else {
            continue;
        };
        let operands = graph.operands(node);
        let indices = &operands[3..];
        let fail = |what: String| {
            Err(invalid(
                "attention caches",
                format!("{} reads {what}", describe(graph, node)),
            ))
        };
        if let Some(index) = indices
            .iter()
            .find(|&&v| !is_input(graph, through_views(graph, v)))
        {
            return fail(format!("index {index}, not a graph input"));
        }
        for &cache in &operands[1..3] {
            let written = match graph.node(cache.node).map(|n| &n.kind) {
                Some(NodeKind::Input { .. }) => continue,
                Some(NodeKind::Op(Op::KvCacheWrite)) => {
                    let write = graph.operands(cache.node);
                    (write[0], write[2..].to_vec())
                }
                Some(&NodeKind::Op(Op::RopeKvWrite { theta, bias, .. }))
                    if (1..=2).contains(&cache.port) =>
                {
                    let write = graph.operands(cache.node);
                    let into = write[rope_kv::K_CACHE + cache.port - 1];
                    let ports = RopeKvParts::of(theta, bias, write.len()).map(|p| p.indices);
                    let at = ports
                        .unwrap_or_default()
                        .iter()
                        .map(|&i| write[i])
                        .collect();
                    (into, at)
                }
                Some(NodeKind::Op(Op::Linear {
                    biases,
                    rope_kv: Some(_),
                    ..
                })) if (1..=2).contains(&cache.port) => {
                    let write = graph.operands(cache.node);
                    let ports = LinearRopeKv::of(biases);
                    let at = write.get(ports.positions..).unwrap_or_default().to_vec();
                    (write[ports.k_cache + cache.port - 1], at)
                }
                _ => return fail(format!("cache {cache}, neither an input nor a KV write")),
            };
            if !is_input(graph, written.0) || written.1 != indices {
                return fail(format!(
                    "cache {cache}, a KV write into {} at other indices or not into an input",
                    written.0
                ));
            }
        }
    }
    Ok(())
}

/// A derived state (`Graph::derive`) holds its param cast: so a program that writes the param
/// writes the state as that cast of the new value, and one that does not writes neither.
fn check_derived(graph: &Graph) -> Result<()> {
    let written: BTreeMap<&str, ValueId> = (graph.writes().iter())
        .map(|(n, v)| (n.as_str(), *v))
        .collect();
    for (state, from) in graph.derived() {
        let rule = |detail: String| invalid("derived states", detail);
        match (written.get(from.as_str()), written.get(state.as_str())) {
            (None, None) => {}
            (Some(&param), Some(&copy)) => {
                let operands = graph.operands(copy.node);
                let casts_param = match graph.node(copy.node).map(|n| &n.kind) {
                    Some(NodeKind::Op(Op::Cast { .. })) => operands == [param],
                    Some(NodeKind::Op(Op::CastInto)) => operands.get(1) == Some(&param),
                    // The update that writes the copy too: its results 0 and 3.
                    Some(NodeKind::Op(
                        Op::AdamWCopy(_) | Op::EmbeddingAdamW { copy: true, .. },
                    )) => (copy.port, param.node, param.port) == (3, copy.node, 0),
                    _ => false,
                };
                if !casts_param {
                    return Err(rule(format!(
                        "`{state}` is derived from `{from}` but written with {copy}, not a \
                         cast of `{from}`'s new value {param}"
                    )));
                }
            }
            (Some(_), None) => {
                return Err(rule(format!(
                    "`{from}` is written but its derived `{state}` is not"
                )))
            }
            (None, Some(_)) => {
                return Err(rule(format!(
                    "`{state}` is derived from `{from}` and written, but `{from}` is not"
                )))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;
