//! The CPU reference of the fused [`Op::RopeKvWrite`](kiln_ir::Op::RopeKvWrite): its unfused
//! ops in their order, each through [`run_op`] (the one op → kernel table, stored operands'
//! conversions included), so a fused program equals its unfused one bit for bit on the CPU
//! and the GPU's fused kernel is checked against it.

use kiln_ir::rope_kv::{RopeKvParts, K, K_CACHE, V, V_CACHE};
use kiln_ir::{Op, TensorType};
use kiln_kernels::{Error, Result, TensorView, TensorViewMut};

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

/// Workspace bytes: the rotated keys, then the most any part takes.
pub(crate) fn workspace_bytes(theta: f64, bias: bool, operands: &[TensorType]) -> u64 {
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
    let write = |cache: usize, new: TensorType| {
        let mut types = vec![operands[cache].clone(), new];
        types.extend(pick(&parts.indices));
        Workspaces::Cpu.workspace_bytes(&Op::KvCacheWrite, &types)
    };
    let largest = [
        Workspaces::Cpu.workspace_bytes(&parts.rope, &pick(&parts.q_rope)),
        Workspaces::Cpu.workspace_bytes(&parts.rope, &pick(&parts.k_rope)),
        write(K_CACHE, rotated.clone()),
        write(V_CACHE, operands[V].clone()),
    ];
    let rotated_bytes = conversion_bytes(rotated.dtype, rotated.dims());
    rotated_bytes.saturating_add(largest.into_iter().max().unwrap_or(0))
}

/// Runs `RopeKvWrite{theta, bias}` on operands `i` into results `o` (q_rot, k_cache, v_cache).
pub(crate) fn rope_kv_write(
    (theta, bias): (f64, bool),
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    workspace: &mut [u8],
) -> Result<()> {
    let parts = parts(theta, bias, i.len())?;
    let pick = |ports: &[usize]| ports.iter().map(|&p| i[p].clone()).collect::<Vec<_>>();
    let [q_rot, k_cache, v_cache] = o else {
        return Err(Error::Argument {
            op: "rope_kv_write",
            argument: "results",
            reason: format!("takes 3 results, got {}", o.len()),
        });
    };
    run_op(
        &parts.rope,
        &pick(&parts.q_rope),
        std::slice::from_mut(q_rot),
        workspace,
    )?;
    // The rotated keys [B,Hkv,T,D], in k's dtype, ahead of the parts' own scratch.
    let k = i[K].shape().dims();
    let dims = [k[0], k[2], k[1], k[3]];
    let split = (conversion_bytes(i[K].dtype(), &dims) as usize).min(workspace.len());
    let (rotated_bytes, rest) = workspace.split_at_mut(split);
    let op = Op::RopeKvWrite { theta, bias };
    let mut rotated = typed_workspace(rotated_bytes, i[K].dtype(), &dims, &op)?;
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
    write(K_CACHE, rotated.into_view(), k_cache, rest)?;
    write(V_CACHE, i[V].clone(), v_cache, rest)
}
