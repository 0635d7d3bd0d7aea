//! Recomputation: a value the backward reads, computed again just before its first backward
//! reader instead of kept across the whole step from the forward. The clone is the same op on
//! the same operands, so it gives the same bits, and the train step the same result.
//!
//! A value can be recomputed ([`candidates`]) when its producer is a one-result op of
//! [`cheap`] cost or a `MatMul`, and every operand is still there at the backward: a graph
//! input, a value the backward reads anyway (kept), or a value made by a chain of at most
//! [`MAX_CHAIN`] cheap ops (or views) from such values, recomputed with it. The backward begins
//! at the first reader of the step's gradient seed ([`backward_start`]).

use std::collections::{BTreeMap, BTreeSet};

use petgraph::graph::NodeIndex;

use crate::fuse::{carry_over, copy_node, mapped};
use crate::graph::{Graph, NodeKind};
use crate::{Error, Op, Result, ValueId};

/// The most ops a recomputed value's chain clones (its own producer included).
pub const MAX_CHAIN: usize = 3;

/// A value that can be recomputed, and what it trades.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The value the forward made and the backward reads.
    pub value: ValueId,
    /// The nodes cloned to recompute it, in graph order (its own producer last).
    pub nodes: Vec<NodeIndex>,
    /// Its bytes: no longer kept from the forward to the backward.
    pub bytes: u64,
    /// The clones' work: bytes read and written by elementwise ops, FLOPs of products.
    pub moved_bytes: u64,
    pub flops: u64,
}

impl Candidate {
    /// An estimate of the clones' time on the GPU kiln measures (BENCHMARKS.md: H200, ~4 TB/s
    /// of HBM, ~600 TFLOP/s of bf16 tensor-core products), in microseconds.
    pub fn estimated_us(&self) -> f64 {
        self.moved_bytes as f64 / 4.0e6 + self.flops as f64 / 6.0e8
    }
}

/// The first node that reads `seed` (the gradient seed `append_backward` was given): where the
/// backward begins.
pub fn backward_start(graph: &Graph, seed: ValueId) -> Option<NodeIndex> {
    graph
        .node_indices()
        .find(|&node| graph.operands(node).contains(&seed))
}

/// Ops recomputed at the cost of the bytes they move: elementwise ops, casts, norms, RoPE,
/// gathers and views, and those of them that write rounded results.
pub fn cheap(op: &Op) -> bool {
    if let Op::Rounded(op) | Op::AlsoRounded(op) = op {
        return cheap(op);
    }
    matches!(
        op,
        Op::Cast { .. }
            | Op::SwiGlu
            | Op::Add
            | Op::Mul
            | Op::Scale { .. }
            | Op::RmsNorm { .. }
            | Op::Rope { .. }
            | Op::Softmax
            | Op::Embedding
            | Op::BroadcastTo { .. }
            | Op::Contiguous
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. }
    )
}

fn is_view(op: &Op) -> bool {
    matches!(
        op,
        Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. }
    )
}

fn op_of(graph: &Graph, node: NodeIndex) -> Option<&Op> {
    match &graph.node(node)?.kind {
        NodeKind::Op(op) => Some(op),
        NodeKind::Input { .. } => None,
    }
}

/// Readers of every value, in node order.
fn readers(graph: &Graph) -> BTreeMap<ValueId, Vec<NodeIndex>> {
    let mut readers: BTreeMap<ValueId, Vec<NodeIndex>> = BTreeMap::new();
    for node in graph.node_indices() {
        for operand in graph.operands(node) {
            readers.entry(operand).or_default().push(node);
        }
    }
    readers
}

fn bytes_of(graph: &Graph, value: ValueId) -> Result<u64> {
    Ok(graph.value_type(value)?.size_bytes() as u64)
}

/// Ops a chain may clone: the cheap ones and products.
fn recomputable(op: &Op) -> bool {
    cheap(op) || matches!(op, Op::MatMul { .. })
}

/// Every value that can be recomputed, in node order: made before `backward_from`, read at
/// or after it, not an output or a write. A view counts when what it views is recomputed with
/// it (the buffer they share is then freed).
pub fn candidates(graph: &Graph, backward_from: NodeIndex) -> Result<Vec<Candidate>> {
    let readers = readers(graph);
    let late = |value: &ValueId| {
        (readers.get(value)).is_some_and(|r| r.iter().any(|&n| n >= backward_from))
    };
    let pinned: BTreeSet<ValueId> = (graph.outputs().iter().chain(graph.writes()))
        .map(|(_, v)| *v)
        .collect();
    // Kept anyway at the backward: inputs and the values it reads.
    let kept = |value: &ValueId| op_of(graph, value.node).is_none() || late(value);
    let mut out = Vec::new();
    for node in graph.node_indices().take_while(|&n| n < backward_from) {
        let Some(op) = op_of(graph, node) else {
            continue;
        };
        let value = ValueId { node, port: 0 };
        let single = graph.node(node).is_some_and(|n| n.outputs.len() == 1);
        if !single || !late(&value) || pinned.contains(&value) || !recomputable(op) {
            continue;
        }
        // A view of a kept value frees nothing.
        let Some(nodes) = chain(graph, node, &kept) else {
            continue;
        };
        if nodes.iter().all(|&n| op_of(graph, n).is_some_and(is_view)) {
            continue;
        }
        let (mut moved_bytes, mut flops) = (0u64, 0u64);
        for &n in &nodes {
            let op = op_of(graph, n).expect("chains hold ops");
            let result = bytes_of(graph, ValueId { node: n, port: 0 })?;
            match op {
                Op::MatMul { .. } => flops += matmul_flops(graph, n)?,
                op if is_view(op) => {}
                _ => {
                    moved_bytes += result;
                    for operand in graph.operands(n) {
                        moved_bytes += bytes_of(graph, operand)?;
                    }
                }
            }
        }
        out.push(Candidate {
            value,
            nodes,
            bytes: bytes_of(graph, value)?,
            moved_bytes,
            flops,
        });
    }
    Ok(out)
}

/// The nodes to clone for `node`'s result, in graph order: `node` and the recomputable
/// producers of operands that are not kept, at most [`MAX_CHAIN`] ops besides views; `None`
/// past that.
fn chain(
    graph: &Graph,
    node: NodeIndex,
    kept: &dyn Fn(&ValueId) -> bool,
) -> Option<Vec<NodeIndex>> {
    let mut nodes = BTreeSet::from([node]);
    let mut pending = vec![node];
    while let Some(n) = pending.pop() {
        for operand in graph.operands(n) {
            if kept(&operand) || nodes.contains(&operand.node) {
                continue;
            }
            let op = op_of(graph, operand.node)?;
            let single = graph.node(operand.node)?.outputs.len() == 1;
            if !single || !recomputable(op) {
                return None;
            }
            nodes.insert(operand.node);
            pending.push(operand.node);
        }
    }
    let ops = nodes
        .iter()
        .filter(|&&n| op_of(graph, n).is_some_and(|op| !is_view(op)))
        .count();
    (ops <= MAX_CHAIN).then(|| nodes.into_iter().collect())
}

fn matmul_flops(graph: &Graph, node: NodeIndex) -> Result<u64> {
    let out = graph.value_type(ValueId { node, port: 0 })?;
    let a = graph.value_type(graph.operands(node)[0])?;
    let Some(Op::MatMul { transpose_a, .. }) = op_of(graph, node) else {
        return Ok(0);
    };
    let dims = a.dims();
    let k = match (transpose_a, dims.len()) {
        (_, 0 | 1) => 1,
        (true, rank) => dims[rank - 2],
        (false, rank) => dims[rank - 1],
    };
    Ok(2 * out.shape.numel() as u64 * k as u64)
}

/// `graph` with every `chosen` value recomputed: its chain cloned just before its first reader
/// at or after `backward_from`, and every such reader reading the clone; with each chosen
/// value as the new graph numbers it and its clone, in `chosen`'s order. Inputs, outputs,
/// writes, derived states and names are carried over unchanged.
pub fn recompute(
    graph: &Graph,
    chosen: &[Candidate],
    backward_from: NodeIndex,
) -> Result<(Graph, Vec<(ValueId, ValueId)>)> {
    let readers = readers(graph);
    let mut at: BTreeMap<NodeIndex, Vec<&Candidate>> = BTreeMap::new();
    for candidate in chosen {
        let first = (readers.get(&candidate.value).into_iter().flatten())
            .find(|&&n| n >= backward_from)
            .ok_or_else(|| Error::Invalid {
                rule: "recompute: a backward reader",
                detail: format!(
                    "{} is not read at or after {backward_from:?}",
                    candidate.value
                ),
            })?;
        at.entry(*first).or_default().push(candidate);
    }
    let mut new = Graph::new(graph.name());
    let mut map: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    // Clones of chosen values, read by the backward in their stead.
    let mut clones: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    let by_value: BTreeMap<ValueId, &Candidate> = chosen.iter().map(|c| (c.value, c)).collect();
    for node in graph.node_indices() {
        for candidate in at.get(&node).into_iter().flatten() {
            emit(graph, candidate, (&by_value, &map), (&mut new, &mut clones))?;
        }
        // The backward reads the clones.
        let clone = |v: &ValueId| clones.get(v).copied().filter(|_| node >= backward_from);
        copy_node(graph, node, (&mut new, &mut map), clone)?;
    }
    carry_over(graph, &mut new, &map)?;
    let pairs = (chosen.iter())
        .map(|c| Ok((mapped(&map, &c.value)?, clones[&c.value])))
        .collect::<Result<Vec<_>>>()?;
    Ok((new, pairs))
}

/// Emits `candidate`'s chain into `new` (once), reading clones of chosen values where they
/// exist — emitting those first when they do not yet, so a clone never keeps an original
/// alive that is itself recomputed.
fn emit(
    graph: &Graph,
    candidate: &Candidate,
    (by_value, map): (&BTreeMap<ValueId, &Candidate>, &BTreeMap<ValueId, ValueId>),
    (new, clones): (&mut Graph, &mut BTreeMap<ValueId, ValueId>),
) -> Result<()> {
    if clones.contains_key(&candidate.value) {
        return Ok(());
    }
    let mut local: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for &n in &candidate.nodes {
        let mut operands = Vec::new();
        for v in graph.operands(n) {
            if let Some(&value) = local.get(&v) {
                operands.push(value);
                continue;
            }
            if let Some(other) = by_value.get(&v).filter(|o| o.value != candidate.value) {
                emit(graph, other, (by_value, map), (new, clones))?;
            }
            operands.push(match clones.get(&v) {
                Some(&clone) => clone,
                None => mapped(map, &v)?,
            });
        }
        let op = op_of(graph, n).expect("chains hold ops").clone();
        local.insert(ValueId { node: n, port: 0 }, new.op1(op, &operands)?);
    }
    clones.insert(candidate.value, local[&candidate.value]);
    Ok(())
}

#[cfg(test)]
#[path = "recompute_tests.rs"]
mod tests;
