//! The program graph: a petgraph `StableDiGraph` whose nodes are graph inputs or ops and whose
//! edges carry (output port → input port).
//!
//! Invariants kept by the builder methods (and checked independently by the verifier):
//! 1. Every value has a type; an op node's result types are its type rule applied to its
//!    operands (checked on insertion).
//! 2. Each input port of an op is connected exactly once; an op is added after its operands, so
//!    node index order is a topological order (and the order ops were traced in).
//! 3. Inputs have kinds: `Param` (weights), `Input` (per-run data), `State` (persists across
//!    runs). Names of inputs, of outputs and of writes are unique.
//! 4. A write gives a persistent input (Param or State) its new value at the end of a run; each
//!    is written at most once, with its own type.
//! 5. Value names (`layers.0.attn.out`) are unique labels on values the model code marks for
//!    people and tools (tracing, memory attribution). They are metadata: no op reads them, the
//!    printer does not show them, and a program computes the same with or without them.

pub use petgraph::stable_graph::NodeIndex;
use petgraph::stable_graph::StableDiGraph;
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::fmt;

use crate::{Error, Op, Result, TensorType};

/// What a graph input holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InputKind {
    /// Weights: live as long as the model, updated only by training.
    Param,
    /// Per-run data (token ids, positions, targets, the optimizer step).
    Input,
    /// Persists across runs (KV cache, optimizer moments).
    State,
}

impl InputKind {
    pub fn name(self) -> &'static str {
        match self {
            InputKind::Param => "param",
            InputKind::Input => "input",
            InputKind::State => "state",
        }
    }

    /// Whether values of this kind outlive a run (and so may be written).
    pub fn is_persistent(self) -> bool {
        matches!(self, InputKind::Param | InputKind::State)
    }
}

/// One result of a node: the node and its output port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId {
    pub node: NodeIndex,
    pub port: usize,
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}.{}", self.node.index(), self.port)
    }
}

/// What a node is.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeKind {
    Input { name: String, kind: InputKind },
    Op(Op),
}

/// A node and the types of its results.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub outputs: Vec<TensorType>,
}

/// An edge: result `from_port` of the source feeds operand `to_port` of the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Edge {
    pub from_port: usize,
    pub to_port: usize,
}

/// A typed program.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    name: String,
    graph: StableDiGraph<Node, Edge>,
    outputs: Vec<(String, ValueId)>,
    writes: Vec<(String, ValueId)>,
    /// Value names (invariant 5), in the order they were given.
    value_names: Vec<(String, ValueId)>,
    /// (state, param): state inputs that hold their param cast to their dtype, kept so by
    /// whoever sets the param (see [`Graph::derive`]).
    derived: Vec<(String, String)>,
}

impl Graph {
    /// An empty program called `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            ..Graph::default()
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a graph input.
    pub fn input(&mut self, name: &str, kind: InputKind, ty: TensorType) -> Result<ValueId> {
        if self.input_named(name).is_some() {
            return Err(Error::DuplicateName {
                what: "input",
                name: name.to_string(),
            });
        }
        let node = self.graph.add_node(Node {
            kind: NodeKind::Input {
                name: name.to_string(),
                kind,
            },
            outputs: vec![ty],
        });
        Ok(ValueId { node, port: 0 })
    }

    /// Adds an op over `operands` after checking its type rule; returns its results.
    pub fn op(&mut self, op: Op, operands: &[ValueId]) -> Result<Vec<ValueId>> {
        let types = operands
            .iter()
            .map(|&v| self.value_type(v).cloned())
            .collect::<Result<Vec<_>>>()?;
        let outputs = op.infer(&types)?;
        let count = outputs.len();
        let node = self.graph.add_node(Node {
            kind: NodeKind::Op(op),
            outputs,
        });
        for (to_port, operand) in operands.iter().enumerate() {
            self.graph.add_edge(
                operand.node,
                node,
                Edge {
                    from_port: operand.port,
                    to_port,
                },
            );
        }
        Ok((0..count).map(|port| ValueId { node, port }).collect())
    }

    /// Like [`Graph::op`] for an op with exactly one result.
    pub fn op1(&mut self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        let results = self.op(op, operands)?;
        Ok(results[0])
    }

    /// Names `value` as a program output.
    pub fn output(&mut self, name: &str, value: ValueId) -> Result<()> {
        self.value_type(value)?;
        if self.outputs.iter().any(|(n, _)| n == name) {
            return Err(Error::DuplicateName {
                what: "output",
                name: name.to_string(),
            });
        }
        self.outputs.push((name.to_string(), value));
        Ok(())
    }

    /// Makes `value` the new content of the persistent input `name` after a run.
    pub fn write(&mut self, name: &str, value: ValueId) -> Result<()> {
        let invalid = |detail: String| Error::Invalid {
            rule: "writes",
            detail,
        };
        let target = self
            .input_named(name)
            .ok_or_else(|| invalid(format!("no input named `{name}`")))?;
        let (kind, target_type) = match &self.graph[target.node] {
            Node {
                kind: NodeKind::Input { kind, .. },
                outputs,
            } => (*kind, outputs[0].clone()),
            _ => unreachable!("input_named returns input nodes"),
        };
        if !kind.is_persistent() {
            return Err(invalid(format!(
                "`{name}` is an {}; only params and states are written",
                kind.name()
            )));
        }
        let value_type = self.value_type(value)?;
        if *value_type != target_type {
            return Err(invalid(format!(
                "`{name}` is {target_type}, the value is {value_type}"
            )));
        }
        if self.writes.iter().any(|(n, _)| n == name) {
            return Err(invalid(format!("`{name}` is written twice")));
        }
        self.writes.push((name.to_string(), value));
        Ok(())
    }

    /// Declares that state input `state` holds param input `from` cast to the state's dtype:
    /// executables and the interpreter set it whenever `from` is set (nobody sets it
    /// directly), and the program keeps it so (the verifier checks that a write of `from`
    /// comes with a write of `state` casting it). Persistent bf16 copies of f32 weights: one
    /// cast per update instead of one per use.
    pub fn derive(&mut self, state: &str, from: &str) -> Result<()> {
        let invalid = |detail: String| Error::Invalid {
            rule: "derived states",
            detail,
        };
        let kind_and_type = |name: &str| {
            let value = self
                .input_named(name)
                .ok_or_else(|| invalid(format!("no input named `{name}`")))?;
            match &self.graph[value.node] {
                Node {
                    kind: NodeKind::Input { kind, .. },
                    outputs,
                } => Ok((*kind, outputs[0].clone())),
                _ => unreachable!("input_named returns input nodes"),
            }
        };
        let (state_kind, state_type) = kind_and_type(state)?;
        let (from_kind, from_type) = kind_and_type(from)?;
        if state_kind != InputKind::State || from_kind != InputKind::Param {
            return Err(invalid(format!(
                "`{state}` ({}) must be a state and `{from}` ({}) a param",
                state_kind.name(),
                from_kind.name()
            )));
        }
        if state_type.dims() != from_type.dims() {
            return Err(invalid(format!(
                "`{state}` is {state_type}, its param `{from}` {from_type}"
            )));
        }
        if self.derived.iter().any(|(s, _)| s == state) {
            return Err(invalid(format!("`{state}` is derived twice")));
        }
        self.derived.push((state.to_string(), from.to_string()));
        Ok(())
    }

    /// The derived states, (state, param), in the order they were declared.
    pub fn derived(&self) -> &[(String, String)] {
        &self.derived
    }

    /// Gives `value` the name `name` (invariant 5); a value may have several names.
    pub fn name_value(&mut self, name: &str, value: ValueId) -> Result<()> {
        self.value_type(value)?;
        if self.value_names.iter().any(|(n, _)| n == name) {
            return Err(Error::DuplicateName {
                what: "value name",
                name: name.to_string(),
            });
        }
        self.value_names.push((name.to_string(), value));
        Ok(())
    }

    /// Named values, in the order they were named (the order the model code ran).
    pub fn value_names(&self) -> &[(String, ValueId)] {
        &self.value_names
    }

    /// The type of a value, or an error if the graph has no such value.
    pub fn value_type(&self, value: ValueId) -> Result<&TensorType> {
        self.graph
            .node_weight(value.node)
            .and_then(|node| node.outputs.get(value.port))
            .ok_or_else(|| Error::NoSuchValue {
                value: value.to_string(),
            })
    }

    /// The input called `name`.
    pub fn input_named(&self, name: &str) -> Option<ValueId> {
        self.graph
            .node_indices()
            .find_map(|node| match &self.graph[node].kind {
                NodeKind::Input { name: n, .. } if n == name => Some(ValueId { node, port: 0 }),
                _ => None,
            })
    }

    /// Every input in node order: value, name, kind, type.
    pub fn inputs(&self) -> Vec<(ValueId, &str, InputKind, &TensorType)> {
        self.graph
            .node_indices()
            .filter_map(|node| match &self.graph[node] {
                Node {
                    kind: NodeKind::Input { name, kind },
                    outputs,
                } => Some((
                    ValueId { node, port: 0 },
                    name.as_str(),
                    *kind,
                    outputs.first()?,
                )),
                _ => None,
            })
            .collect()
    }

    /// Node indices in insertion order (a topological order, invariant 2).
    pub fn node_indices(&self) -> impl Iterator<Item = NodeIndex> + '_ {
        self.graph.node_indices()
    }

    /// The op nodes and their ops, in insertion order (inputs left out).
    pub fn ops(&self) -> impl Iterator<Item = (NodeIndex, &Op)> + '_ {
        (self.graph.node_indices()).filter_map(|node| match &self.graph[node].kind {
            NodeKind::Op(op) => Some((node, op)),
            NodeKind::Input { .. } => None,
        })
    }

    /// A node, if it exists.
    pub fn node(&self, node: NodeIndex) -> Option<&Node> {
        self.graph.node_weight(node)
    }

    /// The operands of `node`, ordered by input port.
    pub fn operands(&self, node: NodeIndex) -> Vec<ValueId> {
        let mut edges: Vec<(usize, ValueId)> = self
            .graph
            .edges_directed(node, Direction::Incoming)
            .map(|e| {
                (
                    e.weight().to_port,
                    ValueId {
                        node: e.source(),
                        port: e.weight().from_port,
                    },
                )
            })
            .collect();
        edges.sort();
        edges.into_iter().map(|(_, v)| v).collect()
    }

    /// Named program outputs, in the order they were added.
    pub fn outputs(&self) -> &[(String, ValueId)] {
        &self.outputs
    }

    /// Writes of persistent inputs, in the order they were added.
    pub fn writes(&self) -> &[(String, ValueId)] {
        &self.writes
    }

    /// The underlying petgraph graph.
    pub fn raw(&self) -> &StableDiGraph<Node, Edge> {
        &self.graph
    }

    /// Unchecked access for passes (and tests) that edit the graph directly; run the verifier
    /// afterwards, since nothing here keeps the invariants.
    pub fn raw_mut(&mut self) -> &mut StableDiGraph<Node, Edge> {
        &mut self.graph
    }

    /// Unchecked: appends an output or a write without any check (for verifier tests).
    pub fn push_unchecked(
        &mut self,
        output: Option<(String, ValueId)>,
        write: Option<(String, ValueId)>,
    ) {
        self.outputs.extend(output);
        self.writes.extend(write);
    }
}
