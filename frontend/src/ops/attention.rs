//! Causal grouped-query attention.

use kiln_kernels::attention as k;

use crate::autograd::Var;
use crate::error::{Error, Result};
use crate::launch::{empty, launch};

/// `softmax(q·kᵀ·scale + causal mask)·v` with `q [B,Hq,T,D]`, `k`, `v [B,Hkv,S,D]` → `[B,T,Hq,D]`.
pub fn attention(q: &Var, k: &Var, v: &Var, scale: f64) -> Result<Var> {
    let (&[batch, q_heads, seq, head_dim], Some(&keys)) = (q.dims(), k.dims().get(2)) else {
        return Err(Error::Operand {
            op: "attention",
            reason: format!(
                "q must be [B,Hq,T,D] and k [B,Hkv,S,D], got {} and {}",
                q.shape(),
                k.shape()
            ),
        });
    };
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
