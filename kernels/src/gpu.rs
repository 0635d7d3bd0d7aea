//! GPU kernels as data: the CUDA C sources under `kernels/cuda/` (compiled at run time by NVRTC,
//! in a subset that hipRTC also accepts) and [`Launch`] descriptors that say which kernel runs
//! with which arguments, grid and block.
//!
//! Nothing here touches a device: a backend (kiln-runtime's CUDA backend) compiles
//! [`SOURCES`], resolves every [`Addr`] to a device address and issues the launches. Builders
//! (one per kernel, in the submodules) validate sizes and return launches, so which argument
//! goes where is written once, next to the source it must match.
//!
//! Conventions shared by every kernel source: pointers are passed as 64-bit device addresses;
//! sizes and indices as 64-bit signed integers (`long long`); float attributes as `float`
//! (`double` where the CPU reference computes in f64); tensors are row-major and contiguous
//! unless a builder takes strides.

mod launch;

pub use launch::{Addr, Arg, Gemm, GemmDType, Kernel, Launch};

/// Every kernel source: (module name, CUDA C text). A module's kernels are `extern "C"`.
pub const SOURCES: &[(&str, &str)] = &[];
