//! The backward pass: reverse-mode accumulation over the recorded ops.
//!
//! 1. Walk from the root to every reachable op and count, per leaf, how many input edges of
//!    those ops point at it (a leaf used twice, or tied, has two).
//! 2. Visit the ops in descending id order — a reverse topological order, since an op is
//!    recorded after its inputs. Gradients of an op's outputs follow the accumulation rule:
//!    the first is assigned, later ones allocate an add; nothing is mutated.
//! 3. After an op has contributed to its inputs, each leaf edge it had is counted off; a leaf
//!    whose count reaches zero has its final gradient and its ready hooks fire.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use kiln_runtime::Tensor;

use super::leaf::add_fresh;
use super::var::{Node, Origin, Var};
use crate::error::{type_name, Error, Result};
use crate::launch::empty;

impl Var {
    /// Backward from a one-element value with seed 1.
    pub fn backward(&self) -> Result<()> {
        if self.value().numel() != 1 {
            return Err(Error::NotScalar {
                shape: self.shape().clone(),
            });
        }
        let seed = empty(self.shape().clone(), self.dtype());
        seed.fill(1.0)?;
        self.backward_with(seed)
    }

    /// Backward with an explicit seed gradient of the value's shape and dtype.
    pub fn backward_with(&self, seed: Tensor) -> Result<()> {
        if seed.shape() != self.shape() || seed.dtype() != self.dtype() {
            return Err(Error::Seed {
                expected: type_name(self.dtype(), self.shape()),
                got: type_name(seed.dtype(), seed.shape()),
            });
        }
        match &self.0.origin {
            Origin::Constant => Err(Error::NoGradient),
            Origin::Leaf(_) => {
                self.accumulate(seed)?;
                self.fire_grad_ready()
            }
            Origin::Output { node, index } => run(node, *index, seed),
        }
    }
}

/// A leaf reached by the pass: the Var, its input edges still to be visited, and whether any
/// gradient reached it in this pass (hooks fire only then).
struct LeafEdges {
    leaf: Var,
    pending: usize,
    contributed: bool,
}

/// Per reachable op its node; per reached leaf (by id) its edges.
struct Reach {
    nodes: BTreeMap<u64, Rc<Node>>,
    leaves: BTreeMap<u64, LeafEdges>,
}

fn reach(root: &Rc<Node>) -> Reach {
    let mut found = Reach {
        nodes: BTreeMap::new(),
        leaves: BTreeMap::new(),
    };
    let mut stack = vec![root.clone()];
    found.nodes.insert(root.id, root.clone());
    while let Some(node) = stack.pop() {
        for input in &node.inputs {
            match &input.0.origin {
                Origin::Constant => {}
                Origin::Leaf(_) => {
                    let edges = found.leaves.entry(input.id()).or_insert(LeafEdges {
                        leaf: input.clone(),
                        pending: 0,
                        contributed: false,
                    });
                    edges.pending += 1;
                }
                Origin::Output { node: producer, .. } => {
                    if let std::collections::btree_map::Entry::Vacant(slot) =
                        found.nodes.entry(producer.id)
                    {
                        slot.insert(producer.clone());
                        stack.push(producer.clone());
                    }
                }
            }
        }
    }
    found
}

fn run(root: &Rc<Node>, index: usize, seed: Tensor) -> Result<()> {
    let Reach { nodes, mut leaves } = reach(root);
    // Gradients of op outputs, per node id and output index.
    let mut pending: HashMap<u64, Vec<Option<Tensor>>> = HashMap::new();
    pending.insert(root.id, {
        let mut grads = vec![None; root.outputs.len()];
        grads[index] = Some(seed);
        grads
    });
    for node in nodes.values().rev() {
        let input_grads = match pending.remove(&node.id) {
            Some(grads) => {
                let input_grads = (node.backward)(&grads)?;
                check_input_grads(node, &input_grads)?;
                input_grads
            }
            // No gradient reached this op (e.g. its outputs were unused): nothing flows.
            None => vec![None; node.inputs.len()],
        };
        for (input, grad) in node.inputs.iter().zip(input_grads) {
            let Some(grad) = grad else { continue };
            match &input.0.origin {
                Origin::Constant => {}
                Origin::Leaf(_) => {
                    input.accumulate(grad)?;
                    if let Some(edges) = leaves.get_mut(&input.id()) {
                        edges.contributed = true;
                    }
                }
                Origin::Output {
                    node: producer,
                    index,
                } => {
                    let slots = pending
                        .entry(producer.id)
                        .or_insert_with(|| vec![None; producer.outputs.len()]);
                    slots[*index] = Some(match slots[*index].take() {
                        None => grad,
                        Some(previous) => add_fresh(&previous, &grad)?,
                    });
                }
            }
        }
        for input in node.inputs.iter().filter(|v| v.is_leaf()) {
            if let Some(edges) = leaves.get_mut(&input.id()) {
                edges.pending -= 1;
                if edges.pending == 0 && edges.contributed {
                    edges.leaf.fire_grad_ready()?;
                }
            }
        }
    }
    Ok(())
}

/// A VJP must return one gradient per input, each of its input's shape and dtype.
fn check_input_grads(node: &Node, grads: &[Option<Tensor>]) -> Result<()> {
    if grads.len() != node.inputs.len() {
        return Err(Error::Operand {
            op: node.op,
            reason: format!(
                "backward returned {} gradients for {} inputs",
                grads.len(),
                node.inputs.len()
            ),
        });
    }
    for (input_index, (input, grad)) in node.inputs.iter().zip(grads).enumerate() {
        if let Some(grad) = grad {
            if grad.shape() != input.shape() || grad.dtype() != input.dtype() {
                return Err(Error::GradientMismatch {
                    op: node.op,
                    input: input_index,
                    expected: type_name(input.dtype(), input.shape()),
                    got: type_name(grad.dtype(), grad.shape()),
                });
            }
        }
    }
    Ok(())
}
