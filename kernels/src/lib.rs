//! kiln-kernels: the operator seam and the CPU reference kernels.
//!
//! Kernels read [`TensorView`]s and write caller-owned [`TensorViewMut`]s (and caller-owned
//! workspaces); they never allocate and never decide ownership. Every kernel validates dtypes,
//! shapes and layouts and returns an [`Error`] that names the op and the operand. Reductions run
//! in a fixed order, so the same inputs give the same bits on every run.
//!
//! This crate uses only `DType` and `Shape` from kiln-ir, never the graph. GPU kernel sources
//! and vendor GEMM bindings will live here too.

mod buffer;
mod element;
mod error;
mod indices;
mod view;

pub mod activation;
pub mod attention;
pub mod cache;
pub mod copy;
pub mod elementwise;
pub mod embedding;
pub mod gpu;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod optim;
pub mod rope;
#[cfg(feature = "testing")]
pub mod testing;

pub use buffer::Buffer;
pub use element::{Element, Real};
pub use error::{expect_rank, expect_shape, Error, Result};
pub use view::{Data, DataMut, TensorView, TensorViewMut};
