//! The scratch each backend's kernels need, stated to the planner ([`WorkspaceNeeds`]): the
//! IR and the planner know no device, so the numbers come from here, computed by the kernels'
//! own size functions where they have one.
//!
//! - CPU reference: a bf16 MatMul widens its operands to f32 (a rounded op keeps its f32
//!   results there first); an embedding update makes each row's gradient there; the attention backward takes one
//!   row of `S` scores; attention over a cache takes the probabilities `[B,Hq,T,Smax]`.
//! - CUDA: the GEMM attention backward's dS, masked probs and transposed `grad_out`
//!   ([`AttentionDims::backward_workspace_bytes`]); decode attention's per-chunk partials
//!   ([`decode::partials_bytes`]); FlashAttention's operands staged as the bf16 (or f16) rows
//!   its kernels read (those not already such rows) and the backward's scratch
//!   ([`flash::backward_workspace_bytes`]); one rstd per row for the norm backwards and the
//!   row chunks' partial sums of theirs and of `SumToShape`
//!   ([`partials_bytes`](kiln_kernels::gpu::columns::partials_bytes)); one loss per row for
//!   cross-entropy; one vocabulary chunk of logits (and of their gradient) for the chunked
//!   LM-head loss ([`LinearLoss`](kiln_kernels::gpu::loss::LinearLoss)); f64 partial sums of
//!   gradient clipping
//!   ([`clip_workspace_bytes`](kiln_kernels::gpu::optim::clip_workspace_bytes)); the bitmap of
//!   an embedding update's named rows (and its owners' partial sums past one window of tokens).
//! - Any: the larger of the two, so one plan runs on either backend.

use kiln_ir::{DType, Op, TensorType};
use kiln_kernels::gpu::attention::AttentionDims;
use kiln_kernels::gpu::decode;
use kiln_kernels::gpu::flash;
use kiln_planner::WorkspaceNeeds;

/// Whose kernels a plan is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workspaces {
    Cpu,
    Cuda,
    /// Every backend: a plan either can run.
    Any,
}

impl WorkspaceNeeds for Workspaces {
    fn workspace_bytes(&self, op: &Op, operands: &[TensorType]) -> u64 {
        match self {
            Workspaces::Cpu => cpu(op, operands),
            Workspaces::Cuda => cuda(op, operands),
            Workspaces::Any => cpu(op, operands).max(cuda(op, operands)),
        }
    }
}

fn dims(operands: &[TensorType], port: usize) -> &[usize] {
    operands.get(port).map_or(&[][..], |t| t.dims())
}

fn product(dims: &[usize]) -> u64 {
    dims.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
}

/// The CPU reference's scratch (`interpret/ops.rs` takes exactly these): converted stored
/// operands first, then the kernel's own.
fn cpu(op: &Op, operands: &[TensorType]) -> u64 {
    let types: Vec<(DType, &[usize])> = operands.iter().map(|t| (t.dtype, t.dims())).collect();
    let converted = crate::interpret::ops::conversions(op, &types)
        .into_iter()
        .fold(0u64, |sum, (port, dtype)| {
            sum.saturating_add(crate::interpret::ops::conversion_bytes(
                dtype,
                operands[port].dims(),
            ))
        });
    converted.saturating_add(cpu_kernel(op, operands))
}

/// The scratch of `op`'s CPU kernel itself.
fn cpu_kernel(op: &Op, operands: &[TensorType]) -> u64 {
    let size = operands.first().map_or(0, |t| t.dtype.size_bytes()) as u64;
    match op {
        Op::MatMul { .. } if operands.first().map(|t| t.dtype) == Some(DType::BF16) => {
            let widened = |t: &TensorType| product(t.dims()).saturating_mul(4);
            (operands.iter().take(2)).fold(0, |sum, t| sum.saturating_add(widened(t)))
        }
        // The copies are rounded from the results themselves.
        Op::AlsoRounded(inner) => cpu_kernel(inner, operands),
        // The f32 results it rounds, then the op's own scratch.
        Op::Rounded(inner) => {
            let results = inner.infer(operands).unwrap_or_default();
            let rounds = inner.rounded_results();
            (results.iter().enumerate())
                .filter(|(port, _)| rounds.contains(port))
                .fold(cpu_kernel(inner, operands), |sum, (_, t)| {
                    sum.saturating_add(crate::interpret::ops::conversion_bytes(
                        DType::F32,
                        t.dims(),
                    ))
                })
        }
        // The forward's `lse`, which the backward reads.
        Op::LinearCrossEntropyGrad { .. } => match dims(operands, 0) {
            &[rows, _] => crate::interpret::ops::conversion_bytes(DType::F32, &[rows]),
            _ => 0,
        },
        Op::AttentionBackward { .. } => match dims(operands, 1) {
            &[_, _, keys, _] => (keys as u64).saturating_mul(size),
            _ => 0,
        },
        Op::CachedAttention { .. } => match (dims(operands, 0), dims(operands, 1)) {
            (&[b, hq, t, _], &[_, _, smax, _]) => product(&[b, hq, t, smax]).saturating_mul(size),
            _ => 0,
        },
        Op::Linear {
            add_rmsnorm: Some(eps),
            ..
        } => crate::interpret::linear::add_rmsnorm_workspace_bytes(operands, *eps),
        Op::Linear {
            biases,
            rope_kv: Some(theta),
            ..
        } => crate::interpret::linear::rope_kv_workspace_bytes(operands, biases, *theta),
        Op::Linear { biases, swiglu, .. } => {
            let weights: Vec<&[usize]> = (1..=biases.len()).map(|p| dims(operands, p)).collect();
            let x = operands
                .first()
                .map_or((DType::F32, &[][..]), |t| (t.dtype, t.dims()));
            crate::interpret::linear::workspace_bytes(x, &weights, *swiglu)
        }
        Op::RopeKvWrite {
            theta,
            bias,
            staged,
        } => crate::interpret::rope_kv::workspace_bytes((*theta, *bias, *staged), operands),
        // One row of gradient in the param's dtype, then a bit for each row.
        Op::EmbeddingAdamW { .. } => match dims(operands, 0) {
            &[vocab, hidden] => {
                let row = crate::interpret::ops::conversion_bytes(operands[0].dtype, &[hidden]);
                row.saturating_add((vocab as u64).div_ceil(8))
            }
            _ => 0,
        },
        _ => 0,
    }
}

/// The CUDA backend's scratch (the lowering asks for exactly these).
fn cuda(op: &Op, operands: &[TensorType]) -> u64 {
    match op {
        Op::Rounded(inner) | Op::AlsoRounded(inner) => return cuda(inner, operands),
        Op::Linear {
            rope_kv: Some(_), ..
        } => return crate::lower::linear_rope_kv_workspace_bytes(operands),
        Op::Linear { biases, swiglu, .. } => {
            return crate::lower::linear_workspace_bytes(operands, biases.len(), *swiglu)
        }
        Op::LinearCrossEntropy { ignore_index }
        | Op::LinearCrossEntropyBackward { ignore_index }
        | Op::LinearCrossEntropyGrad { ignore_index } => {
            return linear_loss_bytes(op, operands, *ignore_index)
        }
        Op::FlashAttention { .. } | Op::FlashAttentionBackward { .. } => {
            return flash_bytes(op, operands)
        }
        &Op::EmbeddingAdamW { rows, .. } => {
            let ids = op.embedding_update_ports().map_or(5, |(ids, ..)| ids);
            let (tokens, hidden, vocab) = match dims(operands, 0) {
                &[vocab, hidden] => (product(dims(operands, ids)), hidden, vocab),
                _ => return 0,
            };
            let sizes = [tokens, hidden as u64, vocab as u64];
            return kiln_kernels::gpu::embedding::embedding_adamw_workspace_bytes(rows, sizes);
        }
        _ => {}
    }
    if operands.first().map(|t| t.dtype) != Some(DType::F32) {
        return 0;
    }
    let attention = || attention_dims(operands);
    let rows = |port: usize| match dims(operands, port).split_last() {
        Some((_, rest)) => product(rest),
        None => 0,
    };
    match op {
        Op::AttentionBackward { .. } => attention().map_or(0, |d| d.backward_workspace_bytes()),
        Op::CachedAttention { .. } => attention().map_or(0, |d| decode::partials_bytes(&d)),
        Op::RmsNormBackward { .. } | Op::AddRmsNormBackward { .. } => {
            let hidden = dims(operands, 0).last().map_or(0, |&h| h as u64);
            kiln_kernels::gpu::norm::backward_workspace(rows(0), hidden).1
        }
        Op::SumToShape { shape } => {
            let cols = product(shape.dims());
            let rows = product(dims(operands, 0)).checked_div(cols).unwrap_or(0);
            kiln_kernels::gpu::columns::partials_bytes(rows, cols)
        }
        Op::CrossEntropy { .. } => rows(0).saturating_mul(4),
        Op::ClipGradNorm { .. } => kiln_kernels::gpu::optim::clip_workspace_bytes(
            operands.iter().map(|t| product(t.dims())),
        ),
        _ => 0,
    }
}

/// The sizes of an attention of `q [B,Hq,T,D]` and `k [B,Hkv,S,D]` (operands 0 and 1).
fn attention_dims(operands: &[TensorType]) -> Option<AttentionDims> {
    match (dims(operands, 0), dims(operands, 1)) {
        (&[batch, q_heads, q_len, head_dim], &[_, kv_heads, kv_len, _]) => Some(AttentionDims {
            batch: batch as u64,
            q_heads: q_heads as u64,
            kv_heads: kv_heads as u64,
            q_len: q_len as u64,
            kv_len: kv_len as u64,
            head_dim: head_dim as u64,
        }),
        _ => None,
    }
}

/// FlashAttention's workspace: q, k, v staged where they are not 16-bit rows of the kernels'
/// head dim, and the backward's grad_out and scratch
/// ([`forward_workspace_bytes`](flash::forward_workspace_bytes)).
fn flash_bytes(op: &Op, operands: &[TensorType]) -> u64 {
    let stored = |port: usize| operands.get(port).map_or(DType::F32, |t| t.dtype);
    let stored = [stored(0), stored(1), stored(2)];
    let Some(d) = attention_dims(operands) else {
        return 0;
    };
    match op {
        Op::FlashAttention { .. } => flash::forward_workspace_bytes(&d, stored),
        _ => flash::backward_workspace_bytes(&d, stored),
    }
}

/// The chunked LM-head loss's workspace: one chunk of logits and the rows' scratch
/// ([`LinearLoss`](kiln_kernels::gpu::loss::LinearLoss)): a vocabulary chunk for the loss or
/// its backward, a chunk of whole rows for both in one.
fn linear_loss_bytes(op: &Op, operands: &[TensorType], ignore_index: i64) -> u64 {
    let dtype = operands
        .first()
        .and_then(|t| kiln_kernels::gpu::GemmDType::of(t.dtype));
    let (Some(dtype), &[rows, hidden], &[vocab, _]) = (dtype, dims(operands, 0), dims(operands, 1))
    else {
        return 0;
    };
    let sizes = [rows, hidden, vocab].map(|d| d as u64);
    let loss = kiln_kernels::gpu::loss::LinearLoss::new(sizes, dtype, ignore_index);
    match op {
        Op::LinearCrossEntropy { .. } => loss.forward_workspace_bytes(),
        Op::LinearCrossEntropyGrad { .. } => loss.fused_workspace_bytes(),
        _ => loss.backward_workspace_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, dims).unwrap()
    }

    #[test]
    fn each_backend_states_its_own_needs_and_any_takes_the_larger() {
        let (q, k) = (f32(&[2, 4, 5, 16]), f32(&[2, 2, 5, 16]));
        let backward = Op::AttentionBackward { scale: 0.25 };
        let operands = [
            q.clone(),
            k.clone(),
            k.clone(),
            f32(&[2, 4, 5, 5]),
            f32(&[2, 5, 4, 16]),
        ];
        assert_eq!(Workspaces::Cpu.workspace_bytes(&backward, &operands), 5 * 4);
        // dS and the masked probs (200 floats, 800 bytes, each rounded up to 1024), then
        // grad_out [2,4,5,16].
        let gpu = 2 * 1024 + 2 * 4 * 5 * 16 * 4;
        assert_eq!(Workspaces::Cuda.workspace_bytes(&backward, &operands), gpu);
        assert_eq!(Workspaces::Any.workspace_bytes(&backward, &operands), gpu);

        let bf16 = |dims: &[usize]| TensorType::new(DType::BF16, dims).unwrap();
        let matmul = Op::MatMul {
            transpose_a: false,
            transpose_b: true,
        };
        let operands = [bf16(&[3, 8]), bf16(&[6, 8])];
        assert_eq!(
            Workspaces::Cpu.workspace_bytes(&matmul, &operands),
            (24 + 48) * 4
        );
        assert_eq!(Workspaces::Cuda.workspace_bytes(&matmul, &operands), 0);

        let loss = Op::CrossEntropy { ignore_index: -100 };
        let operands = [f32(&[7, 97]), TensorType::new(DType::I64, [7]).unwrap()];
        assert_eq!(Workspaces::Cpu.workspace_bytes(&loss, &operands), 0);
        assert_eq!(Workspaces::Any.workspace_bytes(&loss, &operands), 28);
    }
}
