//! One IR op on the CPU reference kernels: the kernel, its argument order and its workspaces
//! are exactly the eager oracle's (kiln-frontend's `ops`), so both compute the same bits.
//!
//! [`run_op`] is the one op → kernel table: the interpreter (results in fresh tensors, scratch
//! it allocates) and the planned executor (results and scratch in the arena) both call it, so
//! no op is mapped to its kernels twice. Kernels overwrite their results (they never read what
//! was there), so fresh zeros and a poisoned arena give the same bits.
//!
//! The caller has checked the operands against the type rule, so each op has the operand count
//! and result count its rule fixes (indexing `i[..]` and `o[..]` below relies on it).

use kiln_ir::{DType, Op, Shape, TensorType};
use kiln_kernels::attention::flash;
use kiln_kernels::matmul::Transpose;
use kiln_kernels::optim::{AdamW, Scatter, TableState};
use kiln_kernels::{activation, copy, elementwise, embedding, loss, norm, rope};
use kiln_kernels::{Error, Result, TensorView, TensorViewMut};

use crate::device::Device;
use crate::launch::launch;
use crate::placed::bytes;
use crate::tensor::Tensor;
use crate::workspaces::Workspaces;
use kiln_planner::WorkspaceNeeds;

/// Runs `op`'s kernels: reads `i` (the operands, by port), overwrites `o` (the results, by
/// port) and uses `workspace` as scratch; `workspace` holds at least
/// [`Workspaces::Cpu`] states for it, 8-byte aligned (empty for ops that need none). View ops
/// (reshape, transpose, slice) have no kernel: they are layouts, which each caller derives.
pub(crate) fn run_op(
    op: &Op,
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    workspace: &mut [u8],
) -> Result<()> {
    let types: Vec<(DType, &[usize])> = i.iter().map(|v| (v.dtype(), v.shape().dims())).collect();
    let conversions = conversions(op, &types);
    if conversions.is_empty() {
        return run_kernels(op, i, o, workspace);
    }
    // Stored operands of another dtype are converted into the front of the workspace first.
    let mut converted = i.to_vec();
    let mut rest = workspace;
    for (port, dtype) in conversions {
        let dims = i[port].shape().dims();
        let bytes = conversion_bytes(dtype, dims) as usize;
        let taken = std::mem::take(&mut rest);
        let at = bytes.min(taken.len());
        let (head, tail) = taken.split_at_mut(at);
        rest = tail;
        let mut view = typed_workspace(head, dtype, dims, op)?;
        copy::cast(&i[port], &mut view)?;
        converted[port] = view.into_view();
    }
    run_kernels(op, &converted, o, rest)
}

/// The operands the CPU reference converts before `op`'s kernel runs, as (port, dtype): stored
/// operands of another dtype than the op computes in (`kiln_ir::stores`) — a bf16 weight, bias
/// or cache widened to f32, or the new rows of a bf16 cache rounded to bf16. The kernels then
/// see operands of one dtype; widening is exact, so the result is that of a `Cast` first.
pub(crate) fn conversions(op: &Op, operands: &[(DType, &[usize])]) -> Vec<(usize, DType)> {
    let inner = match op {
        Op::Rounded(inner) | Op::AlsoRounded(inner) => inner,
        op => op,
    };
    let ports = match inner {
        // The f16 FlashAttention's f16 operands are their rounding already: widened exactly.
        Op::FlashAttention {
            rounding: DType::F16,
            ..
        } => {
            return (operands.iter().enumerate().take(3))
                .filter(|(_, &(dtype, _))| dtype == DType::F16)
                .map(|(port, _)| (port, DType::F32))
                .collect();
        }
        Op::KvCacheWrite => {
            return match (operands.first(), operands.get(1)) {
                (Some(&(cache, _)), Some(&(new, _))) if cache != new => vec![(1, cache)],
                _ => vec![],
            }
        }
        _ => op.stored_operands(),
    };
    let dtypes: Vec<DType> = operands.iter().map(|&(dtype, _)| dtype).collect();
    let Some(compute) = op.compute_dtype(&dtypes) else {
        return vec![];
    };
    ports
        .iter()
        .filter(|&&port| {
            operands
                .get(port)
                .is_some_and(|&(dtype, _)| dtype != compute)
        })
        .map(|&port| (port, compute))
        .collect()
}

/// Workspace bytes of one converted operand of `dims` (a multiple of 8, keeping the next
/// conversion and the kernel's own scratch aligned).
pub(crate) fn conversion_bytes(dtype: DType, dims: &[usize]) -> u64 {
    let elements = dims.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
    elements
        .saturating_mul(dtype.size_bytes() as u64)
        .div_ceil(8)
        .saturating_mul(8)
}

/// `op`'s kernels on operands of the dtypes they take.
fn run_kernels(
    op: &Op,
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    workspace: &mut [u8],
) -> Result<()> {
    match op.clone() {
        Op::Embedding => embedding::embedding(&i[0], &i[1], &mut o[0]),
        Op::EmbeddingBackward { .. } => {
            embedding::embedding_backward(&i[0], &i[1], i.get(2), &mut o[0])
        }
        Op::MatMul {
            transpose_a,
            transpose_b,
        } => {
            let transpose = Transpose {
                a: transpose_a,
                b: transpose_b,
            };
            // The bf16 path widens its operands into the workspace (f32 and f64 need none).
            let len = kiln_kernels::matmul::matmul_workspace_len(
                i[0].dtype(),
                i[0].shape(),
                i[1].shape(),
                transpose,
            );
            let workspace = f32_workspace(workspace, len)?;
            kiln_kernels::matmul::matmul(&i[0], &i[1], &mut o[0], transpose, workspace)
        }
        Op::Rounded(inner) => {
            // The results rounded as f32 at the workspace's front, then each rounded as `Cast`
            // rounds it; the others written where they go.
            let rounds = inner.rounded_results();
            let mut rest = workspace;
            let mut results = Vec::with_capacity(o.len());
            let mut rounded = Vec::with_capacity(rounds.len());
            for (port, out) in o.iter_mut().enumerate() {
                if !rounds.contains(&port) {
                    results.push(out.as_view_mut());
                    continue;
                }
                let dims = out.shape().dims().to_vec();
                let taken = std::mem::take(&mut rest);
                let bytes = (conversion_bytes(DType::F32, &dims) as usize).min(taken.len());
                let (front, tail) = taken.split_at_mut(bytes);
                rest = tail;
                results.push(typed_workspace(front, DType::F32, &dims, op)?);
                rounded.push((port, out));
            }
            run_kernels(&inner, i, &mut results, rest)?;
            for (port, out) in rounded {
                copy::cast(&results[port].as_view(), out)?;
            }
            Ok(())
        }
        Op::AlsoRounded(inner) => {
            // The op's results where they go, then the copies (after them) rounded from them
            // as `Cast` rounds.
            let (results, copies) = o.split_at_mut(o.len() - inner.rounded_results().len());
            run_kernels(&inner, i, results, workspace)?;
            for (&port, copy) in inner.rounded_results().iter().zip(copies) {
                copy::cast(&results[port].as_view(), copy)?;
            }
            Ok(())
        }
        Op::Add => elementwise::add(&i[0], &i[1], &mut o[0]),
        Op::Mul => elementwise::mul(&i[0], &i[1], &mut o[0]),
        Op::Scale { alpha } => elementwise::scale(&i[0], alpha, &mut o[0]),
        Op::SumToShape { .. } => elementwise::sum_to_shape(&i[0], &mut o[0]),
        Op::BroadcastTo { .. } => elementwise::broadcast_to(&i[0], &mut o[0]),
        Op::Cast { .. } => copy::cast(&i[0], &mut o[0]),
        Op::CastInto => copy::cast(&i[1], &mut o[0]),
        Op::RmsNorm { eps } => norm::rmsnorm(&i[0], &i[1], eps, &mut o[0]),
        Op::RmsNormBackward { eps } => {
            let (gx, gw) = o.split_at_mut(1);
            norm::rmsnorm_backward(&i[0], &i[1], &i[2], eps, &mut gx[0], &mut gw[0])
        }
        Op::AddRmsNorm { eps } => {
            let (sum, out) = o.split_at_mut(1);
            norm::add_rmsnorm(&i[0], &i[1], &i[2], eps, &mut sum[0], &mut out[0])
        }
        // grad_sum, the fourth operand, is absent when the sum received no gradient.
        Op::AddRmsNormBackward { eps } => {
            let (gi, gw) = o.split_at_mut(1);
            let grad_sum = i.get(3);
            norm::add_rmsnorm_backward(&i[0], &i[1], &i[2], grad_sum, eps, &mut gi[0], &mut gw[0])
        }
        Op::Rope { theta, .. } => rope::rope(&i[0], &i[1], i.get(2), theta, &mut o[0]),
        Op::RopeBackward { theta } => rope::rope_backward(&i[0], &i[1], theta, &mut o[0]),
        Op::Attention { scale } => {
            // Results are (out, probs); the kernel takes probs first.
            let (out, probs) = o.split_at_mut(1);
            let (q, k, v) = (&i[0], &i[1], &i[2]);
            kiln_kernels::attention::attention(q, k, v, scale, &mut probs[0], &mut out[0])
        }
        Op::AttentionBackward { scale } => {
            // One row of dP/dS over the S keys, in q's dtype.
            let keys = i[1].shape().dims().get(2).copied().unwrap_or(0);
            let mut row = typed_workspace(workspace, i[0].dtype(), &[keys], op)?;
            let (gq, rest) = o.split_at_mut(1);
            let (gk, gv) = rest.split_at_mut(1);
            kiln_kernels::attention::attention_backward(
                &i[0], &i[1], &i[2], &i[3], &i[4], scale, &mut gq[0], &mut gk[0], &mut gv[0],
                &mut row,
            )
        }
        Op::FlashAttention { scale, rounding } => {
            let (out, lse) = o.split_at_mut(1);
            flash::flash_attention(
                &i[0],
                &i[1],
                &i[2],
                (scale, rounding),
                &mut out[0],
                &mut lse[0],
            )
        }
        Op::FlashAttentionBackward { scale } => {
            let (gq, rest) = o.split_at_mut(1);
            let (gk, gv) = rest.split_at_mut(1);
            let grads = [&mut gq[0], &mut gk[0], &mut gv[0]];
            flash::flash_attention_backward(&i[0], &i[1], &i[2], &i[3], &i[4], &i[5], scale, grads)
        }
        Op::CachedAttention { scale } => {
            // The probabilities [B,Hq,T,Smax], in q's dtype.
            let (q, cache) = (i[0].shape().dims(), i[1].shape().dims());
            let dims: Vec<usize> = q[..3].iter().chain(&cache[2..3]).copied().collect();
            let mut probs = typed_workspace(workspace, i[0].dtype(), &dims, op)?;
            let (q, k, v, rows) = (&i[0], &i[1], &i[2], (&i[3], i.get(4)));
            kiln_kernels::cache::cached_attention(q, k, v, rows, scale, &mut probs, &mut o[0])
        }
        Op::KvCacheWrite => {
            // The result starts as a copy of the cache; only the new rows change.
            copy::copy(&i[0], &mut o[0])?;
            kiln_kernels::cache::kv_cache_write(&mut o[0], &i[1], &i[2], i.get(3))
        }
        Op::SwiGlu => activation::swiglu(&i[0], &i[1], &mut o[0]),
        Op::SwiGluBackward => {
            let (gg, gu) = o.split_at_mut(1);
            activation::swiglu_backward(&i[0], &i[1], &i[2], &mut gg[0], &mut gu[0])
        }
        Op::Softmax => activation::softmax(&i[0], &mut o[0]),
        Op::Argmax => activation::argmax(&i[0], &mut o[0]),
        Op::SoftmaxBackward => activation::softmax_backward(&i[0], &i[1], &mut o[0]),
        Op::CrossEntropy { ignore_index } => {
            loss::cross_entropy(&i[0], &i[1], ignore_index, &mut o[0])
        }
        Op::CrossEntropyBackward { ignore_index } => {
            loss::cross_entropy_backward(&i[0], &i[1], ignore_index, &i[2], &mut o[0])
        }
        Op::LinearCrossEntropy { ignore_index } => {
            let (loss, lse) = o.split_at_mut(1);
            loss::chunked::linear_cross_entropy(
                &i[0],
                &i[1],
                &i[2],
                ignore_index,
                &mut loss[0],
                &mut lse[0],
            )
        }
        Op::LinearCrossEntropyBackward { ignore_index } => {
            let (grad_x, grad_weight) = o.split_at_mut(1);
            loss::chunked::linear_cross_entropy_backward(
                &i[0],
                &i[1],
                &i[2],
                &i[3],
                &i[4],
                ignore_index,
                &mut grad_x[0],
                &mut grad_weight[0],
            )
        }
        // The forward then the backward, `lse` in the workspace: the two ops' bits.
        Op::LinearCrossEntropyGrad { ignore_index } => {
            let rows = i[0].shape().rows();
            let mut lse = typed_workspace(workspace, DType::F32, &[rows], op)?;
            let (loss, grads) = o.split_at_mut(1);
            loss::chunked::linear_cross_entropy(
                &i[0],
                &i[1],
                &i[2],
                ignore_index,
                &mut loss[0],
                &mut lse,
            )?;
            let (grad_x, grad_weight) = grads.split_at_mut(1);
            loss::chunked::linear_cross_entropy_backward(
                &i[0],
                &i[1],
                &i[2],
                &lse.into_view(),
                &i[3],
                ignore_index,
                &mut grad_x[0],
                &mut grad_weight[0],
            )
        }
        Op::AdamW(config) | Op::AdamWCopy(config) => {
            let at = op.adamw().map_or(4, |(_, step)| step);
            let grad_scale = i
                .get(at + 2)
                .map(|s| scalar::<f32>(s, "grad_scale"))
                .transpose()?;
            let (step, config) = adamw_config(&config, &i[at], &i[at + 1])?;
            updated([&i[0], &i[2], &i[3]], o, |p, m, v| {
                kiln_kernels::optim::adamw(p, &i[1], m, v, (step, grad_scale), &config)
            })
        }
        // The gradient of each row made in a row of scratch, the named rows' bits after it;
        // the rows the op does not update pass through, in the copy too.
        Op::EmbeddingAdamW { config, rows, .. } => {
            let (ids, grad, base) = op.embedding_update_ports().expect("an embedding update");
            let at = op.adamw().map_or(3, |(_, step)| step);
            let (step, config) = adamw_config(&config, &i[at], &i[at + 1])?;
            let dtype = i[0].dtype();
            let row_dims = &i[0].shape().dims()[1..];
            let row_bytes = conversion_bytes(dtype, row_dims) as usize;
            let (row, named) = workspace.split_at_mut(row_bytes.min(workspace.len()));
            let mut row = typed_workspace(row, dtype, row_dims, op)?;
            for (from, to) in i.iter().zip(o.iter_mut()) {
                copy::copy(from, to)?;
            }
            let [p, m, v, copied @ ..] = o else {
                unreachable!("the type rule gives an update three or four results")
            };
            let state = TableState {
                param: p,
                m,
                v,
                copy: copied.first_mut(),
            };
            let scatter = Scatter {
                ids: &i[ids],
                grad_out: grad.map(|g| &i[g]),
                base: base.map(|b| &i[b]),
            };
            let scratch = (&mut row, &mut *named);
            kiln_kernels::optim::embedding_adamw(state, rows, scatter, scratch, step, &config)
        }
        // The reference kernels run in a world of one rank, where the sum over the ranks is a
        // copy (the interpreter takes other worlds through its communicator: `interpret_in`).
        Op::AllReduce => (i.iter().zip(o.iter_mut())).try_for_each(|(x, y)| copy::copy(x, y)),
        Op::ClipGradNorm { max_norm } => {
            let (norm, scale) = kiln_kernels::optim::clip_grad_norm(i, max_norm)?;
            for (out, value) in o.iter_mut().zip([norm, scale]) {
                out.slice_mut::<f32>("clip_grad_norm", "out")?[0] = value;
            }
            Ok(())
        }
        Op::Contiguous => copy::copy(&i[0], &mut o[0]),
        Op::Linear {
            biases,
            swiglu,
            add_rmsnorm: None,
            rope_kv: None,
        } => super::linear::linear(i, o, (&biases, swiglu), workspace),
        Op::Linear {
            biases,
            add_rmsnorm: Some(eps),
            ..
        } => super::linear::linear_add_rmsnorm(i, o, (&biases, eps), workspace),
        Op::Linear {
            biases,
            rope_kv: Some(theta),
            ..
        } => super::linear::linear_rope_kv(i, o, (&biases, theta), workspace),
        Op::RopeKvWrite {
            theta,
            bias,
            staged,
        } => super::rope_kv::rope_kv_write((theta, bias, staged), i, o, workspace),
        Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } => Err(Error::Argument {
            op: op.name(),
            argument: "op",
            reason: "a view op has no kernel; its result is a layout of its operand".to_string(),
        }),
    }
}

/// The first `len` f32 elements of `workspace`.
fn f32_workspace(workspace: &mut [u8], len: usize) -> Result<&mut [f32]> {
    let got = workspace.len() / 4;
    let too_small = Error::Workspace {
        op: "matmul",
        operand: "workspace",
        needed: len,
        got,
    };
    match bytes::data_mut(workspace, kiln_ir::DType::F32) {
        Some(kiln_kernels::DataMut::F32(all)) => all.get_mut(..len).ok_or(too_small),
        _ => Err(misaligned("matmul")),
    }
}

/// A contiguous `dims` view of `dtype` at the start of `workspace`.
pub(super) fn typed_workspace<'w>(
    workspace: &'w mut [u8],
    dtype: kiln_ir::DType,
    dims: &[usize],
    op: &Op,
) -> Result<TensorViewMut<'w>> {
    let needed: usize = dims.iter().product();
    let got = workspace.len() / dtype.size_bytes();
    if got < needed {
        return Err(Error::Workspace {
            op: op.name(),
            operand: "workspace",
            needed,
            got,
        });
    }
    let data = bytes::data_mut(workspace, dtype).ok_or_else(|| misaligned(op.name()))?;
    TensorViewMut::contiguous(data, Shape::new(dims))
}

fn misaligned(op: &'static str) -> Error {
    Error::Argument {
        op,
        argument: "workspace",
        reason: "its bytes are not aligned for its dtype".to_string(),
    }
}

/// An update's step (counted from 1) and hyper-parameters, from its `step` and `lr` operands.
fn adamw_config(
    config: &kiln_ir::AdamWConfig,
    step: &TensorView<'_>,
    lr: &TensorView<'_>,
) -> Result<(u64, AdamW)> {
    let config = AdamW {
        lr: scalar::<f64>(lr, "lr")?,
        beta1: config.beta1,
        beta2: config.beta2,
        eps: config.eps,
        weight_decay: config.weight_decay,
    };
    Ok((adamw_step(step)?, config))
}

/// An update's results (`o`: param, m, v[, copy]): `param`, `m`, `v` copied there, then
/// `update` on them; the copy, when there is one, takes the new param rounded, as `CastInto`
/// rounds it.
fn updated(
    [param, m, v]: [&TensorView<'_>; 3],
    o: &mut [TensorViewMut<'_>],
    update: impl FnOnce(
        &mut TensorViewMut<'_>,
        &mut TensorViewMut<'_>,
        &mut TensorViewMut<'_>,
    ) -> Result<()>,
) -> Result<()> {
    let (new_param, rest) = o.split_at_mut(1);
    let (new_m, rest) = rest.split_at_mut(1);
    let (new_v, copy) = rest.split_at_mut(1);
    copy::copy(param, &mut new_param[0])?;
    copy::copy(m, &mut new_m[0])?;
    copy::copy(v, &mut new_v[0])?;
    update(&mut new_param[0], &mut new_m[0], &mut new_v[0])?;
    match copy.first_mut() {
        Some(copy) => copy::cast(&new_param[0].as_view(), copy),
        None => Ok(()),
    }
}

/// The one element of a scalar operand of AdamW.
fn scalar<T: kiln_kernels::Element>(value: &TensorView<'_>, operand: &'static str) -> Result<T> {
    let element = value.slice::<T>("adamw", operand)?.first().copied();
    element.ok_or(Error::Argument {
        op: "adamw",
        argument: operand,
        reason: "is empty".into(),
    })
}

/// The optimizer step held by the i64 scalar operand; steps count from 1.
fn adamw_step(step: &TensorView<'_>) -> Result<u64> {
    let step = step
        .slice::<i64>("adamw", "step")?
        .first()
        .copied()
        .unwrap_or(0);
    u64::try_from(step).map_err(|_| Error::Argument {
        op: "adamw",
        argument: "step",
        reason: format!("steps are counted from 1, got {step}"),
    })
}

/// Runs `op` on `operands` in fresh tensors; `types` are its result types. Views share their
/// operand's storage (and `contiguous` of a contiguous tensor is that tensor); every other op
/// runs [`run_op`] on fresh zeroed results and a fresh zeroed workspace.
pub(super) fn run(
    op: &Op,
    operands: &[Tensor],
    types: &[TensorType],
) -> crate::error::Result<Vec<Tensor>> {
    match op {
        Op::Reshape { shape } => return Ok(vec![operands[0].reshape(shape.clone())?]),
        Op::Transpose { dim0, dim1 } => return Ok(vec![operands[0].transpose(*dim0, *dim1)?]),
        Op::Slice { axis, start, end } => {
            return Ok(vec![operands[0].slice(*axis, *start, *end, 1)?])
        }
        Op::Contiguous if operands[0].is_contiguous() => return Ok(vec![operands[0].clone()]),
        _ => {}
    }
    let results: Vec<Tensor> = types
        .iter()
        .map(|ty| Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu))
        .collect();
    let operand_types: Vec<TensorType> = operands.iter().map(super::type_of).collect();
    let workspace_len = usize::try_from(Workspaces::Cpu.workspace_bytes(op, &operand_types))
        .map_err(|_| crate::error::Error::Graph {
            what: op.to_string(),
            reason: "its workspace exceeds the address space".to_string(),
        })?;
    let mut workspace = bytes::aligned_zeros(workspace_len);
    let workspace = bytes::prefix_mut(&mut workspace, workspace_len);
    let inputs: Vec<&Tensor> = operands.iter().collect();
    launch(&inputs, &results.iter().collect::<Vec<_>>(), |i, o| {
        run_op(op, i, o, workspace)
    })?;
    Ok(results)
}
