//! A dense, read-only view of a graph for the planner: ops in node index order, every value
//! numbered densely, and who reads what.
//!
//! Invariants (built once per `plan` call, after the IR verifier passed):
//! 1. `ops` is in node index order, which the verifier guarantees is topological: every
//!    operand of `ops[i]` is a graph input or a result of some `ops[j]` with `j < i`.
//! 2. Value numbers follow node index order then port, so iterating them is deterministic.
//! 3. `readers[v]` lists every operand edge reading value `v` as `(op, port)`, sorted by op
//!    then port; an op reading a value twice appears twice.

use kiln_ir::graph::{Node, NodeKind};
use kiln_ir::{Graph, InputKind, Op, TensorType, ValueId};

use crate::{Error, Result, WorkspaceNeeds};

/// Dense number of a value.
pub(crate) type Value = usize;

/// Who writes a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Producer {
    /// Graph input number `i` (index into `Program::inputs`).
    Input(usize),
    /// Op number `i` (index into `Program::ops`), result `port`.
    Op { op: usize, port: usize },
}

/// A graph input.
pub(crate) struct InputInfo<'g> {
    pub name: &'g str,
    pub kind: InputKind,
    pub value: Value,
}

/// An op node with its operands and results, numbered densely.
pub(crate) struct OpInfo<'g> {
    /// IR node index.
    pub node: usize,
    /// `(node, port 0)`: a handle on the IR node (petgraph's index type is not named here, so
    /// the planner needs no petgraph dependency of its own).
    handle: ValueId,
    pub op: &'g Op,
    pub operands: Vec<Value>,
    pub operand_types: Vec<TensorType>,
    /// Bytes of scratch the backend needs for it (see [`Program::with_workspaces`]).
    pub workspace_bytes: u64,
    /// Value numbers of the results, port order.
    pub results: Vec<Value>,
}

/// Everything about one value the planner needs.
pub(crate) struct ValueInfo<'g> {
    pub id: ValueId,
    pub ty: &'g TensorType,
    pub producer: Producer,
    /// Operand edges reading it: (op, port), sorted.
    pub readers: Vec<(usize, usize)>,
    /// Named as a program output.
    pub is_output: bool,
    /// Written to a Param or State at the end of the run.
    pub is_written: bool,
}

/// The planner's view of a graph.
pub(crate) struct Program<'g> {
    pub inputs: Vec<InputInfo<'g>>,
    pub ops: Vec<OpInfo<'g>>,
    pub values: Vec<ValueInfo<'g>>,
    /// Named outputs, in the graph's order.
    pub outputs: Vec<(&'g str, Value)>,
    /// Writes of persistent inputs, in the graph's order.
    pub writes: Vec<(&'g str, Value)>,
    /// An op every later op (in node order) runs after, in every schedule: where a train
    /// step's backward begins, so its recomputations stay in it (`budget.rs`).
    pub barrier: Option<usize>,
}

impl<'g> Program<'g> {
    /// With every op after `node`'s (in node order) scheduled after it.
    pub fn with_barrier(mut self, node: Option<kiln_ir::graph::NodeIndex>) -> Self {
        self.barrier = node.and_then(|n| self.ops.iter().position(|o| o.node == n.index()));
        self
    }

    /// Whether `op` must wait for the barrier op.
    pub fn behind_barrier(&self, op: usize) -> bool {
        self.barrier.is_some_and(|b| op > b)
    }

    /// Each op's scratch as `workspaces` states it (until called, no op has any).
    pub fn with_workspaces(mut self, workspaces: &dyn WorkspaceNeeds) -> Self {
        for info in &mut self.ops {
            info.workspace_bytes = workspaces.workspace_bytes(info.op, &info.operand_types);
        }
        self
    }

    /// Builds the view; `graph` must have passed `kiln_ir::verify`, but nothing here panics if
    /// it did not: a broken reference is an error naming it.
    pub fn new(graph: &'g Graph) -> Result<Self> {
        let bound = graph
            .node_indices()
            .map(|n| n.index() + 1)
            .max()
            .unwrap_or(0);
        // First value number of each node (by node index), or None for vacant slots.
        let mut first_value: Vec<Option<Value>> = vec![None; bound];
        let mut values = Vec::new();
        let mut inputs = Vec::new();
        let mut ops = Vec::new();
        for node in graph.node_indices() {
            let Some(Node { kind, outputs }) = graph.node(node) else {
                continue;
            };
            first_value[node.index()] = Some(values.len());
            let producer_of = |port| match kind {
                NodeKind::Input { .. } => Producer::Input(inputs.len()),
                NodeKind::Op(_) => Producer::Op {
                    op: ops.len(),
                    port,
                },
            };
            let results: Vec<Value> = (values.len()..values.len() + outputs.len()).collect();
            for (port, ty) in outputs.iter().enumerate() {
                values.push(ValueInfo {
                    id: ValueId { node, port },
                    ty,
                    producer: producer_of(port),
                    readers: Vec::new(),
                    is_output: false,
                    is_written: false,
                });
            }
            match kind {
                NodeKind::Input { name, kind } => {
                    let value = *results.first().ok_or_else(|| Error::Unplannable {
                        rule: "inputs",
                        detail: format!("input `{name}` (node {}) has no value", node.index()),
                    })?;
                    inputs.push(InputInfo {
                        name,
                        kind: *kind,
                        value,
                    });
                }
                NodeKind::Op(op) => ops.push(OpInfo {
                    node: node.index(),
                    handle: ValueId { node, port: 0 },
                    op,
                    operands: Vec::new(),
                    operand_types: Vec::new(),
                    workspace_bytes: 0,
                    results,
                }),
            }
        }
        for (index, info) in ops.iter_mut().enumerate() {
            for (port, operand) in graph.operands(info.handle.node).into_iter().enumerate() {
                let what = || format!("operand {port} of node {}", info.node);
                let value = number(&first_value, &values, operand, what)?;
                if matches!(values[value].producer, Producer::Op { op, .. } if op >= index) {
                    return Err(Error::Unplannable {
                        rule: "order",
                        detail: format!(
                            "node {} reads {operand}, which is not computed before it",
                            info.node
                        ),
                    });
                }
                values[value].readers.push((index, port));
                info.operands.push(value);
                info.operand_types.push(values[value].ty.clone());
            }
        }
        let mut outputs = Vec::new();
        for (name, value) in graph.outputs() {
            let value = number(&first_value, &values, *value, || format!("output `{name}`"))?;
            values[value].is_output = true;
            outputs.push((name.as_str(), value));
        }
        let mut writes = Vec::new();
        for (name, value) in graph.writes() {
            let value = number(&first_value, &values, *value, || {
                format!("write of `{name}`")
            })?;
            values[value].is_written = true;
            writes.push((name.as_str(), value));
        }
        Ok(Program {
            inputs,
            ops,
            values,
            outputs,
            writes,
            barrier: None,
        })
    }

    /// Whether the value's storage must survive the run outside the arena.
    pub fn is_external(&self, value: Value) -> bool {
        self.values[value].is_output || self.values[value].is_written
    }

    /// Bytes of a value when contiguous.
    pub fn value_bytes(&self, value: Value) -> u64 {
        bytes(self.values[value].ty.size_bytes())
    }

    /// The op that writes `value`, if an op does.
    pub fn producing_op(&self, value: Value) -> Option<usize> {
        match self.values[value].producer {
            Producer::Op { op, .. } => Some(op),
            Producer::Input(_) => None,
        }
    }
}

/// The dense number of `v`, or an error naming `what` refers to it.
fn number(
    first_value: &[Option<Value>],
    values: &[ValueInfo<'_>],
    v: ValueId,
    what: impl Fn() -> String,
) -> Result<Value> {
    first_value
        .get(v.node.index())
        .copied()
        .flatten()
        .map(|first| first + v.port)
        .filter(|&n| values.get(n).is_some_and(|info| info.id == v))
        .ok_or_else(|| Error::Unplannable {
            rule: "values",
            detail: format!("{} names {v}, which does not exist", what()),
        })
}

/// `usize` byte counts as `u64` (lossless on every platform Rust supports that has <= 64-bit
/// pointers).
pub(crate) fn bytes(n: usize) -> u64 {
    n as u64
}
