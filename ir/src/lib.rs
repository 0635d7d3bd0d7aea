//! kiln-ir: the vocabulary every kiln crate speaks.
//!
//! Today it holds the element types ([`DType`]) and static shapes ([`Shape`]) that kernels,
//! runtime and frontend share. The typed IR graph (ops with type and alias rules, the verifier,
//! the stable text printer and reverse-mode autodiff) will live here too, above this vocabulary:
//! kernels may use `DType` and `Shape` but never the graph.

mod dtype;
mod error;
mod shape;

pub use dtype::DType;
pub use error::{Error, Result};
pub use shape::{Shape, Strides};
