//! Several CPU executables over ONE [`Memory`] (see [`crate::group`]): each program is laid
//! out as it would be alone (`slots.rs`), then its regions are renumbered into the group's:
//! - its arena (region 0) becomes the group's region 0, of the largest plan's bytes;
//! - the slot of each param and state input becomes the group's one slot of that name, and its
//!   working copy (where the plan writes it in place) the group's one working copy of that
//!   name: every run starts by refilling it from the slot, and runs never overlap;
//! - every other region (output buffers, per-run input slots, output slots, scratch) becomes a
//!   region of the group's that only this member uses.
//!
//! A member's spans thus lie inside the group's regions: its arena offsets inside its own
//! `arena_bytes`, at most the group's; the shared slots are of the one type every member
//! agrees on ([`GroupMemory::of`] checked it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use kiln_ir::Graph;
use kiln_planner::Plan;

use super::super::memory::Memory;
use super::slots::Slots;
use super::{CpuExecutable, GroupRegions};
use crate::error::Result;
use crate::group::GroupMemory;
use crate::index_inputs::group_index_rules;

impl CpuExecutable {
    /// Binds `programs` (at least one) to one memory, as [`Backend::compile_group`] does on
    /// the CPU: one executable per program, in the order given, and what they share. With
    /// `poison`, each run poisons as [`new_with_poison`](Self::new_with_poison) says (the
    /// whole shared arena first).
    ///
    /// [`Backend::compile_group`]: crate::Backend::compile_group
    pub fn group(programs: &[(&Graph, &Plan)], poison: bool) -> Result<(Vec<Self>, GroupMemory)> {
        let memory = GroupMemory::of(programs)?;
        let mut members = (programs.iter())
            .map(|(graph, plan)| Slots::read(graph, plan))
            .collect::<Result<Vec<_>>>()?;
        // Placement checked that each plan's arena fits in memory, so the largest does.
        let arena = (members.iter())
            .map(|m| m.placement.region_bytes[0])
            .max()
            .unwrap_or(0);
        let mut region_bytes = vec![arena];
        let shared_slots: Vec<usize> = (memory.shared_inputs.iter())
            .map(|input| add(&mut region_bytes, input.ty.size_bytes()))
            .collect();
        // The working copy of each shared input that some plan writes in place, by name.
        let mut shared_working: BTreeMap<usize, usize> = BTreeMap::new();
        let mut regions_of = Vec::with_capacity(members.len());
        for member in &members {
            let local = &member.placement.region_bytes;
            let mut region_of: Vec<Option<usize>> = vec![None; local.len()];
            region_of[0] = Some(0);
            for input in &member.inputs {
                let Some(shared) = memory.shared(&input.name) else {
                    continue;
                };
                region_of[input.slot.region] = Some(shared_slots[shared]);
                if let Some(working) = &input.working {
                    let bytes = local[working.region];
                    let region = *(shared_working.entry(shared))
                        .or_insert_with(|| add(&mut region_bytes, bytes));
                    region_bytes[region] = region_bytes[region].max(bytes);
                    region_of[working.region] = Some(region);
                }
            }
            let region_of: Vec<usize> = (region_of.into_iter().zip(local))
                .map(|(region, &bytes)| region.unwrap_or_else(|| add(&mut region_bytes, bytes)))
                .collect();
            regions_of.push(region_of);
        }
        for (member, region_of) in members.iter_mut().zip(&regions_of) {
            member.renumber(region_of, &region_bytes);
        }

        let regions = Arc::new(Mutex::new(GroupRegions {
            memory: Memory::zeroed(&region_bytes)?,
            set: vec![false; region_bytes.len()],
        }));
        let graphs: Vec<&Graph> = programs.iter().map(|(graph, _)| *graph).collect();
        let rules = group_index_rules(&graphs, &memory);
        let executables = (programs.iter().zip(members).zip(rules))
            .map(|(((graph, plan), member), index_rules)| CpuExecutable {
                graph: (*graph).clone(),
                plan: (*plan).clone(),
                placement: member.placement,
                memory: regions.clone(),
                inputs: member.inputs,
                outputs: member.outputs,
                scratch: member.scratch,
                poison,
                recording: None,
                communicator: std::sync::Arc::new(crate::collective::Solo),
                index_rules,
            })
            .collect();
        Ok((executables, memory))
    }
}

/// A new region of `bytes` bytes at the end of `region_bytes`; its index.
fn add(region_bytes: &mut Vec<usize>, bytes: usize) -> usize {
    region_bytes.push(bytes);
    region_bytes.len() - 1
}

#[cfg(test)]
mod tests;
