//! Index inputs checked where they enter: a token id, target or position handed to an
//! executable's `set` must lie in the range every op reading it accepts ([`Op::index_range`],
//! the reference kernels' contract), so the CPU and the GPU refuse the same inputs with the
//! same error before anything runs. Reshapes and transposes are followed: they pass the same
//! elements on.

use std::collections::BTreeMap;

use kiln_ir::graph::NodeKind;
use kiln_ir::{DType, Graph, IndexRange, Op, TensorType, ValueId};

use crate::error::{Error, Result};
use crate::group::GroupMemory;
use crate::tensor::Tensor;

/// For each integer graph input, the ranges its readers accept: (reader's op text, range).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct IndexRules(BTreeMap<String, Vec<(String, IndexRange)>>);

/// The index rules of `graph`'s inputs.
pub(crate) fn index_rules(graph: &Graph) -> IndexRules {
    let mut rules = BTreeMap::new();
    for (value, name, _, ty) in graph.inputs() {
        if !matches!(ty.dtype, DType::I32 | DType::I64) {
            continue;
        }
        let mut found = Vec::new();
        readers(graph, value, &mut found);
        if !found.is_empty() {
            rules.insert(name.to_string(), found);
        }
    }
    IndexRules(rules)
}

/// The index rules of each program of a group: its own, and for every input the group shares,
/// those of every other program that reads it too (a value set through one member is what
/// every member reads), each reader named with its program.
pub(crate) fn group_index_rules(graphs: &[&Graph], memory: &GroupMemory) -> Vec<IndexRules> {
    let own: Vec<IndexRules> = graphs.iter().map(|graph| index_rules(graph)).collect();
    let mut rules = own.clone();
    for (index, member) in rules.iter_mut().enumerate() {
        for shared in &memory.shared_inputs {
            if graphs[index].input_named(&shared.name).is_none() {
                continue;
            }
            for (other, (graph, theirs)) in graphs.iter().zip(&own).enumerate() {
                let Some(found) = theirs.0.get(&shared.name).filter(|_| other != index) else {
                    continue;
                };
                let named = (found.iter())
                    .map(|(reader, range)| (format!("{reader} of `{}`", graph.name()), *range));
                member
                    .0
                    .entry(shared.name.clone())
                    .or_default()
                    .extend(named);
            }
        }
    }
    rules
}

/// Collects the index ranges of every op that reads `value`, through reshapes and transposes.
fn readers(graph: &Graph, value: ValueId, found: &mut Vec<(String, IndexRange)>) {
    for node in graph.node_indices() {
        let Some(NodeKind::Op(op)) = graph.node(node).map(|n| &n.kind) else {
            continue;
        };
        let operands = graph.operands(node);
        for (port, _) in operands.iter().enumerate().filter(|(_, v)| **v == value) {
            if matches!(op, Op::Reshape { .. } | Op::Transpose { .. }) {
                readers(graph, ValueId { node, port: 0 }, found);
                continue;
            }
            let types: Option<Vec<TensorType>> = (operands.iter())
                .map(|v| graph.value_type(*v).ok().cloned())
                .collect();
            if let Some(range) = types.and_then(|types| op.index_range(port, &types)) {
                found.push((format!("{op} %{}", node.index()), range));
            }
        }
    }
}

impl IndexRules {
    /// Whether input `name` has rules (its values are indices some op reads).
    pub fn covers(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    /// Checks every element of `tensor`, bound to input `name`, against the input's rules:
    /// the first element outside one of them is [`Error::InputIndex`].
    pub fn check(&self, name: &str, tensor: &Tensor) -> Result<()> {
        let Some(rules) = self.0.get(name) else {
            return Ok(());
        };
        let values = integers(tensor)?;
        for (reader, range) in rules {
            if let Some((at, &value)) = values
                .iter()
                .enumerate()
                .find(|(_, v)| !range.contains(**v))
            {
                let ignored = range
                    .ignored
                    .map(|i| format!(" or {i}"))
                    .unwrap_or_default();
                return Err(Error::InputIndex {
                    name: name.to_string(),
                    at,
                    value,
                    valid: format!("0..{}{ignored}", range.end),
                    reader: reader.clone(),
                });
            }
        }
        Ok(())
    }
}

/// The elements of an i32 or i64 tensor, row-major, as i64.
fn integers(tensor: &Tensor) -> Result<Vec<i64>> {
    let dense = tensor.contiguous()?;
    dense.read_with(|view| match view.dtype() {
        DType::I32 => Ok(view
            .slice::<i32>("set", "index input")?
            .iter()
            .map(|&v| i64::from(v))
            .collect()),
        _ => Ok(view.slice::<i64>("set", "index input")?.to_vec()),
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::InputKind;

    /// logits = embedding(weight [10,4], reshape(ids [2,3] -> [6])) and a loss over targets.
    fn graph() -> Graph {
        let mut graph = Graph::new("ids");
        let weight = (graph.input(
            "w",
            InputKind::Param,
            TensorType::new(DType::F32, [10, 4]).unwrap(),
        ))
        .unwrap();
        let ids = (graph.input(
            "ids",
            InputKind::Input,
            TensorType::new(DType::I64, [2, 3]).unwrap(),
        ))
        .unwrap();
        let targets = (graph.input(
            "targets",
            InputKind::Input,
            TensorType::new(DType::I64, [6]).unwrap(),
        ))
        .unwrap();
        let flat = graph
            .op1(Op::Reshape { shape: [6].into() }, &[ids])
            .unwrap();
        let rows = graph.op1(Op::Embedding, &[weight, flat]).unwrap();
        let loss = Op::CrossEntropy { ignore_index: -100 };
        let loss = graph.op1(loss, &[rows, targets]).unwrap();
        graph.output("loss", loss).unwrap();
        graph
    }

    #[test]
    fn ids_are_checked_through_a_reshape_and_ignored_targets_pass() {
        let rules = index_rules(&graph());
        let ids = |v: Vec<i64>| Tensor::from_vec(v, [2, 3]).unwrap();
        rules.check("ids", &ids(vec![0, 9, 3, 4, 5, 6])).unwrap();
        let err = rules
            .check("ids", &ids(vec![0, 9, 3, 10, 5, 6]))
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("`ids`") && text.contains("10 at element 3") && text.contains("0..10"),
            "{text}"
        );
        let targets = |v: Vec<i64>| Tensor::from_vec(v, [6]).unwrap();
        rules
            .check("targets", &targets(vec![0, -100, 3, 3, 2, 3]))
            .unwrap();
        let err = rules
            .check("targets", &targets(vec![0, -1, 3, 3, 2, 3]))
            .unwrap_err();
        assert!(err.to_string().contains("0..4 or -100"), "{err}");
        // Float inputs have no rule.
        rules
            .check("w", &Tensor::from_vec(vec![f32::NAN; 40], [10, 4]).unwrap())
            .unwrap();
    }
}
