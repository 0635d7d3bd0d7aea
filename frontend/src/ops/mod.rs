//! Differentiable ops of the eager oracle. Each runs a CPU reference kernel forward and records
//! its VJP, which runs the backward kernels. Operands must be contiguous (views are explicit:
//! `reshape`, `transpose`, `contiguous`), like the kernels they call.

mod activation;
mod attention;
mod elementwise;
mod embedding;
mod loss;
mod matmul;
mod norm;
mod rope;
mod views;

pub use activation::{softmax, swiglu};
pub use attention::{attention, flash_attention};
pub use elementwise::{add, as_dtype, cast, mul, scale, sum};
pub use embedding::embedding;
pub use kiln_kernels::matmul::Transpose;
pub use loss::{cross_entropy, linear_cross_entropy};
pub use matmul::{linear, matmul};
pub use norm::{add_rmsnorm, rmsnorm};
pub use rope::rope;
pub use views::{contiguous, reshape, slice, transpose};
