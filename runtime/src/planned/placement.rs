//! The CPU executor's reading of a plan, before anything runs: on top of the shared value→buffer
//! map ([`map_values`]) and schedule check, where each buffer's bytes are (its home), which
//! workspace each step gets and which arena bytes die after each step. Every mismatch between plan and graph is an error naming the step, buffer
//! or value; nothing here panics on a bad plan.
//!
//! Homes, by buffer class:
//! - activation, workspace: bytes `offset..offset + size` of the arena (region 0), inside
//!   `arena_bytes`;
//! - output: a region of its own, `size` bytes, fresh for each run;
//! - param, input, state: the tensor bound to the one input the buffer holds, read only; or,
//!   when the plan also has steps write into it (in-place results such as AdamW's or
//!   kv_cache_write's; views of the input write nothing), a region of its own that starts as a
//!   copy of that tensor's whole storage (so views keep their offsets and strides). The CPU
//!   reference executor copies so that nothing bound in `values` is ever written (as in the
//!   interpreter); a GPU executor will update the bound storage in place.
//!
//! `value_buffers` is the source of truth for which buffer holds a value; the buffers' own
//! `values` lists are not read.

use std::collections::BTreeMap;
use std::ops::Range;

use kiln_ir::graph::NodeKind;
use kiln_ir::{Alias, Graph, InputKind, TensorType, ValueId};
use kiln_planner::{Buffer, BufferClass, Plan};
use petgraph::stable_graph::NodeIndex;

use crate::error::Result;
use crate::placed::{check_schedule, describe, map_values, plan_error, Value, ValueLayout};
use crate::tensor::Tensor;
use crate::workspaces::Workspaces;
use kiln_planner::WorkspaceNeeds;

/// Where a buffer's bytes are during a run.
#[derive(Clone, Debug)]
pub(super) enum Home {
    /// Bytes `range` of region `region` of the run's memory (region 0 is the arena).
    Region { region: usize, range: Range<usize> },
    /// The tensor bound to an input; nothing writes this buffer.
    Bound(Tensor),
}

/// What the executor needs from a plan, checked against the graph.
pub(super) struct Placement {
    /// The buffer of every value of the graph.
    pub buffer_of: BTreeMap<Value, usize>,
    /// The home of every buffer, by id.
    pub homes: Vec<Home>,
    /// Bytes of every region; region 0 is the arena.
    pub region_bytes: Vec<usize>,
    /// Regions that start as a copy of a bound tensor's whole storage.
    pub copies: Vec<(usize, Tensor)>,
    /// The workspace buffer of each step that has one, by step.
    pub workspace: BTreeMap<usize, usize>,
    /// Arena bytes of the buffers whose lifetime ends at each step but the last, by step.
    pub dying: BTreeMap<usize, Vec<Range<usize>>>,
    /// The layout of every graph input in its home.
    pub inputs: Vec<(Value, ValueLayout)>,
}

/// The class of the buffer that holds an input of `kind`.
fn input_class(kind: InputKind) -> BufferClass {
    match kind {
        InputKind::Param => BufferClass::Param,
        InputKind::Input => BufferClass::Input,
        InputKind::State => BufferClass::State,
    }
}

impl Placement {
    /// Checks `plan` against `graph` and the tensors `bound` to its inputs (see the module doc).
    pub fn read(graph: &Graph, plan: &Plan, bound: &[(ValueId, Tensor)]) -> Result<Self> {
        let buffer_of = map_values(graph, plan)?;
        check_schedule(graph, plan)?;
        let arena_bytes = usize::try_from(plan.arena_bytes).map_err(|_| {
            let reason = format!("arena_bytes = {} does not fit in memory", plan.arena_bytes);
            plan_error(plan, "arena", reason)
        })?;
        let mut placement = Placement {
            buffer_of,
            homes: Vec::with_capacity(plan.buffers.len()),
            region_bytes: vec![arena_bytes],
            copies: Vec::new(),
            workspace: BTreeMap::new(),
            dying: BTreeMap::new(),
            inputs: Vec::new(),
        };
        let bound: BTreeMap<usize, &Tensor> =
            bound.iter().map(|(v, t)| (v.node.index(), t)).collect();
        let mut values_of: Vec<Vec<Value>> = vec![Vec::new(); plan.buffers.len()];
        for (value, buffer) in &placement.buffer_of {
            values_of[*buffer].push(*value);
        }
        for (buffer, values) in plan.buffers.iter().zip(&values_of) {
            let home = placement.home(graph, plan, buffer, values, &bound)?;
            placement.homes.push(home);
        }
        for (value, name, _, _) in graph.inputs() {
            let tensor = bound.get(&value.node.index()).ok_or_else(|| {
                plan_error(plan, format!("input `{name}`"), "is not bound".to_string())
            })?;
            placement
                .inputs
                .push(((value.node.index(), 0), ValueLayout::of_tensor(tensor)));
        }
        placement.workspaces(graph, plan)?;
        placement.lifetimes(plan);
        Ok(placement)
    }

    /// The home of `buffer`, checking its class against the `values` it holds.
    fn home(
        &mut self,
        graph: &Graph,
        plan: &Plan,
        buffer: &Buffer,
        values: &[Value],
        bound: &BTreeMap<usize, &Tensor>,
    ) -> Result<Home> {
        let fail = |reason: String| plan_error(plan, describe(buffer), reason);
        let inputs: Vec<(Value, InputKind)> = (values.iter())
            .filter_map(|v| match graph.node(NodeIndex::new(v.0)).map(|n| &n.kind) {
                Some(NodeKind::Input { kind, .. }) => Some((*v, *kind)),
                _ => None,
            })
            .collect();
        // Whether a step writes this buffer: it holds an op result that is not a view.
        let written = values.iter().any(|&(node, port)| {
            match graph.node(NodeIndex::new(node)).map(|n| &n.kind) {
                Some(NodeKind::Op(op)) => !matches!(op.alias(port), Alias::ViewOf(_)),
                _ => false,
            }
        });
        let size = usize::try_from(buffer.size)
            .map_err(|_| fail(format!("its size {} does not fit in memory", buffer.size)))?;
        if buffer.class.in_arena() || buffer.class == BufferClass::Output {
            if let Some(((node, _), _)) = inputs.first() {
                // Inputs are bound from outside; they never live in the arena or an output.
                return Err(fail(format!(
                    "is {:?} but holds input {node}.0",
                    buffer.class
                )));
            }
        }
        if buffer.class == BufferClass::Workspace && !values.is_empty() {
            let (node, port) = values[0];
            return Err(fail(format!(
                "is a workspace but holds value {node}.{port}"
            )));
        }
        if buffer.class.in_arena() {
            let offset = buffer
                .offset
                .ok_or_else(|| fail("has no arena offset".to_string()))?;
            let end = offset
                .checked_add(buffer.size)
                .filter(|&end| end <= plan.arena_bytes);
            let Some(end) = end else {
                let (size, arena) = (buffer.size, plan.arena_bytes);
                let reason = format!(
                    "bytes {offset}..{offset}+{size} lie outside the arena of {arena} bytes"
                );
                return Err(fail(reason));
            };
            // Both fit in `usize`: they are at most arena_bytes, which does.
            let range = offset as usize..end as usize;
            return Ok(Home::Region { region: 0, range });
        }
        if buffer.class == BufferClass::Output {
            return Ok(self.region(size));
        }
        let [(input, kind)] = inputs[..] else {
            let reason = format!("is {:?} but holds {} inputs", buffer.class, inputs.len());
            return Err(fail(reason));
        };
        if input_class(kind) != buffer.class {
            let reason = format!(
                "is {:?} but holds {} {}.0",
                buffer.class,
                kind.name(),
                input.0
            );
            return Err(fail(reason));
        }
        let tensor = (*bound
            .get(&input.0)
            .ok_or_else(|| fail("its input is not bound".into()))?)
        .clone();
        if !written {
            return Ok(Home::Bound(tensor));
        }
        let bytes = tensor.storage().len() * tensor.dtype().size_bytes();
        let home = self.region(bytes);
        if let Home::Region { region, .. } = home {
            self.copies.push((region, tensor));
        }
        Ok(home)
    }

    /// A new region of `bytes` bytes, whole.
    fn region(&mut self, bytes: usize) -> Home {
        self.region_bytes.push(bytes);
        Home::Region {
            region: self.region_bytes.len() - 1,
            range: 0..bytes,
        }
    }

    /// Pairs workspaces with steps: one per step that needs scratch, large enough.
    fn workspaces(&mut self, graph: &Graph, plan: &Plan) -> Result<()> {
        for buffer in plan
            .buffers
            .iter()
            .filter(|b| b.class == BufferClass::Workspace)
        {
            let fail = |reason: String| plan_error(plan, describe(buffer), reason);
            if buffer.start != buffer.end || buffer.start >= plan.schedule.len() {
                let (start, end) = (buffer.start, buffer.end);
                return Err(fail(format!(
                    "is a workspace for steps {start}..={end}, not one step"
                )));
            }
            if let Some(other) = self.workspace.insert(buffer.start, buffer.id) {
                return Err(fail(format!(
                    "is the second workspace of step {}, with buffer {other}",
                    buffer.start
                )));
            }
        }
        for (index, step) in plan.schedule.iter().enumerate() {
            let node = NodeIndex::new(step.node);
            let Some(NodeKind::Op(op)) = graph.node(node).map(|n| &n.kind) else {
                continue; // check_schedule refused these
            };
            let operands = (graph.operands(node).iter())
                .map(|v| graph.value_type(*v).cloned())
                .collect::<kiln_ir::Result<Vec<TensorType>>>()?;
            let need = Workspaces::Cpu.workspace_bytes(op, &operands);
            let have = self
                .workspace
                .get(&index)
                .map_or(0, |b| plan.buffers[*b].size);
            if have < need {
                let what = format!("step {index} (node %{} {op})", step.node);
                let reason = format!("needs {need} bytes of workspace, and the plan gives {have}");
                return Err(plan_error(plan, what, reason));
            }
        }
        Ok(())
    }

    /// The arena bytes that die after each step: buffers that outlive the run end at the last
    /// step and are never poisoned, since their values are read after it.
    fn lifetimes(&mut self, plan: &Plan) {
        let last = plan.schedule.len().saturating_sub(1);
        for (buffer, home) in plan.buffers.iter().zip(&self.homes) {
            if let (true, Home::Region { range, .. }) = (buffer.class.in_arena(), home) {
                if buffer.end < last {
                    self.dying
                        .entry(buffer.end)
                        .or_default()
                        .push(range.clone());
                }
            }
        }
    }
}
