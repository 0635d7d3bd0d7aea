//! The `rope_kv` rule (see the pass's module doc): the RoPE of an attention's queries and
//! keys and the cache writes of its keys and values become one [`Op::RopeKvWrite`] — at a
//! decode's `CachedAttention`, and at a prefill's `FlashAttention`, where the op also stages
//! that attention's operands.

use petgraph::graph::NodeIndex;

use super::{only_read_by, op_of, Fusion, Users};
use crate::{DType, Graph, Op, ValueId};

/// The `rope_kv` rule at every `CachedAttention` and `FlashAttention` it matches.
pub(super) fn rope_kv_fusions(graph: &Graph, users: &Users) -> Vec<Fusion> {
    graph
        .node_indices()
        .filter_map(|node| {
            rope_kv_fusion(graph, users, node).or_else(|| staged_fusion(graph, users, node))
        })
        .collect()
}

/// `FlashAttention{rounding}(Rope(q), Rope(k), Contiguous(Transpose{1,2}(v)))` at
/// `attention`, the rotated keys and the head-major values each read by the attention and by
/// one `KvCacheWrite` (the rotated queries and the transpose by their reader alone), both
/// rotations of one theta, bias flag and positions, both writes at one set of indices; q, k
/// and v f32 of one batch, length and head size, k and v of one shape; each write's result
/// read after the fused op's place (by the program's writes, or later ops); the attention
/// rounding to f16 (bf16 inference's prefill; mixed precision's bf16 attention gets rounded
/// operands from the `rounded` rule instead). The fused op stages q, k and v as f16 rows, which
/// the flash kernels read where they are.
fn staged_fusion(graph: &Graph, users: &Users, attention: NodeIndex) -> Option<Fusion> {
    let Some(&Op::FlashAttention {
        rounding: rounding @ DType::F16,
        ..
    }) = op_of(graph, attention)
    else {
        return None;
    };
    let [q_rot, k_rot, v_rows] = graph.operands(attention)[..] else {
        return None;
    };
    let Some(&Op::Rope { theta, bias }) = op_of(graph, q_rot.node) else {
        return None;
    };
    // The one write of `value` besides the attention: (its node, cache, indices).
    let write_of = |value: ValueId| -> Option<(NodeIndex, ValueId, Vec<ValueId>)> {
        let readers = users.get(&value)?;
        let [first, second] = readers[..] else {
            return None;
        };
        let write = match (first?, second?) {
            (a, w) | (w, a) if a == attention && w != attention => w,
            _ => return None,
        };
        let operands = graph.operands(write);
        let is_write = op_of(graph, write) == Some(&Op::KvCacheWrite) && operands[1] == value;
        is_write.then(|| (write, operands[0], operands[2..].to_vec()))
    };
    let (k_write, k_cache, indices) = write_of(k_rot)?;
    let (v_write, v_cache, v_indices) = write_of(v_rows)?;
    let transposed = graph.operands(v_rows.node).first().copied()?;
    let (Some(Op::Contiguous), Some(&Op::Transpose { dim0: 1, dim1: 2 })) =
        (op_of(graph, v_rows.node), op_of(graph, transposed.node))
    else {
        return None;
    };
    let v = graph.operands(transposed.node)[0];
    let same_rope = op_of(graph, k_rot.node) == Some(&Op::Rope { theta, bias });
    let (q_rope, k_rope) = (graph.operands(q_rot.node), graph.operands(k_rot.node));
    if !same_rope
        || v_indices != indices
        || q_rope[1] != k_rope[1]
        || !only_read_by(users, q_rot, attention)
        || !only_read_by(users, transposed, v_rows.node)
    {
        return None;
    }
    // q [B,T,Hq,D], k and v [B,T,Hkv,D], all f32 (the fused op's type rule).
    let typed = |v: ValueId| {
        graph
            .value_type(v)
            .ok()
            .map(|t| (t.dtype, t.dims().to_vec()))
    };
    let ((q_dtype, q_dims), k_type, v_type) = (typed(q_rope[0])?, typed(k_rope[0])?, typed(v)?);
    let (&[b, t, _, d], &[kb, kt, _, kd]) = (&q_dims[..], &k_type.1[..]) else {
        return None;
    };
    if (kb, kt, kd) != (b, t, d)
        || v_type != k_type
        || (q_dtype, k_type.0) != (DType::F32, DType::F32)
    {
        return None;
    }
    let mut operands = vec![q_rope[0], k_rope[0], v, k_cache, v_cache, q_rope[1]];
    operands.extend(indices);
    operands.extend(q_rope.get(2).copied());
    operands.extend(k_rope.get(2).copied());
    let replaced = vec![
        q_rot.node,
        k_rot.node,
        transposed.node,
        v_rows.node,
        k_write,
        v_write,
    ];
    let written = |node| ValueId { node, port: 0 };
    // After every operand (the last node it replaces), before the attention and every other
    // reader of the writes.
    let at = replaced.iter().copied().max()?;
    let read_later = |write: NodeIndex| {
        (users.get(&written(write))).is_none_or(|readers| {
            (readers.iter()).all(|reader| reader.is_none_or(|node| node > at))
        })
    };
    (at < attention && read_later(k_write) && read_later(v_write)).then(|| Fusion {
        at,
        replaced,
        op: Op::RopeKvWrite {
            theta,
            bias,
            staged: Some(rounding),
        },
        operands,
        ends: vec![q_rot, written(k_write), written(v_write), k_rot, v_rows],
    })
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
        op: Op::RopeKvWrite {
            theta,
            bias,
            staged: None,
        },
        operands,
        ends: vec![q_rot, k_written, v_written],
    })
}
