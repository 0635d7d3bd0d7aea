//! Attention (forward with probs, over a KV cache, backward; FlashAttention forward and
//! backward), the KV cache write and the fused RoPE + KV cache write.

use kiln_ir::rope_kv::{self, RopeKvParts};
use kiln_ir::{DType, Op};
use kiln_kernels::gpu::attention::{self, AttentionBackward, AttentionDims, AttentionForward};
use kiln_kernels::gpu::flash::{self, FlashBackward, FlashForward};
use kiln_kernels::gpu::Launch;
use kiln_kernels::gpu::{cache, decode};

use super::{byte_len, copy_unless_same, size, DeviceTensor, Lowering, F32, I64};
use crate::error::Result;

/// `[a, b, c, d]` of a rank-4 tensor.
pub(super) fn dims4(at: &Lowering<'_>, dims: &[usize], name: &str) -> Result<[u64; 4]> {
    match *dims {
        [a, b, c, d] => Ok([size(a), size(b), size(c), size(d)]),
        _ => Err(at.unsupported(format!("`{name}` {dims:?} is not rank 4"))),
    }
}

/// Where the cache op's batch rows find their cache rows: operand `port` (`rows [B]` i64,
/// slots of a pool of `cache[0]` rows) when the op has it, else their own.
pub(super) fn pooled_rows(
    at: &Lowering<'_>,
    port: usize,
    cache: &[usize],
) -> Result<cache::CacheRows> {
    if at.i.len() <= port {
        return Ok(cache::CacheRows::Own);
    }
    let rows = at.operand(port, "rows", I64)?;
    let slots = cache.first().copied().map_or(0, size);
    Ok(cache::CacheRows::Pool {
        rows: rows.addr(),
        slots,
    })
}

/// The sizes from `q [B,Hq,T,D]` and keys `[B,Hkv,S,D]`, with `Hkv` dividing `Hq`.
fn attention_dims(at: &Lowering<'_>, q: &[usize], keys: &[usize]) -> Result<AttentionDims> {
    let [batch, q_heads, q_len, head_dim] = dims4(at, q, "q")?;
    let [_, kv_heads, kv_len, _] = dims4(at, keys, "k")?;
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(at.unsupported(format!(
            "{kv_heads} kv heads do not divide {q_heads} query heads"
        )));
    }
    Ok(AttentionDims {
        batch,
        q_heads,
        kv_heads,
        q_len,
        kv_len,
        head_dim,
    })
}

pub(super) fn lower_attention(at: &Lowering<'_>) -> Result<Vec<Launch>> {
    match at.op {
        Op::Attention { scale } => {
            let q = at.operand(0, "q", F32)?;
            let k = at.operand(1, "k", F32)?;
            let v = at.operand(2, "v", F32)?;
            let out = at.result(0, "out", F32)?;
            let probs = at.result(1, "probs", F32)?;
            let dims = attention_dims(at, q.dims(), k.dims())?;
            let addresses = AttentionForward {
                q: q.addr(),
                k: k.addr(),
                v: v.addr(),
                out: out.addr(),
                probs: probs.addr(),
            };
            let scale = Lowering::f32_attribute(*scale);
            Ok(attention::attention_f32(addresses, dims, scale)?)
        }
        Op::CachedAttention { scale } => {
            let q = at.operand(0, "q", F32)?;
            let (k_cache, stored) = at.stored(1, "k_cache")?;
            let v_cache = at.operand(2, "v_cache", k_cache.dtype)?;
            let positions = at.operand(3, "positions", I64)?;
            let cache_rows = pooled_rows(at, 4, k_cache.dims())?;
            let out = at.result(0, "out", F32)?;
            let dims = attention_dims(at, q.dims(), k_cache.dims())?;
            if dims.q_len == 0 {
                return Ok(vec![]);
            }
            // The partial result of every chunk of cache rows lives in the workspace.
            let partials = at.workspace(decode::partials_bytes(&dims), out.addr())?;
            let scale = Lowering::f32_attribute(*scale);
            let inputs = [q.addr(), k_cache.addr(), v_cache.addr(), positions.addr()];
            Ok(decode::cached_attention_f32(
                out.addr(),
                partials,
                inputs,
                cache_rows,
                (dims, scale, stored),
                at.fault,
            )?)
        }
        Op::AttentionBackward { scale } => {
            let q = at.operand(0, "q", F32)?;
            let k = at.operand(1, "k", F32)?;
            let v = at.operand(2, "v", F32)?;
            let probs = at.operand(3, "probs", F32)?;
            let grad_out = at.operand(4, "grad_out", F32)?;
            let grad_q = at.result(0, "grad_q", F32)?;
            let grad_k = at.result(1, "grad_k", F32)?;
            let grad_v = at.result(2, "grad_v", F32)?;
            let dims = attention_dims(at, q.dims(), k.dims())?;
            // dS, the masked probs and grad_out transposed (see the builder).
            let workspace = at.workspace(dims.backward_workspace_bytes(), grad_q.addr())?;
            let addresses = AttentionBackward {
                q: q.addr(),
                k: k.addr(),
                v: v.addr(),
                probs: probs.addr(),
                grad_out: grad_out.addr(),
                grad_q: grad_q.addr(),
                grad_k: grad_k.addr(),
                grad_v: grad_v.addr(),
                workspace,
            };
            let scale = Lowering::f32_attribute(*scale);
            Ok(attention::attention_backward_f32(addresses, dims, scale)?)
        }
        Op::FlashAttention { scale, rounding } => {
            // Each f32, or already its rounding (the builder refuses other pairs).
            let dtypes = [F32, *rounding];
            let q = at.operand_of(0, "q", &dtypes)?;
            let k = at.operand_of(1, "k", &dtypes)?;
            let v = at.operand_of(2, "v", &dtypes)?;
            let stored = [q.dtype, k.dtype, v.dtype];
            let dims = attention_dims(at, q.dims(), k.dims())?;
            let lse = at.result(1, "lse", F32)?.addr();
            // q, k, v staged as bf16 (or f16) rows where they are not (see the builder).
            let bytes = flash::forward_workspace_bytes(&dims, stored);
            let workspace = at.workspace(bytes, lse)?;
            let addresses = FlashForward {
                q: q.addr(),
                k: k.addr(),
                v: v.addr(),
                out: at.result_forms(0, "out")?,
                lse,
                workspace,
                stored,
                rounding: *rounding,
            };
            let scale = Lowering::f32_attribute(*scale);
            Ok(flash::flash_attention_f32(addresses, dims, scale)?)
        }
        Op::FlashAttentionBackward { scale } => {
            // Each f32, or already its bf16 rounding.
            let dtypes = [F32, DType::BF16];
            let q = at.operand_of(0, "q", &dtypes)?;
            let k = at.operand_of(1, "k", &dtypes)?;
            let v = at.operand_of(2, "v", &dtypes)?;
            let grad_out = at.operand_of(5, "grad_out", &dtypes)?;
            let dims = attention_dims(at, q.dims(), k.dims())?;
            let grad_q = at.result(0, "grad_q", F32)?;
            // The staged operands, Δ and the per-head dK, dV (see the builder).
            let bytes = flash::backward_workspace_bytes(&dims, [q.dtype, k.dtype, v.dtype]);
            let workspace = at.workspace(bytes, grad_q.addr())?;
            let addresses = FlashBackward {
                q: q.addr(),
                k: k.addr(),
                v: v.addr(),
                out: at.operand(3, "out", F32)?.addr(),
                lse: at.operand(4, "lse", F32)?.addr(),
                grad_out: grad_out.addr(),
                grad_q: grad_q.addr(),
                grad_k: at.result(1, "grad_k", F32)?.addr(),
                grad_v: at.result(2, "grad_v", F32)?.addr(),
                workspace,
                stored: [q.dtype, k.dtype, v.dtype, grad_out.dtype],
            };
            let scale = Lowering::f32_attribute(*scale);
            Ok(flash::flash_attention_backward_f32(addresses, dims, scale)?)
        }
        Op::KvCacheWrite => {
            let (cache, stored) = at.stored(0, "cache")?;
            let fresh = at.operand(1, "new", F32)?;
            let positions = at.operand(2, "positions", I64)?;
            let cache_rows = pooled_rows(at, 3, cache.dims())?;
            let out = at.result(0, "cache", cache.dtype)?;
            let [_, heads, capacity, head_dim] = dims4(at, cache.dims(), "cache")?;
            let [batch, _, block, _] = dims4(at, fresh.dims(), "new")?;
            // In place (the result is the cache) only the new rows are written.
            let mut launches = copy_unless_same(out.addr(), cache.addr(), byte_len(cache));
            if fresh.numel() > 0 {
                launches.push(cache::kv_cache_write_f32(
                    (out.addr(), stored),
                    fresh.addr(),
                    (positions.addr(), cache_rows),
                    [batch, heads, capacity, block, head_dim],
                    at.fault,
                ));
            }
            Ok(launches)
        }
        Op::RopeKvWrite {
            theta,
            bias,
            staged,
        } => lower_rope_kv_write(at, (*theta, *bias), *staged),
        _ => unreachable!("lower_attention lowers only the attention ops"),
    }
}

/// The copies of caches written in place, `(result, cache)`, into results the planner gave
/// slots of their own (none where a result is its cache).
pub(super) fn copied_caches(caches: [(&DeviceTensor, &DeviceTensor); 2]) -> Vec<Launch> {
    (caches.into_iter())
        .flat_map(|(out, cache)| copy_unless_same(out.addr(), cache.addr(), byte_len(cache)))
        .collect()
}

/// The fused RoPE + KV-cache write: one launch, the caches written in place (copied first
/// when the planner gave a result its own slot, as `KvCacheWrite`); the staged form's rows
/// f16.
fn lower_rope_kv_write(
    at: &Lowering<'_>,
    (theta, bias): (f64, bool),
    staged: Option<DType>,
) -> Result<Vec<Launch>> {
    let parts = RopeKvParts::of(theta, bias, at.i.len())
        .ok_or_else(|| at.unsupported(format!("{} operands", at.i.len())))?;
    let q = at.operand(rope_kv::Q, "q", F32)?;
    let k = at.operand(rope_kv::K, "k", F32)?;
    let v = at.operand(rope_kv::V, "v", F32)?;
    let (k_cache, cache_stored) = at.stored(rope_kv::K_CACHE, "k_cache")?;
    let v_cache = at.operand(rope_kv::V_CACHE, "v_cache", k_cache.dtype)?;
    let rope_positions = at.operand(rope_kv::ROPE_POSITIONS, "rope_positions", I64)?;
    let positions = at.operand(rope_kv::POSITIONS, "positions", I64)?;
    let rows = match parts.indices.get(1) {
        Some(&port) => pooled_rows(at, port, k_cache.dims())?,
        None => cache::CacheRows::Own,
    };
    let (biases, bias_stored) = match parts.q_rope.get(2).zip(parts.k_rope.get(2)) {
        Some((&q_port, &k_port)) => {
            let (q_bias, stored) = at.stored(q_port, "q_bias")?;
            let k_bias = at.operand(k_port, "k_bias", q_bias.dtype)?;
            (Some([q_bias.addr(), k_bias.addr()]), stored)
        }
        None => (None, cache_stored),
    };
    let rows_dtype = match staged {
        None => F32,
        Some(DType::F16) => DType::F16,
        Some(other) => return Err(at.unsupported(format!("{other} staged rows (f16 only)"))),
    };
    let q_rot = at.result(0, "q_rot", rows_dtype)?;
    let staged = match staged {
        Some(_) => Some([
            at.result(rope_kv::K_ROT, "k_rot", rows_dtype)?.addr(),
            at.result(rope_kv::V_ROWS, "v_rows", rows_dtype)?.addr(),
        ]),
        None => None,
    };
    let k_out = at.result(1, "k_cache", k_cache.dtype)?;
    let v_out = at.result(2, "v_cache", k_cache.dtype)?;
    let [batch, seq, q_heads, head_dim] = dims4(at, q.dims(), "q")?;
    let [_, _, kv_heads, _] = dims4(at, k.dims(), "k")?;
    let [_, _, capacity, _] = dims4(at, k_cache.dims(), "k_cache")?;
    let mut launches = copied_caches([(k_out, k_cache), (v_out, v_cache)]);
    if q.numel() > 0 {
        let addresses = cache::RopeKvWrite {
            q_rot: q_rot.addr(),
            k_cache: k_out.addr(),
            v_cache: v_out.addr(),
            q: q.addr(),
            k: k.addr(),
            v: v.addr(),
            rope_positions: rope_positions.addr(),
            positions: positions.addr(),
            rows,
            biases,
            staged,
        };
        let dims = cache::RopeKvDims {
            batch,
            seq,
            q_heads,
            kv_heads,
            capacity,
            head_dim,
        };
        let theta = Lowering::f32_attribute(theta);
        let stored = (cache_stored, bias_stored);
        launches.push(cache::rope_kv_write_f32(
            addresses,
            (dims, theta),
            stored,
            at.fault,
        ));
    }
    Ok(launches)
}
