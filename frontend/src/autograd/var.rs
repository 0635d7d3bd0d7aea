//! `Var`: a tensor that remembers how it was produced.
//!
//! A Var is one of three things:
//! - a **leaf** (a parameter): it requires a gradient and accumulates one (see `leaf.rs`);
//! - a **constant** (token ids, or anything computed only from constants): no gradient;
//! - an **output** of a recorded op: it points at the op's [`Node`], which keeps the op's
//!   inputs and its backward function (a VJP).
//!
//! Ids count up in creation order, and an op is recorded after its inputs exist, so sorting
//! nodes by descending id is a reverse topological order: the backward pass needs no other
//! bookkeeping to be deterministic.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use kiln_ir::{DType, Shape};
use kiln_runtime::Tensor;

use super::leaf::LeafGrad;
use crate::error::{Error, Result};

thread_local! {
    static NEXT_ID: Cell<u64> = const { Cell::new(0) };
}

fn next_id() -> u64 {
    NEXT_ID.with(|next| {
        let id = next.get();
        next.set(id + 1);
        id
    })
}

/// The VJP of an op: gradients of its outputs in (`None` for an output no gradient reached;
/// at least one is present), gradients of its inputs out (`None` for an input that gets no
/// gradient, e.g. one that does not require it).
pub(crate) type BackwardFn = Box<dyn Fn(&[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>>;

/// A recorded op: its inputs, the types of its outputs and its VJP.
pub(crate) struct Node {
    pub(crate) id: u64,
    pub(crate) op: &'static str,
    pub(crate) inputs: Vec<Var>,
    pub(crate) outputs: Vec<(Shape, DType)>,
    pub(crate) backward: BackwardFn,
}

pub(crate) enum Origin {
    Constant,
    Leaf(RefCell<LeafGrad>),
    Output { node: Rc<Node>, index: usize },
}

pub(crate) struct VarInner {
    pub(crate) id: u64,
    pub(crate) value: Tensor,
    pub(crate) origin: Origin,
}

/// A tensor in the eager oracle, with the record of its producer.
#[derive(Clone)]
pub struct Var(pub(crate) Rc<VarInner>);

impl Var {
    /// A leaf that requires a gradient (a parameter). Only float tensors can be leaves.
    pub fn leaf(value: Tensor) -> Result<Var> {
        if !value.dtype().is_float() {
            return Err(Error::NotDifferentiable {
                dtype: value.dtype(),
            });
        }
        Ok(Self::with_origin(
            value,
            Origin::Leaf(RefCell::new(LeafGrad::default())),
        ))
    }

    /// A value that never gets a gradient (inputs such as token ids).
    pub fn constant(value: Tensor) -> Var {
        Self::with_origin(value, Origin::Constant)
    }

    fn with_origin(value: Tensor, origin: Origin) -> Var {
        Var(Rc::new(VarInner {
            id: next_id(),
            value,
            origin,
        }))
    }

    /// Records an op: `outputs` were computed from `inputs`, and `backward` is their VJP. When no
    /// input requires a gradient nothing is recorded and the outputs are constants.
    pub(crate) fn record(
        op: &'static str,
        inputs: &[&Var],
        outputs: Vec<Tensor>,
        backward: impl Fn(&[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> + 'static,
    ) -> Vec<Var> {
        if !inputs.iter().any(|v| v.requires_grad()) {
            return outputs.into_iter().map(Var::constant).collect();
        }
        let node = Rc::new(Node {
            id: next_id(),
            op,
            inputs: inputs.iter().map(|&v| v.clone()).collect(),
            outputs: outputs
                .iter()
                .map(|t| (t.shape().clone(), t.dtype()))
                .collect(),
            backward: Box::new(backward),
        });
        outputs
            .into_iter()
            .enumerate()
            .map(|(index, value)| {
                Self::with_origin(
                    value,
                    Origin::Output {
                        node: node.clone(),
                        index,
                    },
                )
            })
            .collect()
    }

    /// Like [`Var::record`] for an op with one output.
    pub(crate) fn record_one(
        op: &'static str,
        inputs: &[&Var],
        output: Tensor,
        backward: impl Fn(&Tensor) -> Result<Vec<Option<Tensor>>> + 'static,
    ) -> Var {
        let mut out = Self::record(op, inputs, vec![output], move |grads| match &grads[0] {
            Some(grad) => backward(grad),
            // The engine calls a VJP only when some output has a gradient.
            None => Ok(vec![None; grads.len()]),
        });
        out.remove(0)
    }

    /// The tensor this Var holds.
    pub fn value(&self) -> &Tensor {
        &self.0.value
    }
    pub fn shape(&self) -> &Shape {
        self.0.value.shape()
    }
    pub fn dims(&self) -> &[usize] {
        self.0.value.dims()
    }
    pub fn dtype(&self) -> DType {
        self.0.value.dtype()
    }
    /// Creation-order id (unique within a thread).
    pub fn id(&self) -> u64 {
        self.0.id
    }
    pub fn is_leaf(&self) -> bool {
        matches!(self.0.origin, Origin::Leaf(_))
    }
    /// Whether a gradient flows to this value: it is a leaf or computed from one.
    pub fn requires_grad(&self) -> bool {
        !matches!(self.0.origin, Origin::Constant)
    }
    /// The op that produced this value, `"leaf"` or `"constant"`.
    pub fn producer(&self) -> &'static str {
        match &self.0.origin {
            Origin::Constant => "constant",
            Origin::Leaf(_) => "leaf",
            Origin::Output { node, .. } => node.op,
        }
    }
    /// Same Var (not just equal values).
    pub fn same(&self, other: &Var) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for Var {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Var#{}({} {} from {})",
            self.id(),
            self.dtype(),
            self.shape(),
            self.producer()
        )
    }
}
