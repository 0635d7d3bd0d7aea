//! The fusion pass: rules that match subgraphs of a typed program and rewrite them into the
//! fused ops of the op set, run after tracing (and autodiff) and before planning. The result
//! is a new graph, type-checked op by op as it is built, with dead nodes dropped; the
//! unfused graph stays the reference (`--fusion off`).
//!
//! Rules (each a subgraph of the traced bf16-weight programs, matched through the views the
//! tracer puts between them):
//! - `linear`: `Cast{bf16}(x) → MatMul{transpose_b}(·, w) [→ Add(·, bias)]` with `w` a bf16
//!   parameter becomes one [`Op::Linear`] group (the cast is read into the product, the bias
//!   into its epilogue);
//! - `swiglu`: `SwiGlu(linear_gate(x), linear_up(x))` becomes one two-group `Linear` with the
//!   SwiGLU epilogue (the gate and up results never exist);
//! - `group`: linears of the same input (through reshapes: q, k and v of one layer) become one
//!   `Linear` of up to [`LINEAR_MAX_GROUPS`] groups, which reads the input once;
//! - `rope_kv`: a decode attention's `Rope` of q, `Rope` of k and `KvCacheWrite`s of k and v
//!   (read by that `CachedAttention` alone) become one [`Op::RopeKvWrite`]: one launch
//!   instead of four, the rotated keys written straight into the cache; at a prefill's
//!   `FlashAttention`, the same ops and v's head-major copy become one staged `RopeKvWrite`,
//!   which also writes q, k and v as the f16 rows that attention's kernels read: one launch
//!   instead of eight (where the head dim is one of the kernels' own);
//! - `add_rmsnorm`: a one-group linear read by an `AddRmsNorm` alone (the residual add and
//!   the next layer's norm after o and down, the final norm) takes the norm as its epilogue;
//! - `views`: a `Contiguous` of a view that moves no element — a transpose that only moves
//!   dims of size 1 past each other (decode's one token put heads first), a slice of a whole
//!   axis (decode's last position) — of a dense value becomes a `Reshape` of it, or the value
//!   itself: no copy;
//! - `widened`: an operand an op may take stored in bf16 ([`Op::stored_operands`]) that is
//!   `Cast{f32}` of a bf16 value (through reshapes) read by that op alone (or only ever as a
//!   stored operand) is the bf16 value, widened as the op reads it (mixed precision: AdamW's
//!   rounded weight gradients, both rounded input gradients of each sum the backward makes,
//!   the rounded gradient SwiGLU's backward takes, its rounded gate and up where the
//!   precision keeps them, and the rounded `grad_out` FlashAttention's backward rounds again
//!   on entry);
//! - `round_trip`: `Cast{bf16}` of `Cast{f32}` of a bf16 value (through reshapes) is that
//!   value: the backward's rounding of a rounded value's gradient for its GEMM;
//! - `adamw_copy`: an `AdamW` whose new param a `CastInto` rounds into the param's persistent
//!   bf16 copy (mixed precision) becomes one [`Op::AdamWCopy`], which writes the copy too;
//! - `loss_grad`: a bf16 `LinearCrossEntropy` and its backward, whose `grad_loss` is a graph
//!   input (the train step's seed), become one [`Op::LinearCrossEntropyGrad`] at the loss:
//!   the LM head's logits are computed once instead of again in the backward;
//! - `shared`, on the fused program: an op that repeats an earlier one (the same op on the
//!   same operands: mixed precision's casts of one normed input for q, k and v, or for gate
//!   and up) is the earlier op's result;
//!
//! and last, on that program (where ops read what `widened` retyped, and the casts of one
//! value for several readers are one):
//!
//! - `rounded`: an op whose results of a rounded form ([`Op::rounded_results`]) are each read only
//!   by a `Cast{bf16}` (through reshapes each read by the next alone) becomes one [`Op::Rounded`],
//!   which writes them rounded: the f32 ones never exist. Mixed precision's backward rounds each
//!   gradient of a bf16 GEMM input to bf16 (`rounded_matmul`); SwiGLU's result and its backward's
//!   gradients (`rounded_swiglu`, `rounded_swiglu_backward`) and the normed rows
//!   (`rounded_rmsnorm`, `rounded_add_rmsnorm`: the sum stays f32) feed bf16 GEMMs, and prefill's
//!   attention output the o GEMM (`rounded_flash_attention`); a result read only where it is
//!   rounded on entry ([`Op::rounded_on_entry`]), directly or through reshapes, is written rounded
//!   too (`rounded_rope`, `rounded_contiguous`: q, k and the head-major v, which the bf16
//!   FlashAttention rounds as it reads; in bf16 inference, a linear's input: `rounded_rmsnorm`,
//!   `rounded_flash_attention`, and `rounded_linear`, a linear's SwiGLU result or normed rows past
//!   [`UNROUNDED_LINEAR_MAX_ROWS`](crate::UNROUNDED_LINEAR_MAX_ROWS) rows). Where such a result is read both rounded and as it is, an op whose
//!   kernel can write both ([`Op::also_roundable`]) becomes one [`Op::AlsoRounded`]
//!   (`also_rounded_*`: the backward's input gradients of the norms and RoPE, v's gradient made
//!   token-major, the train step's attention output);
//! - `embedding_onto`: an `Add` of an `EmbeddingBackward` read by the add alone and a term of
//!   its shape (a tied embedding's gradient: the LM head's plus the embedding's, the LM
//!   head's read as the `widened` rule left it) is one `EmbeddingBackward` onto that term;
//!
//! and on the program those make:
//!
//! - `linear_rope`: a decode attention's `RopeKvWrite` whose q, k and v are the results of one
//!   q/k/v `Linear` (through reshapes, read by nothing else) becomes that linear's `rope_kv`
//!   epilogue: the projection, its biases (the rotations' too), RoPE and the cache append in
//!   one op, whose kernels finish each pair of rotated columns together (no q, k or v is
//!   written apart);
//! - `embedding_adamw`: an `AdamW` or `AdamWCopy` (no gradient scale) of an `EmbeddingBackward`
//!   read by that update alone is two [`Op::EmbeddingAdamW`]s, the rows no id names and then,
//!   on its results, the named rows: the `[V,H]` gradient is never written and read back, and
//!   the unnamed rows are updated from the base (or 0) alone, which a tied table's LM head
//!   gives at the backward's start (the planner computes both in the state's own storage).
//!
//! Why fixed fused ops with hand-written kernel templates (kernels/cuda/linear.cu, cache.cu)
//! rather than CUDA C generated per matched subgraph: the patterns that matter are few and the same in
//! every Transformer, each fused kernel is checked against the CPU reference once for every
//! program and shape (not per generated variant), and a fixed module compiles once rather than
//! per program at start-up.

use std::collections::{BTreeMap, BTreeSet};

use petgraph::graph::NodeIndex;

use crate::graph::NodeKind;
use crate::op::LINEAR_MAX_GROUPS;
use crate::{DType, Graph, InputKind, Op, Result, ValueId};
use adamw_copy::with_copies;
use add_rmsnorm::with_add_rmsnorm;
use embedding_adamw::embedding_adamw_fusions;
use embedding_onto::embedding_onto_fusions;
use linear_rope::linear_rope_fusions;
use loss_grad::loss_grad_fusions;
pub use loss_grad::split_loss_grads;
use rope_kv::rope_kv_fusions;
use round_trip::round_trip_rewrites;
use rounded::rounded_fusions;
use shared::shared_rewrites;
use views::{view_rewrites, ViewRewrite};
use widened::widened_fusions;

mod adamw_copy;
mod add_rmsnorm;
mod embedding_adamw;
mod embedding_onto;
mod linear_rope;
mod loss_grad;
mod rope_kv;
mod round_trip;
mod rounded;
mod shared;
mod views;
mod widened;

/// One `MatMul` that the `linear` rule takes, with what it absorbs.
#[derive(Clone, Debug)]
struct Candidate {
    /// The product's input: the cast's f32 operand, or a bf16 value.
    x: ValueId,
    /// Values that share the input: `x` seen through reshapes, and whether the cast is folded.
    key: (ValueId, Vec<usize>, bool),
    weight: ValueId,
    bias: Option<ValueId>,
    matmul: NodeIndex,
    /// The nodes the group replaces (cast, matmul, add).
    absorbed: Vec<NodeIndex>,
    /// The value the group's result stands for (the add's, else the matmul's).
    end: ValueId,
}

/// One fused op to emit, at the position of `at` in the old graph: `op` on (old) `operands`,
/// its results standing for the old values `ends` (viewed as their shapes where they differ),
/// replacing the old nodes `replaced`. Fusions at one node are emitted in their list's order,
/// so a later one may read, as its operands, the ends an earlier one stands for, and stand
/// for them in turn (a chain of updates of one state).
struct Fusion {
    at: NodeIndex,
    replaced: Vec<NodeIndex>,
    op: Op,
    operands: Vec<ValueId>,
    ends: Vec<ValueId>,
}

impl Fusion {
    /// The `Linear` of `members` (with the SwiGlu node `swiglu` and the views between them).
    fn linear(
        at: NodeIndex,
        members: &[Candidate],
        swiglu: Option<(NodeIndex, Vec<NodeIndex>)>,
    ) -> Fusion {
        let mut replaced: Vec<NodeIndex> = members
            .iter()
            .flat_map(|m| m.absorbed.iter().copied())
            .collect();
        let mut operands = vec![members[0].x];
        operands.extend(members.iter().map(|m| m.weight));
        operands.extend(members.iter().filter_map(|m| m.bias));
        let op = Op::Linear {
            biases: members.iter().map(|m| m.bias.is_some()).collect(),
            swiglu: swiglu.is_some(),
            add_rmsnorm: None,
            rope_kv: None,
        };
        let ends = match swiglu {
            Some((node, views)) => {
                replaced.push(node);
                replaced.extend(views);
                vec![ValueId { node, port: 0 }]
            }
            None => members.iter().map(|m| m.end).collect(),
        };
        Fusion {
            at,
            replaced,
            op,
            operands,
            ends,
        }
    }
}

/// The program with every rule applied (see the module doc).
pub fn fuse(graph: &Graph) -> Result<Graph> {
    let users = users(graph);
    let candidates: Vec<Candidate> = graph
        .node_indices()
        .filter_map(|node| candidate(graph, &users, node))
        .collect();
    let mut fusions = swiglu_fusions(graph, &users, &candidates);
    let paired: BTreeSet<NodeIndex> = fusions.iter().flat_map(|f| f.replaced.clone()).collect();
    let mut groups: BTreeMap<&(ValueId, Vec<usize>, bool), Vec<Candidate>> = BTreeMap::new();
    for candidate in candidates
        .iter()
        .filter(|c| !paired.contains(&matmul_of(c)))
    {
        groups
            .entry(&candidate.key)
            .or_default()
            .push(candidate.clone());
    }
    for members in groups.into_values() {
        for chunk in members.chunks(LINEAR_MAX_GROUPS) {
            let at = chunk
                .iter()
                .map(matmul_of)
                .min()
                .expect("chunks are not empty");
            let linear = Fusion::linear(at, chunk, None);
            fusions.push(with_add_rmsnorm(graph, &users, linear));
        }
    }
    fusions.extend(rope_kv_fusions(graph, &users));
    fusions.extend(loss_grad_fusions(graph, &users));
    let taken: BTreeSet<NodeIndex> = fusions.iter().flat_map(|f| f.replaced.clone()).collect();
    fusions.extend(widened_fusions(graph, &users, &taken));
    let fusions = with_copies(graph, fusions);
    let mut rewrites = view_rewrites(graph);
    rewrites.extend(round_trip_rewrites(graph));
    let fused = rebuild(graph, &fusions, &rewrites, &BTreeSet::new())?;
    let shared = without_dead_ops(&rebuild(
        &fused,
        &[],
        &shared_rewrites(&fused),
        &BTreeSet::new(),
    )?)?;
    // On the fused program: an op reads its operands as `widened` retyped them, and the casts
    // of one value for several readers (the normed rows for q, k and v) are one.
    let shared_users = self::users(&shared);
    let mut last = rounded_fusions(&shared, &shared_users);
    last.extend(embedding_onto_fusions(&shared, &shared_users));
    let last = with_fusions(shared, &last)?;
    // On that program, where a tied table's gradient is one scatter onto the LM head's, and
    // q/k/v and their RoPE and cache write are each one op.
    let last_users = self::users(&last);
    let mut updates = embedding_adamw_fusions(&last, &last_users);
    updates.extend(linear_rope_fusions(&last, &last_users));
    with_fusions(last, &updates)
}

/// `graph` with `fusions` made and the ops left dead dropped (`graph` itself for none).
fn with_fusions(graph: Graph, fusions: &[Fusion]) -> Result<Graph> {
    match fusions.is_empty() {
        true => Ok(graph),
        false => without_dead_ops(&rebuild(
            &graph,
            fusions,
            &BTreeMap::new(),
            &BTreeSet::new(),
        )?),
    }
}

fn matmul_of(candidate: &Candidate) -> NodeIndex {
    candidate.matmul
}

/// Every value's readers (`None`: an output or a write).
type Users = BTreeMap<ValueId, Vec<Option<NodeIndex>>>;

/// Every value's readers: (node, operand port); outputs and writes count as readers too.
fn users(graph: &Graph) -> Users {
    let mut users: Users = BTreeMap::new();
    for node in graph.node_indices() {
        for operand in graph.operands(node) {
            users.entry(operand).or_default().push(Some(node));
        }
    }
    for (_, value) in graph.outputs().iter().chain(graph.writes()) {
        users.entry(*value).or_default().push(None);
    }
    users
}

fn op_of(graph: &Graph, node: NodeIndex) -> Option<&Op> {
    match &graph.node(node)?.kind {
        NodeKind::Op(op) => Some(op),
        NodeKind::Input { .. } => None,
    }
}

fn is_param(graph: &Graph, value: ValueId) -> bool {
    matches!(
        graph.node(value.node).map(|n| &n.kind),
        Some(NodeKind::Input {
            kind: InputKind::Param,
            ..
        })
    )
}

fn of_dtype(graph: &Graph, value: ValueId, dtype: DType) -> bool {
    graph.value_type(value).is_ok_and(|t| t.dtype == dtype)
}

/// Whether `op` takes `operands` (old values of `graph`): its type rule accepts their types.
fn takes(graph: &Graph, op: &Op, operands: &[ValueId]) -> bool {
    let types: Option<Vec<_>> = (operands.iter())
        .map(|v| graph.value_type(*v).ok().cloned())
        .collect();
    types.is_some_and(|t| op.infer(&t).is_ok())
}

/// Whether `value` is read by exactly `reader` and nothing else.
fn only_read_by(users: &Users, value: ValueId, reader: NodeIndex) -> bool {
    users
        .get(&value)
        .is_some_and(|u| u.as_slice() == [Some(reader)])
}

/// The `linear` rule at `node`, if it matches.
fn candidate(graph: &Graph, users: &Users, node: NodeIndex) -> Option<Candidate> {
    let Some(Op::MatMul {
        transpose_a: false,
        transpose_b: true,
    }) = op_of(graph, node)
    else {
        return None;
    };
    let [a, weight] = graph.operands(node)[..] else {
        return None;
    };
    let weight_type = graph.value_type(weight).ok()?;
    if !is_param(graph, weight) || weight_type.dtype != DType::BF16 || weight_type.dims().len() != 2
    {
        return None;
    }
    let a_type = graph.value_type(a).ok()?;
    if a_type.dims().len() != 2 || a_type.dtype != DType::BF16 {
        return None;
    }
    let mut absorbed = Vec::new();
    // A cast read by this product alone is folded into it.
    let cast_source = match op_of(graph, a.node) {
        Some(Op::Cast { to: DType::BF16 }) if only_read_by(users, a, node) => {
            let source = graph.operands(a.node)[0];
            (graph.value_type(source).ok()?.dtype == DType::F32).then_some(source)
        }
        _ => None,
    };
    if cast_source.is_some() {
        absorbed.push(a.node);
    }
    absorbed.push(node);
    let x = cast_source.unwrap_or(a);
    let product = ValueId { node, port: 0 };
    let mut end = product;
    let mut bias = None;
    if let Some([Some(add)]) = users.get(&product).map(Vec::as_slice) {
        if let (Some(Op::Add), [left, b]) = (op_of(graph, *add), &graph.operands(*add)[..]) {
            let n = weight_type.dims()[0];
            let b_type = graph.value_type(*b).ok()?;
            if *left == product && is_param(graph, *b) && b_type.dims() == [n] {
                bias = Some(*b);
                absorbed.push(*add);
                end = ValueId {
                    node: *add,
                    port: 0,
                };
            }
        }
    }
    let key = (
        through_reshapes(graph, x),
        a_type.dims().to_vec(),
        cast_source.is_some(),
    );
    Some(Candidate {
        x,
        key,
        weight,
        bias,
        matmul: node,
        absorbed,
        end,
    })
}

/// The value `value` is a reshape (or chain of reshapes) of.
fn through_reshapes(graph: &Graph, mut value: ValueId) -> ValueId {
    while let Some(Op::Reshape { .. }) = op_of(graph, value.node) {
        value = graph.operands(value.node)[0];
    }
    value
}

/// The `swiglu` rule: each SwiGlu whose gate and up are the ends of candidates of one input,
/// read by it alone.
fn swiglu_fusions(graph: &Graph, users: &Users, candidates: &[Candidate]) -> Vec<Fusion> {
    let by_end: BTreeMap<ValueId, &Candidate> = candidates.iter().map(|c| (c.end, c)).collect();
    let mut fusions = Vec::new();
    for node in graph.node_indices() {
        let Some(Op::SwiGlu) = op_of(graph, node) else {
            continue;
        };
        let [gate, up] = graph.operands(node)[..] else {
            continue;
        };
        // Each operand is a linear's end, or a reshape of one read by nothing else.
        let end_of = |value: ValueId| match op_of(graph, value.node) {
            Some(Op::Reshape { .. }) if only_read_by(users, value, node) => {
                let end = graph.operands(value.node)[0];
                only_read_by(users, end, value.node).then_some(end)
            }
            _ => only_read_by(users, value, node).then_some(value),
        };
        let views: Vec<NodeIndex> = [gate, up]
            .iter()
            .filter(|v| matches!(op_of(graph, v.node), Some(Op::Reshape { .. })))
            .map(|v| v.node)
            .collect();
        let (Some(gate), Some(up)) = (end_of(gate), end_of(up)) else {
            continue;
        };
        let (Some(g), Some(u)) = (by_end.get(&gate), by_end.get(&up)) else {
            continue;
        };
        if gate != up && g.key == u.key {
            let members = [(*g).clone(), (*u).clone()];
            fusions.push(Fusion::linear(node, &members, Some((node, views))));
        }
    }
    fusions
}

/// A new graph: `graph` without the op nodes in `dead`, with each fusion's nodes replaced by
/// its fused op, emitted where the fusion says (every operand of it is defined before that
/// node), and each view rewrite made.
fn rebuild(
    graph: &Graph,
    fusions: &[Fusion],
    views: &BTreeMap<NodeIndex, ViewRewrite>,
    dead: &BTreeSet<NodeIndex>,
) -> Result<Graph> {
    let skipped: BTreeSet<NodeIndex> = (fusions.iter())
        .flat_map(|f| f.replaced.iter().copied())
        .chain(dead.iter().copied())
        .collect();
    let mut at: BTreeMap<NodeIndex, Vec<&Fusion>> = BTreeMap::new();
    for fusion in fusions {
        at.entry(fusion.at).or_default().push(fusion);
    }
    let mut new = Graph::new(graph.name());
    let mut map: BTreeMap<ValueId, ValueId> = BTreeMap::new();
    for node in graph.node_indices() {
        let Some(old) = graph.node(node) else {
            continue;
        };
        for fusion in at.get(&node).into_iter().flatten() {
            let operands = (fusion.operands.iter())
                .map(|v| mapped(&map, v))
                .collect::<Result<Vec<_>>>()?;
            let results = new.op(fusion.op.clone(), &operands)?;
            for (end, mut result) in fusion.ends.iter().zip(results) {
                // A result computed flat stands for a value of another view: view it so.
                let shape = graph.value_type(*end)?.shape.clone();
                if shape != new.value_type(result)?.shape {
                    result = new.op1(Op::Reshape { shape }, &[result])?;
                }
                map.insert(*end, result);
            }
        }
        if skipped.contains(&node) {
            continue;
        }
        match views.get(&node) {
            Some(ViewRewrite::Same(source)) => {
                map.insert(ValueId { node, port: 0 }, mapped(&map, source)?);
                continue;
            }
            Some(ViewRewrite::Reshape(source)) => {
                let shape = old.outputs[0].shape.clone();
                let result = new.op1(Op::Reshape { shape }, &[mapped(&map, source)?])?;
                map.insert(ValueId { node, port: 0 }, result);
                continue;
            }
            None => {}
        }
        copy_node(graph, node, (&mut new, &mut map), |_| None)?;
    }
    carry_over(graph, &mut new, &map)?;
    Ok(new)
}

/// `value` of the old graph as `map` has it in the new one. Operands precede their readers,
/// so every value read is mapped by then.
pub(crate) fn mapped(map: &BTreeMap<ValueId, ValueId>, value: &ValueId) -> Result<ValueId> {
    map.get(value)
        .copied()
        .ok_or_else(|| crate::Error::Invalid {
            rule: "rebuild: operands before readers",
            detail: format!("{value} is read before the rebuilt graph defines it"),
        })
}

/// Node `node` of `graph` as it is into `new` (an input, or its op over its operands mapped
/// through `map`, or read `instead` where that names another value), its results mapped.
pub(crate) fn copy_node(
    graph: &Graph,
    node: NodeIndex,
    (new, map): (&mut Graph, &mut BTreeMap<ValueId, ValueId>),
    instead: impl Fn(&ValueId) -> Option<ValueId>,
) -> Result<()> {
    let Some(old) = graph.node(node) else {
        return Ok(());
    };
    let results = match &old.kind {
        NodeKind::Input { name, kind } => {
            vec![new.input(name, *kind, old.outputs[0].clone())?]
        }
        NodeKind::Op(op) => {
            let operands = (graph.operands(node).iter())
                .map(|v| instead(v).map_or_else(|| mapped(map, v), Ok))
                .collect::<Result<Vec<_>>>()?;
            new.op(op.clone(), &operands)?
        }
    };
    for (port, result) in results.into_iter().enumerate() {
        map.insert(ValueId { node, port }, result);
    }
    Ok(())
}

/// `graph`'s outputs, writes, derived states and value names into `new`, through `map` (old
/// value → new value; every output and write must be mapped). A name moves with its value; a
/// value gone from `new` (fused away, an op no output needs) loses its name.
pub(crate) fn carry_over(
    graph: &Graph,
    new: &mut Graph,
    map: &BTreeMap<ValueId, ValueId>,
) -> Result<()> {
    let mapped = |v: &ValueId| {
        map.get(v).copied().ok_or_else(|| crate::Error::Invalid {
            rule: "rebuild: outputs defined",
            detail: format!("{v} is an output or write the rebuilt graph does not define"),
        })
    };
    for (name, value) in graph.outputs() {
        new.output(name, mapped(value)?)?;
    }
    for (name, value) in graph.writes() {
        new.write(name, mapped(value)?)?;
    }
    for (state, from) in graph.derived() {
        new.derive(state, from)?;
    }
    for (name, value) in graph.value_names() {
        if let Some(&value) = map.get(value) {
            new.name_value(name, value)?;
        }
    }
    Ok(())
}

/// `graph` without the ops no output or write depends on (the inputs all stay).
fn without_dead_ops(graph: &Graph) -> Result<Graph> {
    let mut live: BTreeSet<NodeIndex> = BTreeSet::new();
    let mut stack: Vec<NodeIndex> = (graph.outputs().iter().chain(graph.writes()))
        .map(|(_, v)| v.node)
        .collect();
    while let Some(node) = stack.pop() {
        if live.insert(node) {
            stack.extend(graph.operands(node).iter().map(|v| v.node));
        }
    }
    let dead: Vec<NodeIndex> = graph
        .node_indices()
        .filter(|n| !live.contains(n) && op_of(graph, *n).is_some())
        .collect();
    if dead.is_empty() {
        return Ok(graph.clone());
    }
    rebuild(graph, &[], &BTreeMap::new(), &dead.into_iter().collect())
}

/// Every op of `graph` with its operands, in node order (the rules' tests read fused graphs so).
#[cfg(test)]
fn ops_with_operands(graph: &Graph) -> Vec<(Op, Vec<ValueId>)> {
    (graph.ops())
        .map(|(n, op)| (op.clone(), graph.operands(n)))
        .collect()
}

#[cfg(test)]
#[path = "fuse_tests.rs"]
mod tests;
