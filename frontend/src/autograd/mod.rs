//! Tape autograd for the eager oracle: values that record their producers ([`Var`]), the
//! backward pass, and leaf gradients with bound buffers and ready hooks.

mod engine;
mod leaf;
mod var;

pub use leaf::GradHook;
pub use var::Var;
