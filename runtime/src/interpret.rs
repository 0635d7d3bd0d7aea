//! The reference interpreter: runs a [`Graph`] op by op on the CPU reference kernels.
//!
//! It is the executable meaning of the IR, and it computes exactly what the eager oracle
//! computes: every op calls the same kernel with the same arguments (see `interpret/ops.rs`),
//! so the two agree bit for bit.
//!
//! Invariants:
//! 1. Every graph input is bound by name in `values` to a tensor of exactly its type (dtype
//!    and shape); a missing or mistyped binding is an error naming the input, before any op
//!    runs. Entries of `values` that name no input are ignored.
//! 2. Ops run in node index order, which the graph keeps topological; an operand defined by a
//!    node that is not lower is refused.
//! 3. Each op result is one fresh allocation that its kernel writes; views (reshape,
//!    transpose, slice) share their operand's storage, and contiguous copies only when needed.
//!    Nothing bound in `values` is ever written.
//! 4. After the last op, each write replaces `values[name]` with the written value's tensor
//!    (the old tensor is replaced, never mutated), and the named outputs are returned. An
//!    error anywhere leaves `values` as it was.
//!
//! Every value is kept until the end of the run: this interpreter is the reference, not the
//! memory planner.
//!
//! `all_reduce` ops reach the other ranks through a [`Communicator`] ([`interpret_in`]);
//! [`interpret`] runs a world of one rank ([`Solo`]), where they are the identity.

pub(crate) mod linear;
pub(crate) mod ops;
pub(crate) mod rope_kv;

use std::collections::BTreeMap;

use kiln_ir::graph::{Node, NodeKind};
use kiln_ir::{Graph, Op, TensorType, ValueId};

use crate::collective::{Communicator, Solo};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Runs `graph` on the inputs bound in `values` (by input name) and returns its named outputs;
/// applies the graph's writes to `values` (see the module doc).
pub fn interpret(
    graph: &Graph,
    values: &mut BTreeMap<String, Tensor>,
) -> Result<BTreeMap<String, Tensor>> {
    interpret_in(graph, values, &Solo)
}

/// [`interpret`] as one rank of `communicator`'s world: its `all_reduce` ops sum over the
/// ranks (each rank runs its own copy of the program, in its own thread).
pub fn interpret_in(
    graph: &Graph,
    values: &mut BTreeMap<String, Tensor>,
    communicator: &dyn Communicator,
) -> Result<BTreeMap<String, Tensor>> {
    let mut env = bind_inputs(graph, values)?;
    for node in graph.node_indices() {
        if let Some(Node {
            kind: NodeKind::Op(op),
            outputs: recorded,
        }) = graph.node(node)
        {
            let operands = graph.operands(node);
            let results = run_node(&env, node.index(), op, recorded, operands, communicator)?;
            env.results.insert(node.index(), results);
        }
    }

    let mut outputs = BTreeMap::new();
    for (name, value) in graph.outputs() {
        let tensor = env.get(*value, &|| format!("output `{name}`"))?;
        outputs.insert(name.clone(), tensor.clone());
    }
    let writes = graph
        .writes()
        .iter()
        .map(|(name, value)| checked_write(graph, &env, name, *value))
        .collect::<Result<Vec<_>>>()?;
    // Only now, with nothing left to fail, are the persistent values replaced.
    for (name, tensor) in writes {
        values.insert(name, tensor);
    }
    Ok(outputs)
}

/// An environment holding every graph input, bound by name from `values` (invariant 1).
fn bind_inputs(graph: &Graph, values: &BTreeMap<String, Tensor>) -> Result<Env> {
    let mut env = Env::default();
    for (value, tensor) in bound_inputs(graph, values)? {
        env.results.insert(value.node.index(), vec![tensor]);
    }
    Ok(env)
}

/// Every graph input with the tensor bound to its name in `values`, in node order, after
/// checking each binding (invariant 1). The planned executor binds its inputs through this too.
pub(crate) fn bound_inputs(
    graph: &Graph,
    values: &BTreeMap<String, Tensor>,
) -> Result<Vec<(ValueId, Tensor)>> {
    let mut bound = Vec::new();
    for (value, name, _, expected) in graph.inputs() {
        // A derived state is its param's cast, whatever `values` holds under its name (the
        // param is an earlier input: a missing one is reported there).
        let param = (graph.derived().iter()).find(|(state, _)| state == name);
        let source = param.map_or(name, |(_, from)| from.as_str());
        let tensor = values.get(source).ok_or_else(|| Error::MissingInput {
            name: source.to_string(),
            expected: Box::new(expected.clone()),
        })?;
        let cast;
        let tensor = match param {
            Some(_) => {
                cast = tensor.cast_to(expected.dtype)?;
                &cast
            }
            None => tensor,
        };
        let found = type_of(tensor);
        if found != *expected {
            return Err(Error::InputType {
                name: name.to_string(),
                expected: Box::new(expected.clone()),
                found: Box::new(found),
            });
        }
        bound.push((value, tensor.clone()));
    }
    Ok(bound)
}

/// Runs op node `index` on `operands` (ordered by port) and returns its results.
fn run_node(
    env: &Env,
    index: usize,
    op: &Op,
    recorded: &[TensorType],
    operands: Vec<ValueId>,
    communicator: &dyn Communicator,
) -> Result<Vec<Tensor>> {
    let what = || format!("node %{index} ({op})");
    let mut tensors = Vec::with_capacity(operands.len());
    for (port, operand) in operands.into_iter().enumerate() {
        if operand.node.index() >= index {
            return Err(Error::Graph {
                what: what(),
                reason: format!(
                    "operand {port} is {operand}, which is not defined before this node; node \
                     order must be topological"
                ),
            });
        }
        tensors.push(env.get(operand, &what)?.clone());
    }
    let operand_types: Vec<TensorType> = tensors.iter().map(type_of).collect();
    let types = result_types(index, op, &operand_types, recorded)?;
    let results = match op {
        Op::AllReduce => communicator.all_reduce(&tensors),
        _ => ops::run(op, &tensors, &types),
    };
    results.map_err(|source| Error::Node {
        node: index,
        op: op.to_string(),
        source: Box::new(source),
    })
}

/// The result types of op node `index` for operands of `operand_types`, checked against the
/// types the graph `recorded`. Re-deriving them from the operands means that a graph edited by
/// hand cannot make a kernel see operands its type rule refuses.
pub(crate) fn result_types(
    index: usize,
    op: &Op,
    operand_types: &[TensorType],
    recorded: &[TensorType],
) -> Result<Vec<TensorType>> {
    let types = op.infer(operand_types).map_err(|e| Error::Node {
        node: index,
        op: op.to_string(),
        source: Box::new(e.into()),
    })?;
    if types != recorded {
        return Err(Error::Graph {
            what: format!("node %{index} ({op})"),
            reason: format!(
                "its operands give results {}, but the graph records {}",
                list(&types),
                list(recorded)
            ),
        });
    }
    Ok(types)
}

/// The results of every node run so far (inputs bound, ops executed), by node.
#[derive(Default)]
struct Env {
    results: BTreeMap<usize, Vec<Tensor>>,
}

impl Env {
    /// The tensor of `value`, or an error naming `what` asked for it.
    fn get(&self, value: ValueId, what: &dyn Fn() -> String) -> Result<&Tensor> {
        self.results
            .get(&value.node.index())
            .and_then(|results| results.get(value.port))
            .ok_or_else(|| Error::Graph {
                what: what(),
                reason: format!("value {value} has not been computed"),
            })
    }
}

/// The dtype and shape of a tensor, as the IR types it.
pub(crate) fn type_of(tensor: &Tensor) -> TensorType {
    // Unchecked: the tensor's storage already holds its elements, so the type is within the
    // limits `TensorType::new` checks.
    TensorType {
        dtype: tensor.dtype(),
        shape: tensor.shape().clone(),
    }
}

fn list(types: &[TensorType]) -> String {
    let names: Vec<String> = types.iter().map(TensorType::to_string).collect();
    format!("({})", names.join(", "))
}

/// The tensor written to persistent input `name`, after checking the write fits it.
fn checked_write(graph: &Graph, env: &Env, name: &str, value: ValueId) -> Result<(String, Tensor)> {
    let tensor = env.get(value, &|| format!("write `{name}`"))?;
    check_write(graph, name, value, &type_of(tensor))?;
    Ok((name.to_string(), tensor.clone()))
}

/// Checks that the value `value`, of type `found`, may be written to input `name`: a param or
/// state of exactly that type.
pub(crate) fn check_write(
    graph: &Graph,
    name: &str,
    value: ValueId,
    found: &TensorType,
) -> Result<()> {
    let what = || format!("write `{name}`");
    let target = graph
        .inputs()
        .into_iter()
        .find(|(_, input, _, _)| *input == name)
        .ok_or_else(|| Error::Graph {
            what: what(),
            reason: "the graph has no input of that name".to_string(),
        })?;
    let (_, _, kind, expected) = target;
    if !kind.is_persistent() || found != expected {
        return Err(Error::Graph {
            what: what(),
            reason: format!(
                "a {} {expected} cannot be given the value {value} of type {found}",
                kind.name()
            ),
        });
    }
    Ok(())
}
