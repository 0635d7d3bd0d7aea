//! Derived states ([`Graph::derive`]): a state that holds a param cast to its own dtype (the
//! persistent bf16 copies a mixed-precision train step reads instead of casting each weight at
//! each use). Whoever sets the param sets its copies; nobody sets a copy directly. The program
//! itself keeps them derived across runs (its update writes both).

use kiln_ir::{DType, Graph};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The derived states of one program: (state, param, the state's dtype).
#[derive(Clone, Debug, Default)]
pub(crate) struct Derived(Vec<(String, String, DType)>);

impl Derived {
    pub(crate) fn of(graph: &Graph) -> Derived {
        let dtype = |name: &str| {
            let input = graph.inputs().into_iter().find(|(_, n, ..)| *n == name);
            input.map(|(.., ty)| ty.dtype)
        };
        Derived(
            (graph.derived().iter())
                .filter_map(|(state, from)| Some((state.clone(), from.clone(), dtype(state)?)))
                .collect(),
        )
    }

    /// Refuses to `what` (set, zero, copy into) a derived state directly.
    pub(crate) fn refuse_direct(&self, name: &str, what: &str) -> Result<()> {
        match self.0.iter().find(|(state, ..)| state == name) {
            Some((_, from, _)) => Err(Error::Graph {
                what: format!("{what} `{name}`"),
                reason: format!("it is derived from `{from}` (its cast), which sets it"),
            }),
            None => Ok(()),
        }
    }

    /// The (state, dtype) copies of param `name`.
    pub(crate) fn copies<'a>(&'a self, name: &'a str) -> impl Iterator<Item = (&'a str, DType)> {
        (self.0.iter())
            .filter(move |(_, from, _)| from == name)
            .map(|(state, _, dtype)| (state.as_str(), *dtype))
    }

    /// `tensor` (a value of param `name`) with each of its copies: (copy name, the cast).
    pub(crate) fn casts(&self, name: &str, tensor: &Tensor) -> Result<Vec<(String, Tensor)>> {
        self.copies(name)
            .map(|(state, dtype)| Ok((state.to_string(), tensor.cast_to(dtype)?)))
            .collect()
    }
}
