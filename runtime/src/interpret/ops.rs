//! One IR op on the CPU reference kernels: the kernel, its argument order and its workspaces
//! are exactly the eager oracle's (kiln-frontend's `ops`), so both compute the same bits.
//!
//! Every result is a fresh zeroed tensor of the type the op's type rule gave, written by the
//! kernel; views are zero-copy [`Tensor`] views. The caller has checked the operands against
//! the type rule, so each op has the operand count and result count its rule fixes (indexing
//! `i[..]` and `o[..]` below relies on it).

use kiln_ir::{AdamWConfig, Op, Shape, TensorType};
use kiln_kernels::matmul::Transpose;
use kiln_kernels::optim::AdamW;
use kiln_kernels::{activation, copy, elementwise, embedding, loss, norm, rope};
use kiln_kernels::{TensorView, TensorViewMut};

use crate::device::Device;
use crate::error::Result;
use crate::launch::launch;
use crate::tensor::Tensor;

/// Fresh results of `types`, written by `kernel` from `inputs`.
fn fresh(
    types: &[TensorType],
    inputs: &[&Tensor],
    kernel: impl FnOnce(&[TensorView<'_>], &mut [TensorViewMut<'_>]) -> kiln_kernels::Result<()>,
) -> Result<Vec<Tensor>> {
    let results: Vec<Tensor> = types.iter().map(zeros).collect();
    launch(inputs, &results.iter().collect::<Vec<_>>(), kernel)?;
    Ok(results)
}

fn zeros(ty: &TensorType) -> Tensor {
    Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu)
}

/// Runs `op` on `operands`; `types` are its result types.
pub(super) fn run(op: &Op, operands: &[Tensor], types: &[TensorType]) -> Result<Vec<Tensor>> {
    let all: Vec<&Tensor> = operands.iter().collect();
    let x = all.as_slice();
    match op.clone() {
        Op::Embedding => fresh(types, x, |i, o| {
            embedding::embedding(&i[0], &i[1], &mut o[0])
        }),
        Op::EmbeddingBackward { .. } => fresh(types, x, |i, o| {
            embedding::embedding_backward(&i[0], &i[1], &mut o[0])
        }),
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => matmul(operands, types, transpose_a, transpose_b),
        Op::Add => fresh(types, x, |i, o| elementwise::add(&i[0], &i[1], &mut o[0])),
        Op::Mul => fresh(types, x, |i, o| elementwise::mul(&i[0], &i[1], &mut o[0])),
        Op::Scale { alpha } => fresh(types, x, move |i, o| {
            elementwise::scale(&i[0], alpha, &mut o[0])
        }),
        Op::SumToShape { .. } => {
            fresh(types, x, |i, o| elementwise::sum_to_shape(&i[0], &mut o[0]))
        }
        Op::BroadcastTo { .. } => {
            fresh(types, x, |i, o| elementwise::broadcast_to(&i[0], &mut o[0]))
        }
        Op::Cast { .. } => fresh(types, x, |i, o| copy::cast(&i[0], &mut o[0])),
        Op::RmsNorm { eps } => fresh(types, x, move |i, o| {
            norm::rmsnorm(&i[0], &i[1], eps, &mut o[0])
        }),
        Op::RmsNormBackward { eps } => fresh(types, x, move |i, o| {
            let (gx, gw) = o.split_at_mut(1);
            norm::rmsnorm_backward(&i[0], &i[1], &i[2], eps, &mut gx[0], &mut gw[0])
        }),
        Op::AddRmsNorm { eps } => fresh(types, x, move |i, o| {
            let (sum, out) = o.split_at_mut(1);
            norm::add_rmsnorm(&i[0], &i[1], &i[2], eps, &mut sum[0], &mut out[0])
        }),
        // grad_sum, the fourth operand, is absent when the sum received no gradient.
        Op::AddRmsNormBackward { eps } => fresh(types, x, move |i, o| {
            let (gi, gw) = o.split_at_mut(1);
            let grad_sum = i.get(3);
            norm::add_rmsnorm_backward(&i[0], &i[1], &i[2], grad_sum, eps, &mut gi[0], &mut gw[0])
        }),
        Op::Rope { theta, .. } => fresh(types, x, move |i, o| {
            rope::rope(&i[0], &i[1], i.get(2), theta, &mut o[0])
        }),
        Op::RopeBackward { theta } => fresh(types, x, move |i, o| {
            rope::rope_backward(&i[0], &i[1], theta, &mut o[0])
        }),
        Op::Attention { scale } => fresh(types, x, move |i, o| {
            // Results are (out, probs); the kernel takes probs first.
            let (out, probs) = o.split_at_mut(1);
            kiln_kernels::attention::attention(
                &i[0],
                &i[1],
                &i[2],
                scale,
                &mut probs[0],
                &mut out[0],
            )
        }),
        Op::AttentionBackward { scale } => attention_backward(operands, types, scale),
        Op::CachedAttention { scale } => cached_attention(operands, types, scale),
        Op::KvCacheWrite => fresh(types, x, |i, o| {
            // The result starts as a copy of the cache; only the new rows change.
            copy::copy(&i[0], &mut o[0])?;
            kiln_kernels::cache::kv_cache_write(&mut o[0], &i[1], &i[2])
        }),
        Op::SwiGlu => fresh(types, x, |i, o| activation::swiglu(&i[0], &i[1], &mut o[0])),
        Op::SwiGluBackward => fresh(types, x, |i, o| {
            let (gg, gu) = o.split_at_mut(1);
            activation::swiglu_backward(&i[0], &i[1], &i[2], &mut gg[0], &mut gu[0])
        }),
        Op::Softmax => fresh(types, x, |i, o| activation::softmax(&i[0], &mut o[0])),
        Op::SoftmaxBackward => fresh(types, x, |i, o| {
            activation::softmax_backward(&i[0], &i[1], &mut o[0])
        }),
        Op::CrossEntropy { ignore_index } => fresh(types, x, move |i, o| {
            loss::cross_entropy(&i[0], &i[1], ignore_index, &mut o[0])
        }),
        Op::CrossEntropyBackward { ignore_index } => fresh(types, x, move |i, o| {
            loss::cross_entropy_backward(&i[0], &i[1], ignore_index, &i[2], &mut o[0])
        }),
        Op::AdamW(config) => adamw(operands, types, config),
        Op::Reshape { shape } => Ok(vec![operands[0].reshape(shape)?]),
        Op::Transpose { dim0, dim1 } => Ok(vec![operands[0].transpose(dim0, dim1)?]),
        Op::Slice { axis, start, end } => Ok(vec![operands[0].slice(axis, start, end, 1)?]),
        Op::Contiguous => Ok(vec![operands[0].contiguous()?]),
    }
}

/// The fast matmul with the workspace its bf16 path widens into (f32 and f64 need none).
fn matmul(
    operands: &[Tensor],
    types: &[TensorType],
    transpose_a: bool,
    transpose_b: bool,
) -> Result<Vec<Tensor>> {
    let (a, b) = (&operands[0], &operands[1]);
    let transpose = Transpose {
        a: transpose_a,
        b: transpose_b,
    };
    let len =
        kiln_kernels::matmul::matmul_workspace_len(a.dtype(), a.shape(), b.shape(), transpose);
    let mut workspace = vec![0f32; len];
    fresh(types, &[a, b], |i, o| {
        kiln_kernels::matmul::matmul(&i[0], &i[1], &mut o[0], transpose, &mut workspace)
    })
}

/// The attention backward with its one-row `[S]` workspace of `q`'s dtype.
fn attention_backward(
    operands: &[Tensor],
    types: &[TensorType],
    scale: f64,
) -> Result<Vec<Tensor>> {
    let keys = operands[1].dims().get(2).copied().unwrap_or(0);
    let workspace = Tensor::zeros(Shape::new(&[keys]), operands[0].dtype(), Device::Cpu);
    let results: Vec<Tensor> = types.iter().map(zeros).collect();
    let inputs: Vec<&Tensor> = operands.iter().collect();
    launch(
        &inputs,
        &[&results[0], &results[1], &results[2], &workspace],
        |i, o| {
            let (grads, rest) = o.split_at_mut(3);
            let (gq, rest_grads) = grads.split_at_mut(1);
            let (gk, gv) = rest_grads.split_at_mut(1);
            kiln_kernels::attention::attention_backward(
                &i[0],
                &i[1],
                &i[2],
                &i[3],
                &i[4],
                scale,
                &mut gq[0],
                &mut gk[0],
                &mut gv[0],
                &mut rest[0],
            )
        },
    )?;
    Ok(results)
}

/// Cached attention with a `[B,Hq,T,Smax]` probabilities workspace allocated for this call.
fn cached_attention(operands: &[Tensor], types: &[TensorType], scale: f64) -> Result<Vec<Tensor>> {
    let (q, cache) = (operands[0].dims(), operands[1].dims());
    let probs_dims: Vec<usize> = q[..3].iter().chain(&cache[2..3]).copied().collect();
    let probs = Tensor::zeros(Shape::new(&probs_dims), operands[0].dtype(), Device::Cpu);
    let out = zeros(&types[0]);
    let inputs: Vec<&Tensor> = operands.iter().collect();
    launch(&inputs, &[&out, &probs], |i, o| {
        let (out, probs) = o.split_at_mut(1);
        kiln_kernels::cache::cached_attention(
            &i[0],
            &i[1],
            &i[2],
            &i[3],
            scale,
            &mut probs[0],
            &mut out[0],
        )
    })?;
    Ok(vec![out])
}

/// AdamW on fresh copies of param, m and v (the operands stay as they were), at the step held
/// by the i64 scalar operand.
fn adamw(operands: &[Tensor], types: &[TensorType], config: AdamWConfig) -> Result<Vec<Tensor>> {
    let step = operands[4].to_vec::<i64>()?.first().copied().unwrap_or(0);
    let step = u64::try_from(step).map_err(|_| kiln_kernels::Error::Argument {
        op: "adamw",
        argument: "step",
        reason: format!("steps are counted from 1, got {step}"),
    })?;
    let config = AdamW {
        lr: config.lr,
        beta1: config.beta1,
        beta2: config.beta2,
        eps: config.eps,
        weight_decay: config.weight_decay,
    };
    let [param, grad, m, v] = [0, 1, 2, 3].map(|port| &operands[port]);
    fresh(types, &[param, grad, m, v], move |i, o| {
        let (new_param, moments) = o.split_at_mut(1);
        let (new_m, new_v) = moments.split_at_mut(1);
        copy::copy(&i[0], &mut new_param[0])?;
        copy::copy(&i[2], &mut new_m[0])?;
        copy::copy(&i[3], &mut new_v[0])?;
        kiln_kernels::optim::adamw(
            &mut new_param[0],
            &i[1],
            &mut new_m[0],
            &mut new_v[0],
            step,
            &config,
        )
    })
}
