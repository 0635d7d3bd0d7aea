//! kiln-ir: kiln's vocabulary and its typed IR.
//!
//! The vocabulary — element types ([`DType`]), static shapes ([`Shape`]), element layouts
//! ([`Layout`]: shape, strides and offset, with the view rules) and value types
//! ([`TensorType`]) — is shared by every crate; kernels use it and nothing more. Above it, the IR:
//! a closed set of [`Op`]s with type and alias rules, and the program [`Graph`] (a petgraph
//! `StableDiGraph` whose edges carry output port → input port), with its verifier, stable text
//! printer, reverse-mode autodiff, the fusion pass and recomputation (`recompute`).

pub mod autodiff;
mod dtype;
mod error;
pub mod fuse;
pub mod graph;
mod layout;
mod op;
pub mod print;
pub mod recompute;
mod shape;
mod types;
pub mod verify;

pub use autodiff::append_backward;
pub use dtype::DType;
pub use error::{Error, Result};
pub use fuse::fuse;
pub use graph::{Graph, InputKind, ValueId};
pub use layout::{Layout, LayoutError};
pub use op::{
    name_of_text, rope_kv, stores, AdamWConfig, Alias, EmbeddingRows, IndexRange, Op,
    LINEAR_MAX_GROUPS, LINEAR_MAX_ROWS, PADDING_SLOT, UNROUNDED_LINEAR_MAX_ROWS,
};
pub use print::print;
pub use shape::{Shape, Strides};
pub use types::TensorType;
pub use verify::verify;
