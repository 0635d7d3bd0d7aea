//! Several GPU executables over one device memory (see [`crate::group`]): the group allocates
//! the arena (the largest plan's bytes), one slot per param and state name, and max(streams)
//! streams, each of the plans' streams with a GEMM workspace; every member takes handles to
//! those and allocates only its own per-run input, output and fault slots. An allocation is
//! freed when its last holder drops.

use std::sync::{Arc, Mutex};

use kiln_ir::Graph;
use kiln_planner::Plan;

use super::super::{error, DeviceAlloc, Driver};
use super::GpuExecutable;
use crate::derived::Derived;
use crate::error::Result;
use crate::group::GroupMemory;
use crate::index_inputs::{group_index_rules, IndexRules};
use crate::lower::LowerOptions;
use crate::program::{DeviceProgram, SlotKind};

/// What the members of a group share on the device.
struct Shared<D: Driver> {
    streams: Vec<D::Stream>,
    gemm_workspaces: Vec<Arc<DeviceAlloc<D>>>,
    arena: Arc<DeviceAlloc<D>>,
    /// By index in [`GroupMemory::shared_inputs`].
    inputs: Vec<Arc<DeviceAlloc<D>>>,
    issue: Arc<Mutex<()>>,
}

impl<D: Driver> GpuExecutable<D> {
    /// Binds `programs` (at least one) to one device memory, as
    /// [`Backend::compile_group`](crate::Backend::compile_group) does: one executable per
    /// program, in the order given, and what they share. The arena and output slots start
    /// poisoned as in [`new`](Self::new).
    pub fn group(
        device: &Arc<D>,
        programs: &[(&Graph, &Plan)],
    ) -> Result<(Vec<Self>, GroupMemory)> {
        Self::group_with_options(device, programs, LowerOptions::default())
    }

    /// As [`group`](Self::group), with the lowering's `options` (as the device can run them:
    /// [`Driver::lower_options`]).
    pub fn group_with_options(
        device: &Arc<D>,
        programs: &[(&Graph, &Plan)],
        options: LowerOptions,
    ) -> Result<(Vec<Self>, GroupMemory)> {
        let options = device.lower_options(options);
        let memory = GroupMemory::of(programs)?;
        let lowered = (programs.iter())
            .map(|(graph, plan)| DeviceProgram::new(graph, plan, options))
            .collect::<Result<Vec<_>>>()?;
        let streams = lowered.iter().map(|p| p.streams).max().unwrap_or(1);
        // GEMMs run on the plans' streams only (`DeviceProgram::check_events`).
        let gemm_streams = lowered.iter().map(|p| p.plan_streams).max().unwrap_or(1);
        let workspace = device.gemm_workspace_bytes();
        let shared = Shared {
            streams: (0..streams)
                .map(|_| device.new_stream())
                .collect::<Result<_>>()?,
            gemm_workspaces: (0..gemm_streams)
                .map(|_| DeviceAlloc::new(device, workspace, 0).map(Arc::new))
                .collect::<Result<_>>()?,
            arena: Arc::new(DeviceAlloc::new(device, memory.arena_bytes as usize, 0xFF)?),
            inputs: (memory.shared_inputs.iter())
                .map(|input| DeviceAlloc::new(device, input.bytes() as usize, 0).map(Arc::new))
                .collect::<Result<_>>()?,
            issue: Arc::new(Mutex::new(())),
        };
        let graphs: Vec<&Graph> = programs.iter().map(|(graph, _)| *graph).collect();
        let rules = group_index_rules(&graphs, &memory);
        let executables = (lowered.into_iter().zip(rules).zip(&graphs))
            .map(|((program, rules), graph)| {
                let checks = (rules, Derived::of(graph));
                Self::member(device, program, &shared, &memory, checks)
            })
            .collect::<Result<_>>()?;
        Ok((executables, memory))
    }

    /// The executable of `program` over the group's `shared` resources, with its own slots
    /// allocated and every launch resolved.
    fn member(
        device: &Arc<D>,
        program: DeviceProgram,
        shared: &Shared<D>,
        memory: &GroupMemory,
        (index_rules, derived): (IndexRules, Derived),
    ) -> Result<Self> {
        let event = || device.new_event();
        let events = (0..program.events)
            .map(|_| event())
            .collect::<Result<Vec<_>>>()?;
        let joins = (1..program.streams)
            .map(|_| event())
            .collect::<Result<Vec<_>>>()?;
        let fork = event()?;
        let slots = (program.slots.iter())
            .map(|slot| {
                let own = |fill| DeviceAlloc::new(device, slot.bytes as usize, fill).map(Arc::new);
                match &slot.kind {
                    SlotKind::Arena => Ok(shared.arena.clone()),
                    SlotKind::Input(kind) if kind.is_persistent() => {
                        let index = memory.shared(&slot.name).ok_or_else(|| {
                            let what = format!("slot of `{}`", slot.name);
                            error(D::BACKEND, what, "not in the group")
                        })?;
                        Ok(shared.inputs[index].clone())
                    }
                    SlotKind::Input(_) | SlotKind::Faults => own(0),
                    SlotKind::Output => own(0xFF),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let mut executable = GpuExecutable {
            device: device.clone(),
            streams: shared.streams[..program.streams].to_vec(),
            gemm_workspaces: shared.gemm_workspaces[..program.plan_streams].to_vec(),
            program,
            events,
            fork,
            joins,
            slots,
            issue: shared.issue.clone(),
            index_rules,
            derived,
            steps: Vec::new(),
            write_backs: Vec::new(),
            graph: None,
            capture_seconds: None,
            programmatic: device.supports_programmatic_launch(),
        };
        executable.resolve_launches()?;
        Ok(executable)
    }
}
