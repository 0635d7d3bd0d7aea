//! The CPU reference of the fused [`Op::RopeKvWrite`](kiln_ir::Op::RopeKvWrite): its unfused
//! ops in their order, each through [`run_op`] (the one op → kernel table, stored operands'
//! conversions included), so a fused program equals its unfused one bit for bit on the CPU
//! and the GPU's fused kernel is checked against it.

use kiln_ir::rope_kv::{RopeKvParts, K, K_CACHE, Q, V, V_CACHE};
use kiln_ir::{DType, Op, TensorType};
use kiln_kernels::{copy, Error, Result, TensorView, TensorViewMut};

use super::ops::{conversion_bytes, run_op, typed_workspace};
use crate::workspaces::Workspaces;
use kiln_planner::WorkspaceNeeds;

fn parts(theta: f64, bias: bool, operands: usize) -> Result<RopeKvParts> {
    RopeKvParts::of(theta, bias, operands).ok_or_else(|| Error::Argument {
        op: "rope_kv_write",
        argument: "operands",
        reason: format!("{operands} is not one of its operand counts"),
    })
}

/// `[B,T,H,D]` as `[B,H,T,D]`.
fn head_major(dims: &[usize]) -> Vec<usize> {
    match dims {
        &[b, t, h, d] => vec![b, h, t, d],
        other => other.to_vec(),
    }
}

/// Workspace bytes: with `staged`, the f32 rotated queries and head-major values it rounds;
/// the rotated keys; then the most any part takes.
pub(crate) fn workspace_bytes(
    (theta, bias, staged): (f64, bool, Option<DType>),
    operands: &[TensorType],
) -> u64 {
    let Ok(parts) = parts(theta, bias, operands.len()) else {
        return 0;
    };
    let pick = |ports: &[usize]| {
        ports
            .iter()
            .map(|&p| operands[p].clone())
            .collect::<Vec<_>>()
    };
    let Ok(rotated) = parts
        .rope
        .infer(&pick(&parts.k_rope))
        .map(|mut t| t.remove(0))
    else {
        return 0;
    };
    let values = match staged {
        Some(_) => TensorType::new(operands[V].dtype, head_major(operands[V].dims())),
        None => Ok(operands[V].clone()),
    };
    let Ok(values) = values else {
        return 0;
    };
    let write = |cache: usize, new: TensorType| {
        let mut types = vec![operands[cache].clone(), new];
        types.extend(pick(&parts.indices));
        Workspaces::Cpu.workspace_bytes(&Op::KvCacheWrite, &types)
    };
    let largest = [
        Workspaces::Cpu.workspace_bytes(&parts.rope, &pick(&parts.q_rope)),
        Workspaces::Cpu.workspace_bytes(&parts.rope, &pick(&parts.k_rope)),
        write(K_CACHE, rotated.clone()),
        write(V_CACHE, values.clone()),
    ];
    let staged_bytes = match staged {
        Some(_) => [
            (operands[Q].dtype, head_major(operands[Q].dims())),
            (values.dtype, values.dims().to_vec()),
        ]
        .iter()
        .fold(0u64, |sum, (dtype, dims)| {
            sum.saturating_add(conversion_bytes(*dtype, dims))
        }),
        None => 0,
    };
    let rotated_bytes = conversion_bytes(rotated.dtype, rotated.dims());
    (staged_bytes.saturating_add(rotated_bytes))
        .saturating_add(largest.into_iter().max().unwrap_or(0))
}

/// The first `bytes` of `workspace` (as many as it has) and the rest.
fn take(workspace: &mut [u8], bytes: u64) -> (&mut [u8], &mut [u8]) {
    let at = (bytes as usize).min(workspace.len());
    workspace.split_at_mut(at)
}

/// Runs `RopeKvWrite{theta, bias, staged}` on operands `i` into results `o` (q_rot, k_cache,
/// v_cache[, k_rot, v_rows]).
pub(crate) fn rope_kv_write(
    (theta, bias, staged): (f64, bool, Option<DType>),
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    workspace: &mut [u8],
) -> Result<()> {
    let parts = parts(theta, bias, i.len())?;
    let op = Op::RopeKvWrite {
        theta,
        bias,
        staged,
    };
    let pick = |ports: &[usize]| ports.iter().map(|&p| i[p].clone()).collect::<Vec<_>>();
    let results = if staged.is_some() { 5 } else { 3 };
    if o.len() != results {
        return Err(Error::Argument {
            op: "rope_kv_write",
            argument: "results",
            reason: format!("takes {results} results, got {}", o.len()),
        });
    }
    let (written, rows) = o.split_at_mut(3);
    let [q_out, k_cache, v_cache] = written else {
        unreachable!("three results split off")
    };
    // Scratch: [f32 q_rot, head-major v (staged)][rotated keys [B,Hkv,T,D]][the parts' own].
    let (q_dims, k_dims) = (
        head_major(i[Q].shape().dims()),
        head_major(i[K].shape().dims()),
    );
    let staged_q = conversion_bytes(i[Q].dtype(), &q_dims);
    let staged_v = conversion_bytes(i[V].dtype(), &k_dims);
    let (q_bytes, rest) = take(workspace, if staged.is_some() { staged_q } else { 0 });
    let (v_bytes, rest) = take(rest, if staged.is_some() { staged_v } else { 0 });
    let (rotated_bytes, rest) = take(rest, conversion_bytes(i[K].dtype(), &k_dims));
    let q_rope = pick(&parts.q_rope);
    match staged {
        None => run_op(&parts.rope, &q_rope, std::slice::from_mut(q_out), rest)?,
        Some(_) => {
            let mut q_rot = typed_workspace(q_bytes, i[Q].dtype(), &q_dims, &op)?;
            run_op(&parts.rope, &q_rope, std::slice::from_mut(&mut q_rot), rest)?;
            copy::cast(&q_rot.into_view(), q_out)?;
        }
    }
    let mut rotated = typed_workspace(rotated_bytes, i[K].dtype(), &k_dims, &op)?;
    run_op(
        &parts.rope,
        &pick(&parts.k_rope),
        std::slice::from_mut(&mut rotated),
        rest,
    )?;
    let write =
        |cache: usize, new: TensorView<'_>, out: &mut TensorViewMut<'_>, rest: &mut [u8]| {
            let mut operands = vec![i[cache].clone(), new];
            operands.extend(pick(&parts.indices));
            run_op(
                &Op::KvCacheWrite,
                &operands,
                std::slice::from_mut(out),
                rest,
            )
        };
    let rotated = rotated.into_view();
    write(K_CACHE, rotated.clone(), k_cache, rest)?;
    if staged.is_none() {
        return write(V_CACHE, i[V].clone(), v_cache, rest);
    }
    // The staged form's token-major v made head-major, as `Contiguous(Transpose{1,2}(v))`.
    let mut values = typed_workspace(v_bytes, i[V].dtype(), &k_dims, &op)?;
    let transposed = i[V].layout().transpose(1, 2)?;
    copy::copy(
        &TensorView::with_layout(i[V].data(), transposed)?,
        &mut values,
    )?;
    let values = values.into_view();
    write(V_CACHE, values.clone(), v_cache, rest)?;
    let [k_rows, v_rows] = rows else {
        unreachable!("five results checked")
    };
    copy::cast(&rotated, k_rows)?;
    copy::cast(&values, v_rows)
}
