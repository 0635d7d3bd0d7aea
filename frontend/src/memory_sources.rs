//! Where a program's arena bytes come from (`kiln plan --by source`): each arena buffer's
//! [`Category`] and layer, derived from IR provenance for the planner's attribution.
//!
//! Rules (a buffer counts for the first value it holds; its op is that value's node):
//! 1. The backward is every op that depends on the `loss_seed` input (IR autodiff seeds the
//!    gradient with it); everything else is the forward. A program without `loss_seed` is all
//!    forward.
//! 2. Groups: a forward op belongs to the group of the last value name given at or before it
//!    in node order (`layers.3.*` → `layer 3`, `embed` → `embed`, `norm` and `logits` →
//!    `head`); a backward op to the group of its latest forward operand (an op, else a param
//!    or state by its name), else to the group of the backward op before it. Params and state
//!    are grouped by name (`model.layers.3.…`, `adamw.m.model.layers.3.…`, `cache.k.3`).
//! 3. Categories: a workspace is `workspace`; an AdamW result `optimizer update`; a backward
//!    value `gradient`; a buffer holding a forward value from the `logits` name on (the
//!    logits, the loss; views count) `logits/loss`; a forward value some backward op reads `saved activation`; any other
//!    forward value `activation`.

use std::collections::{BTreeMap, BTreeSet};

use kiln_ir::graph::NodeKind;
use kiln_ir::{Graph, InputKind};
use kiln_planner::dump::{Category, Source};
use kiln_planner::{Buffer, BufferClass, Plan};

/// What the rules know about one node.
#[derive(Clone, Debug)]
struct Origin {
    group: String,
    backward: bool,
    /// A forward op from the `logits` name on.
    logits: bool,
    /// An AdamW op.
    optimizer: bool,
}

/// The source of every buffer of `plan` (made from `graph`), by buffer id; buffers outside the
/// arena get the source of their first value too (the attribution never counts them).
pub fn memory_sources(graph: &Graph, plan: &Plan) -> Vec<Source> {
    let origins = origins(graph);
    let read_by_backward = read_by_backward(graph, &origins);
    plan.buffers
        .iter()
        .map(|buffer| {
            let nodes: Vec<usize> = buffer.values.iter().filter_map(|v| value_node(v)).collect();
            let node = match buffer.class {
                // A workspace lives at the one step of its op.
                BufferClass::Workspace => plan.schedule.get(buffer.start).map(|s| s.node),
                _ => nodes.first().copied(),
            };
            let Some(origin) = node.and_then(|n| origins.get(&n)) else {
                return unknown();
            };
            let category = match buffer.class {
                BufferClass::Workspace => Category::Workspace,
                _ if origin.optimizer => Category::Optimizer,
                _ if origin.backward => Category::Gradient,
                _ if nodes
                    .iter()
                    .any(|n| origins.get(n).is_some_and(|o| o.logits)) =>
                {
                    Category::Logits
                }
                _ if saved(buffer, &nodes, &read_by_backward) => Category::SavedActivation,
                _ => Category::Activation,
            };
            Source {
                category,
                group: origin.group.clone(),
            }
        })
        .collect()
}

fn unknown() -> Source {
    Source {
        category: Category::Activation,
        group: "unknown".into(),
    }
}

/// Whether a value of `buffer` (its nodes) is read by the backward.
fn saved(buffer: &Buffer, nodes: &[usize], read_by_backward: &BTreeSet<usize>) -> bool {
    buffer.class == BufferClass::Activation && nodes.iter().any(|n| read_by_backward.contains(n))
}

/// The node of a plan value `"node.port"`.
fn value_node(value: &str) -> Option<usize> {
    value.split('.').next()?.parse().ok()
}

/// Forward nodes that some backward op reads.
fn read_by_backward(graph: &Graph, origins: &BTreeMap<usize, Origin>) -> BTreeSet<usize> {
    let mut read = BTreeSet::new();
    for node in graph.node_indices() {
        if origins.get(&node.index()).is_some_and(|o| o.backward) {
            for operand in graph.operands(node) {
                if origins
                    .get(&operand.node.index())
                    .is_some_and(|o| !o.backward)
                {
                    read.insert(operand.node.index());
                }
            }
        }
    }
    read
}

/// Every node's origin (rules 1 and 2).
fn origins(graph: &Graph) -> BTreeMap<usize, Origin> {
    let mut last_name: BTreeMap<usize, &str> = BTreeMap::new();
    for (name, value) in graph.value_names() {
        last_name.insert(value.node.index(), name);
    }
    let seed = graph.input_named("loss_seed").map(|v| v.node);
    let mut origins: BTreeMap<usize, Origin> = BTreeMap::new();
    let (mut segment, mut in_logits) = ("embed".to_string(), false);
    let mut previous_backward = "head".to_string();
    for node in graph.node_indices() {
        let Some(weight) = graph.node(node) else {
            continue;
        };
        let operands = graph.operands(node);
        let origin = match &weight.kind {
            NodeKind::Input { name, kind } => Origin {
                group: input_group(name, *kind),
                backward: Some(node) == seed,
                logits: false,
                optimizer: false,
            },
            NodeKind::Op(op) => {
                let optimizer = op.adamw().is_some();
                let backward = operands
                    .iter()
                    .any(|v| origins.get(&v.node.index()).is_some_and(|o| o.backward));
                if backward {
                    let forward_op = (operands.iter().rev())
                        .filter(|v| {
                            matches!(graph.node(v.node).map(|n| &n.kind), Some(NodeKind::Op(_)))
                        })
                        .find_map(|v| origins.get(&v.node.index()).filter(|o| !o.backward));
                    let persistent = operands.iter().find_map(|v| {
                        let group = &origins.get(&v.node.index())?.group;
                        let input = matches!(
                            graph.node(v.node).map(|n| &n.kind),
                            Some(NodeKind::Input { kind, .. }) if kind.is_persistent()
                        );
                        input.then_some(group)
                    });
                    let group = match (forward_op, persistent) {
                        (Some(origin), _) => origin.group.clone(),
                        (None, Some(group)) => group.clone(),
                        (None, None) => previous_backward.clone(),
                    };
                    previous_backward = group.clone();
                    Origin {
                        group,
                        backward: true,
                        logits: false,
                        optimizer,
                    }
                } else {
                    if let Some(name) = last_name.get(&node.index()) {
                        segment = name_group(name);
                        in_logits = in_logits || *name == "logits";
                    }
                    Origin {
                        group: segment.clone(),
                        backward: false,
                        logits: in_logits,
                        optimizer,
                    }
                }
            }
        };
        origins.insert(node.index(), origin);
    }
    origins
}

/// `layers.3.attn.q` → `layer 3`; `embed` → `embed`; the rest (`norm`, `logits`) → `head`.
fn name_group(name: &str) -> String {
    match layer_of(name, "layers.") {
        Some(layer) => format!("layer {layer}"),
        None if name == "embed" => "embed".into(),
        None => "head".into(),
    }
}

/// Params and state by name: a layer's, the embedding's, the head's (final norm, lm_head);
/// per-run inputs are `inputs`.
fn input_group(name: &str, kind: InputKind) -> String {
    if !kind.is_persistent() {
        return "inputs".into();
    }
    let param = name
        .strip_prefix("adamw.m.")
        .or_else(|| name.strip_prefix("adamw.v."))
        .unwrap_or(name);
    if let Some(layer) = layer_of(param, "model.layers.") {
        return format!("layer {layer}");
    }
    // KV caches `cache.k.3` (a pool's may carry a prefix).
    for cache in ["cache.k.", "cache.v."] {
        if let Some(at) = param.find(cache) {
            if let Ok(layer) = param[at + cache.len()..].parse::<usize>() {
                return format!("layer {layer}");
            }
        }
    }
    match param.starts_with("model.embed_tokens") {
        true => "embed".into(),
        false => "head".into(),
    }
}

/// The layer number after `prefix` in `name` (`layers.3.…` → 3).
fn layer_of(name: &str, prefix: &str) -> Option<usize> {
    name.strip_prefix(prefix)?.split('.').next()?.parse().ok()
}
