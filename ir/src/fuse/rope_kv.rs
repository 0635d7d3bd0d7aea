//! The `rope_kv` rule (see the pass's module doc): the RoPE of a decode attention's queries
//! and keys and the cache writes of its keys and values become one [`Op::RopeKvWrite`].

use petgraph::graph::NodeIndex;

use super::{only_read_by, op_of, Fusion, Users};
use crate::{Graph, Op, ValueId};

/// The `rope_kv` rule at every `CachedAttention` it matches.
pub(super) fn rope_kv_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    graph
        .node_indices()
        .filter_map(|node| rope_kv_fusion(graph, users, node))
        .collect()
}

/// Whether `value` is read by `reader` and otherwise only by outputs and writes.
fn read_by_or_kept(users: &Users, value: ValueId, reader: NodeIndex) -> bool {
    users.get(&value).is_some_and(|u| {
        u.contains(&Some(reader)) && u.iter().all(|r| r.is_none() || *r == Some(reader))
    })
}

/// `CachedAttention(Rope(q), KvCacheWrite(k_cache, Rope(k)), KvCacheWrite(v_cache, v))` at
/// `attention`, each rotation and write read by this attention alone (the caches also by the
/// program's writes), both rotations of one theta, bias flag and positions, both writes of
/// the attention's positions (and rows); q, k and v of one batch, length and head size.
fn rope_kv_fusion(graph: &Graph, users: &Users, attention: NodeIndex) -> Option<Fusion> {
    let Some(Op::CachedAttention { .. }) = op_of(graph, attention) else {
        return None;
    };
    let attention_operands = graph.operands(attention);
    let (q_rot, k_written, v_written) = (
        attention_operands[0],
        attention_operands[1],
        attention_operands[2],
    );
    let indices = &attention_operands[3..];
    let Some(&Op::Rope { theta, bias }) = op_of(graph, q_rot.node) else {
        return None;
    };
    let write_of = |written: ValueId| -> Option<(ValueId, ValueId)> {
        let (Some(Op::KvCacheWrite), true) = (
            op_of(graph, written.node),
            read_by_or_kept(users, written, attention),
        ) else {
            return None;
        };
        let operands = graph.operands(written.node);
        (operands[2..] == *indices).then_some((operands[0], operands[1]))
    };
    let (k_cache, k_rot) = write_of(k_written)?;
    let (v_cache, v) = write_of(v_written)?;
    let same_rope = op_of(graph, k_rot.node) == Some(&Op::Rope { theta, bias });
    if !same_rope
        || !only_read_by(users, q_rot, attention)
        || !only_read_by(users, k_rot, k_written.node)
    {
        return None;
    }
    let (q_rope, k_rope) = (graph.operands(q_rot.node), graph.operands(k_rot.node));
    if q_rope[1] != k_rope[1] {
        return None;
    }
    // q [B,T,Hq,D], k [B,T,Hkv,D] and v [B,Hkv,T,D] (the fused op's type rule).
    let dims = |v: ValueId| graph.value_type(v).ok().map(|t| t.dims().to_vec());
    let (q_dims, k_dims, v_dims) = (dims(q_rope[0])?, dims(k_rope[0])?, dims(v)?);
    let (&[b, t, _, d], &[kb, kt, hkv, kd]) = (&q_dims[..], &k_dims[..]) else {
        return None;
    };
    let v_dtype = graph.value_type(v).ok()?.dtype;
    if (kb, kt, kd) != (b, t, d)
        || v_dims != [b, hkv, t, d]
        || v_dtype != graph.value_type(k_rope[0]).ok()?.dtype
    {
        return None;
    }
    let mut operands = vec![q_rope[0], k_rope[0], v, k_cache, v_cache, q_rope[1]];
    operands.extend(indices.iter().copied());
    operands.extend(q_rope.get(2).copied());
    operands.extend(k_rope.get(2).copied());
    let replaced = vec![q_rot.node, k_rot.node, k_written.node, v_written.node];
    Some(Fusion {
        // After every operand: the last node it replaces.
        at: replaced.iter().copied().max()?,
        replaced,
        op: Op::RopeKvWrite { theta, bias },
        operands,
        ends: vec![q_rot, k_written, v_written],
    })
}
