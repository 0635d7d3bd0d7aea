//! Causal grouped-query attention: the probabilities-keeping kernels (f32 programs) and the
//! FlashAttention contract (mixed precision, and bf16 inference's prefill rounding to f16;
//! kiln_kernels::attention::flash).

use kiln_ir::DType;
use kiln_kernels::attention as k;
use kiln_kernels::attention::flash;

use crate::autograd::Var;
use crate::error::{Error, Result};
use crate::launch::{empty, launch};

/// `[B, Hq, T, D, S]` from `q [B,Hq,T,D]` and `k [B,Hkv,S,D]`.
fn dims(op: &'static str, q: &Var, k: &Var) -> Result<[usize; 5]> {
    match (q.dims(), k.dims().get(2)) {
        (&[batch, q_heads, seq, head_dim], Some(&keys)) => {
            Ok([batch, q_heads, seq, head_dim, keys])
        }
        _ => Err(Error::Operand {
            op,
            reason: format!(
                "q must be [B,Hq,T,D] and k [B,Hkv,S,D], got {} and {}",
                q.shape(),
                k.shape()
            ),
        }),
    }
}

/// `softmax(q·kᵀ·scale + causal mask)·v` with `q [B,Hq,T,D]`, `k`, `v [B,Hkv,S,D]` → `[B,T,Hq,D]`.
pub fn attention(q: &Var, k: &Var, v: &Var, scale: f64) -> Result<Var> {
    let [batch, q_heads, seq, head_dim, keys] = dims("attention", q, k)?;
    let out = empty([batch, seq, q_heads, head_dim], q.dtype());
    let probs = empty([batch, q_heads, seq, keys], q.dtype());
    launch(
        &[q.value(), k.value(), v.value()],
        &[&probs, &out],
        |i, o| {
            let (p, out) = o.split_at_mut(1);
            k::attention(&i[0], &i[1], &i[2], scale, &mut p[0], &mut out[0])
        },
    )?;
    let (q_value, k_value, v_value) = (q.value().clone(), k.value().clone(), v.value().clone());
    Ok(Var::record_one("attention", &[q, k, v], out, move |g| {
        let grad_q = empty(q_value.shape().clone(), q_value.dtype());
        let grad_k = empty(k_value.shape().clone(), k_value.dtype());
        let grad_v = empty(v_value.shape().clone(), v_value.dtype());
        let workspace = empty([keys], q_value.dtype());
        launch(
            &[&q_value, &k_value, &v_value, &probs, g],
            &[&grad_q, &grad_k, &grad_v, &workspace],
            |i, o| {
                let [gq, gk, gv, ws] = o else {
                    unreachable!("four outputs were passed")
                };
                k::attention_backward(&i[0], &i[1], &i[2], &i[3], &i[4], scale, gq, gk, gv, ws)
            },
        )?;
        Ok(vec![Some(grad_q), Some(grad_k), Some(grad_v)])
    }))
}

/// [`attention`]'s result under the FlashAttention contract: `q`, `k`, `v` (f32) and the
/// probabilities enter their products as their roundings to `rounding` (bf16, or f16), and
/// the backward (bf16's alone) rebuilds the probabilities from the saved log-sum-exp.
pub fn flash_attention(q: &Var, k: &Var, v: &Var, (scale, rounding): (f64, DType)) -> Result<Var> {
    let [batch, q_heads, seq, head_dim, _] = dims("flash_attention", q, k)?;
    let out = empty([batch, seq, q_heads, head_dim], DType::F32);
    let lse = empty([batch, q_heads, seq], DType::F32);
    launch(&[q.value(), k.value(), v.value()], &[&out, &lse], |i, o| {
        let (out, lse) = o.split_at_mut(1);
        let attributes = (scale, rounding);
        flash::flash_attention(&i[0], &i[1], &i[2], attributes, &mut out[0], &mut lse[0])
    })?;
    let saved = [q, k, v].map(|x| x.value().clone());
    let kept = out.clone();
    Ok(Var::record_one(
        "flash_attention",
        &[q, k, v],
        out,
        move |g| {
            if rounding != DType::BF16 {
                return Err(Error::Operand {
                    op: "flash_attention",
                    reason: format!("rounds to {rounding}: only the bf16 contract has a backward"),
                });
            }
            let [q_value, k_value, v_value] = &saved;
            let grads = [q_value, k_value, v_value].map(|x| empty(x.shape().clone(), DType::F32));
            launch(
                &[q_value, k_value, v_value, &kept, &lse, g],
                &[&grads[0], &grads[1], &grads[2]],
                |i, o| {
                    let [gq, gk, gv] = o else {
                        unreachable!("three outputs were passed")
                    };
                    flash::flash_attention_backward(
                        &i[0],
                        &i[1],
                        &i[2],
                        &i[3],
                        &i[4],
                        &i[5],
                        scale,
                        [gq, gk, gv],
                    )
                },
            )?;
            let [gq, gk, gv] = grads;
            Ok(vec![Some(gq), Some(gk), Some(gv)])
        },
    ))
}
