//! Executable groups: several planned programs of one model (prefill graphs for a few prompt
//! lengths, decode graphs per batch bucket) bound to ONE memory.
//!
//! What a group shares, and what stays per program:
//! 1. ONE activation arena of the largest plan's `arena_bytes` (max, not sum): every member's
//!    plan offsets lie inside its own `arena_bytes`, so inside the shared one. The arena holds
//!    only values that live within a run, and runs of a group's members never overlap (they
//!    run one after another), so no member sees another's activations.
//! 2. ONE slot per param and per state input, by name ([`InputKind::is_persistent`]): the
//!    weights and the KV pool are set once through any member; a state a run writes (in place
//!    or copied back) is what the next run of any member reads.
//! 3. Per-run data inputs ([`InputKind::Input`]: tokens, positions) and outputs stay per
//!    program, so buckets may give them different shapes.
//!
//! Two programs with a shared input of one name must agree on its kind and type; a group that
//! does not is refused ([`Error::GroupInput`]) before anything is allocated.

use std::collections::BTreeMap;

use kiln_ir::{Graph, InputKind, TensorType};
use kiln_planner::Plan;

use crate::backend::Executable;
use crate::error::{Error, Result};

/// Several planned programs bound to one memory (see the module doc).
pub struct ExecutableGroup {
    /// One per program, in the order given.
    pub executables: Vec<Box<dyn Executable>>,
    /// What the group allocated once for all of them.
    pub memory: GroupMemory,
}

impl ExecutableGroup {
    /// Every member joins `communicator`'s world ([`join_all`]).
    pub fn join(
        &mut self,
        communicator: &std::sync::Arc<dyn crate::collective::Communicator>,
    ) -> Result<()> {
        join_all(&mut self.executables, communicator)
    }
}

/// Each of `executables` joins `communicator`'s world ([`Executable::join`]).
pub fn join_all(
    executables: &mut [Box<dyn Executable>],
    communicator: &std::sync::Arc<dyn crate::collective::Communicator>,
) -> Result<()> {
    for executable in executables {
        executable.join(std::sync::Arc::clone(communicator))?;
    }
    Ok(())
}

/// The memory a group shares: its one arena and its shared input slots.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupMemory {
    /// Bytes of the one arena: the largest plan's `arena_bytes`.
    pub arena_bytes: u64,
    /// Bytes one arena per program would take: the sum of the plans' `arena_bytes`.
    pub arena_sum_bytes: u64,
    /// Every param and state input of the group once, in the order of first appearance
    /// (program order, then each graph's input order).
    pub shared_inputs: Vec<SharedInput>,
    /// Bytes of the shared input slots together.
    pub shared_input_bytes: u64,
}

/// One input slot of a group, shared by every member that has an input of its name.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedInput {
    pub name: String,
    /// [`InputKind::Param`] or [`InputKind::State`].
    pub kind: InputKind,
    pub ty: TensorType,
}

impl SharedInput {
    /// Bytes of the slot (contiguous, of the input's type).
    pub fn bytes(&self) -> u64 {
        self.ty.size_bytes() as u64
    }
}

impl GroupMemory {
    /// Checks that `programs` (at least one) agree on every shared input and sizes the memory.
    pub(crate) fn of(programs: &[(&Graph, &Plan)]) -> Result<Self> {
        if programs.is_empty() {
            return Err(Error::Graph {
                what: "executable group".to_string(),
                reason: "has no program".to_string(),
            });
        }
        // Each name's first declaration: (program index, kind, type).
        let mut first: BTreeMap<String, (usize, InputKind, TensorType)> = BTreeMap::new();
        let mut shared_inputs = Vec::new();
        for (index, (graph, _)) in programs.iter().enumerate() {
            for (_, name, kind, ty) in graph.inputs() {
                let Some((seen, seen_kind, seen_ty)) = first.get(name) else {
                    first.insert(name.to_string(), (index, kind, ty.clone()));
                    if kind.is_persistent() {
                        shared_inputs.push(SharedInput {
                            name: name.to_string(),
                            kind,
                            ty: ty.clone(),
                        });
                    }
                    continue;
                };
                // Per-run inputs of one name are separate slots: they may differ.
                let either_shared = kind.is_persistent() || seen_kind.is_persistent();
                if either_shared && (kind != *seen_kind || ty != seen_ty) {
                    let program = |i: usize| format!("`{}` (program {i})", programs[i].0.name());
                    return Err(Error::GroupInput {
                        name: name.to_string(),
                        programs: Box::new([program(*seen), program(index)]),
                        inputs: Box::new([
                            format!("{} {seen_ty}", seen_kind.name()),
                            format!("{} {ty}", kind.name()),
                        ]),
                    });
                }
            }
        }
        let arenas = programs.iter().map(|(_, plan)| plan.arena_bytes);
        Ok(GroupMemory {
            arena_bytes: arenas.clone().max().unwrap_or(0),
            arena_sum_bytes: arenas.sum(),
            shared_input_bytes: shared_inputs.iter().map(SharedInput::bytes).sum(),
            shared_inputs,
        })
    }

    /// The index of shared input `name` in [`shared_inputs`](Self::shared_inputs), if shared.
    pub fn shared(&self, name: &str) -> Option<usize> {
        self.shared_inputs.iter().position(|s| s.name == name)
    }
}

#[cfg(test)]
pub(crate) mod tests;
