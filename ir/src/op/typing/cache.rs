//! The type rules of attention and of the KV cache ops.
//!
//! A cache is `[S,H,Smax,D]`: `S` rows (one per sequence), `Smax` positions each. Without a
//! `rows` operand, batch row `b` owns cache row `b` (`S = B`); with `rows [B] int`, batch row
//! `b` owns cache row `rows[b]` of a pool of any `S` — how one persistent KV pool of fixed
//! slots serves decode programs of every batch size.

use super::Rule;
use crate::op::rope_kv::{RopeKvParts, K, K_CACHE, Q, V, V_CACHE};
use crate::{stores, DType, Op, Result, TensorType};

/// `(q [B,Hq,T,D], k [B,Hkv,S,D], v) -> (out [B,T,Hq,D], probs [B,Hq,T,S])`, `S >= T`; with
/// `flash` (FlashAttention's rounding, bf16 or f16), `(out, lse [B,Hq,T])` f32, each of q, k, v
/// f32 or of the rounding's dtype (read rounded to it: already that).
pub(super) fn attention_types(rule: &Rule<'_>, flash: Option<DType>) -> Result<Vec<TensorType>> {
    rule.arity(3)?;
    if let Some(rounding) = flash.filter(|r| !matches!(r, DType::BF16 | DType::F16)) {
        return Err(rule.attribute(format!("rounds to bf16 or f16, not {rounding}")));
    }
    // FlashAttention computes in f32 whatever its operands' storage (f32 or their rounding).
    let storages = match flash {
        Some(DType::BF16) => "f32 or bf16",
        Some(DType::F16) => "f32 or f16",
        _ => "f32",
    };
    let rounded = |port: usize| {
        let dtype = rule.operands[port].dtype;
        dtype == DType::F32 || Some(dtype) == flash
    };
    let flash = flash.is_some();
    let q = match flash {
        true if rounded(0) => &rule.operands[0],
        true => return Err(rule.type_error(0, format!("{storages} [B,Hq,T,D]"))),
        false => rule.float(0)?,
    };
    let dtype = if flash { DType::F32 } else { q.dtype };
    let &[b, hq, t, d] = rule.rank(0, 4, "[B,Hq,T,D]")? else {
        unreachable!("rank checked")
    };
    let k = &rule.operands[1];
    let &[kb, hkv, s, kd] = rule.rank(1, 4, "[B,Hkv,S,D]")? else {
        unreachable!("rank checked")
    };
    let k_dtype_ok = if flash {
        rounded(1)
    } else {
        k.dtype == q.dtype
    };
    if !k_dtype_ok || kb != b || kd != d || hkv == 0 || hq % hkv != 0 || s < t {
        let dtypes = if flash { storages } else { q.dtype.name() };
        let expected = format!("{dtypes} [{b},Hkv,S,{d}] with Hkv dividing {hq} and S >= T");
        return Err(rule.type_error(1, expected));
    }
    match flash {
        true if rule.operands[2].dims() != k.dims() || !rounded(2) => {
            return Err(rule.type_error(2, format!("{storages} {}", k.shape)));
        }
        true => {}
        false => rule.same(2, k)?,
    }
    let kept = if flash {
        vec![b, hq, t]
    } else {
        vec![b, hq, t, s]
    };
    Ok(vec![
        TensorType::new(dtype, [b, t, hq, d])?,
        TensorType::new(dtype, kept)?,
    ])
}

/// `(q [B,Hq,T,D], k_cache [S,Hkv,Smax,D], v_cache, positions [B] int[, rows [B] int]) ->
/// [B,T,Hq,D]`; the caches are stored data of q's compute dtype.
pub(super) fn cached_attention_types(rule: &Rule<'_>) -> Result<Vec<TensorType>> {
    let pooled = rule.operands.len() == 5;
    rule.arity(if pooled { 5 } else { 4 })?;
    let q = rule.float(0)?;
    let &[b, hq, t, d] = rule.rank(0, 4, "[B,Hq,T,D]")? else {
        unreachable!("rank checked")
    };
    let k = &rule.operands[1];
    let &[slots, hkv, _, kd] = rule.rank(1, 4, "[S,Hkv,Smax,D]")? else {
        unreachable!("rank checked")
    };
    let slots_ok = if pooled { slots > 0 } else { slots == b };
    if !stores(q.dtype, k.dtype) || !slots_ok || kd != d || hkv == 0 || hq % hkv != 0 {
        let rows = if pooled {
            "S".to_string()
        } else {
            b.to_string()
        };
        let expected = format!("{} [{rows},Hkv,Smax,{d}] with Hkv dividing {hq}", q.dtype);
        return Err(rule.type_error(1, expected));
    }
    rule.same(2, k)?;
    one_index_per_row(rule, 3, b)?;
    if pooled {
        one_index_per_row(rule, 4, b)?;
    }
    Ok(vec![TensorType::new(q.dtype, [b, t, hq, d])?])
}

/// `(cache [S,H,Smax,D], new [B,H,T,D], positions [B] int[, rows [B] int]) -> cache`, with
/// `T <= Smax`; `new` computes in the cache's stored dtype's compute dtype.
pub(super) fn kv_cache_write_types(rule: &Rule<'_>) -> Result<Vec<TensorType>> {
    let pooled = rule.operands.len() == 4;
    rule.arity(if pooled { 4 } else { 3 })?;
    let cache = &rule.operands[0];
    let &[slots, h, capacity, d] = rule.rank(0, 4, "[S,H,Smax,D]")? else {
        unreachable!("rank checked")
    };
    let new = rule.float(1)?;
    let b = match new.dims() {
        &[b, nh, t, nd] if nh == h && nd == d && t <= capacity => b,
        _ => {
            let expected = format!("{} [B,{h},T,{d}] with T <= {capacity}", cache.dtype);
            return Err(rule.type_error(1, expected));
        }
    };
    if !stores(new.dtype, cache.dtype) || (!pooled && b != slots) || (pooled && slots == 0) {
        let rows = if pooled {
            "B".to_string()
        } else {
            slots.to_string()
        };
        let expected = format!("{} [{rows},{h},T,{d}] with T <= {capacity}", cache.dtype);
        return Err(rule.type_error(1, expected));
    }
    one_index_per_row(rule, 2, b)?;
    if pooled {
        one_index_per_row(rule, 3, b)?;
    }
    Ok(vec![cache.clone()])
}

/// `RopeKvWrite`: the types of its unfused ops (each rule's errors renamed to this op and
/// its operand ports), with q, k and v of one `[B,T,·,D]`; `staged`, f16, the dtype of its
/// staged results (f32 operands then).
pub(super) fn rope_kv_write_types(
    rule: &Rule<'_>,
    (theta, bias): (f64, bool),
    staged: Option<DType>,
) -> Result<Vec<TensorType>> {
    if let Some(dtype) = staged.filter(|&d| d != DType::F16) {
        return Err(rule.attribute(format!(
            "stages the f16 rows of bf16 inference's prefill attention, not {dtype}"
        )));
    }
    let count = rule.operands.len();
    rule.arity_either([false, true].map(|pooled| RopeKvParts::arity(bias, pooled)))?;
    let Some(parts) = RopeKvParts::of(theta, bias, count) else {
        return Err(rule.attribute(format!("{count} operands are neither form's")));
    };
    // The staged form's v is token-major; its parts see it head-major (as unfused).
    let (k, v) = (rule.operands[K].dims(), rule.operands[V].dims());
    let operand = |port: usize| -> Result<TensorType> {
        match (port, staged) {
            (V, Some(_)) if v.len() == 4 => {
                TensorType::new(rule.operands[V].dtype, [v[0], v[2], v[1], v[3]])
            }
            _ => Ok(rule.operands[port].clone()),
        }
    };
    // Part `op` on the operands at `ports` (`None`: the rotated keys, standing for k).
    let part = |op: &Op, ports: &[Option<usize>], rotated: Option<&TensorType>| {
        let types: Vec<TensorType> = ports
            .iter()
            .map(|port| match port {
                Some(port) => operand(*port),
                None => Ok(rotated.cloned().expect("the k write follows the k rope")),
            })
            .collect::<Result<_>>()?;
        op.infer(&types).map_err(|error| {
            rule.renamed(error, |port| {
                ports.get(port).copied().flatten().unwrap_or(K)
            })
        })
    };
    let some = |ports: &[usize]| ports.iter().copied().map(Some).collect::<Vec<_>>();
    let q_rot = part(&parts.rope, &some(&parts.q_rope), None)?.remove(0);
    let k_rot = part(&parts.rope, &some(&parts.k_rope), None)?.remove(0);
    let indices = some(&parts.indices);
    let write = |cache: usize, new: Option<usize>, rotated: Option<&TensorType>| {
        let ports: Vec<Option<usize>> = [Some(cache), new]
            .into_iter()
            .chain(indices.clone())
            .collect();
        part(&Op::KvCacheWrite, &ports, rotated).map(|mut t| t.remove(0))
    };
    let k_cache = write(K_CACHE, None, Some(&k_rot))?;
    let v_cache = write(V_CACHE, Some(V), None)?;
    // One batch, sequence and head size for q, k and v.
    let q = rule.operands[Q].dims();
    if q[0] != k[0] || q[1] != k[1] || q[3] != k[3] {
        let expected = format!(
            "{} [{},{},Hkv,{}]",
            rule.operands[Q].dtype, q[0], q[1], q[3]
        );
        return Err(rule.type_error(K, expected));
    }
    let v_dims = match staged {
        Some(_) => [k[0], k[1], k[2], k[3]],
        None => [k[0], k[2], k[1], k[3]],
    };
    if v != v_dims || rule.operands[V].dtype != rule.operands[K].dtype {
        let [b, x, y, d] = v_dims;
        let expected = format!("{} [{b},{x},{y},{d}]", rule.operands[K].dtype);
        return Err(rule.type_error(V, expected));
    }
    let Some(dtype) = staged else {
        return Ok(vec![q_rot, k_cache, v_cache]);
    };
    for (port, dims) in [(Q, "[B,T,Hq,D]"), (K, "[B,T,Hkv,D]")] {
        if rule.operands[port].dtype != DType::F32 {
            return Err(rule.type_error(port, format!("f32 {dims} (the staged form's)")));
        }
    }
    let rows = |t: &TensorType| TensorType::new(dtype, t.dims());
    let (q_rows, k_rows) = (rows(&q_rot)?, rows(&k_rot)?);
    let v_rows = TensorType::new(dtype, k_rot.dims())?;
    Ok(vec![q_rows, k_cache, v_cache, k_rows, v_rows])
}

/// Operand `port` is an integer `[batch]`.
fn one_index_per_row(rule: &Rule<'_>, port: usize, batch: usize) -> Result<()> {
    rule.int(port)?;
    if rule.operands[port].dims() != [batch] {
        return Err(rule.type_error(port, format!("int [{batch}]")));
    }
    Ok(())
}
