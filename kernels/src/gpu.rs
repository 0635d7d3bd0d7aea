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

pub mod activation;
pub mod attention;
pub mod cache;
pub mod columns;
pub mod copy;
pub mod decode;
pub mod elementwise;
pub mod embedding;
pub mod flash;
pub mod gemm;
pub mod linear;
pub mod loss;
pub mod norm;
pub mod optim;
pub mod prefetch;
pub mod rope;

pub use launch::{
    all_aligned, grid_dim, grid_stride_blocks, size_arg, Addr, Arg, Forms, Gemm, GemmDType, Kernel,
    Launch, Stored, BLOCK_THREADS, MAX_CLUSTER_BLOCKS, MAX_GRID_X, MAX_GRID_YZ,
    MAX_PORTABLE_CLUSTER_BLOCKS, SLOT_ALIGN,
};

/// A module's text: the shared prelude (`common.cuh`: bf16 bits, fixed-order reductions)
/// followed by the module's own sources (headers it shares with other modules first).
macro_rules! module {
    ($($file:literal),+) => {
        concat!(
            include_str!("../cuda/common.cuh"),
            $("\n", include_str!(concat!("../cuda/", $file))),+
        )
    };
}

/// Every kernel source: (module name, CUDA C text). A module's kernels are `extern "C"`.
pub const SOURCES: &[(&str, &str)] = &[
    ("activation", module!("activation.cu")),
    ("attention_rows", module!("attention_rows.cu")),
    ("cache", module!("rope.cuh", "cache.cuh", "cache.cu")),
    ("copy", module!("copy.cu")),
    ("decode", module!("decode.cu")),
    ("elementwise", module!("columns.cuh", "elementwise.cu")),
    ("embedding", module!("adamw.cuh", "embedding.cu")),
    ("flash", module!("mma.cuh", "flash.cu", "flash_backward.cu")),
    (
        "flash_portable",
        module!(
            "portable_mma.cuh",
            "mma.cuh",
            "flash.cu",
            "flash_backward.cu"
        ),
    ),
    ("gemm", module!("gemm.cu")),
    (
        "linear",
        module!(
            "norm.cuh",
            "rope.cuh",
            "cache.cuh",
            "linear_common.cuh",
            "linear.cu"
        ),
    ),
    (
        "linear_mma",
        module!("linear_common.cuh", "mma.cuh", "linear_mma.cu"),
    ),
    (
        "linear_mma_portable",
        module!(
            "portable_mma.cuh",
            "linear_common.cuh",
            "mma.cuh",
            "linear_mma.cu"
        ),
    ),
    ("loss", module!("loss.cu")),
    ("norm", module!("norm.cuh", "columns.cuh", "norm.cu")),
    ("optim", module!("adamw.cuh", "optim.cu")),
    ("prefetch", module!("prefetch.cu")),
    ("rope", module!("rope.cuh", "rope.cu")),
];

#[cfg(test)]
mod tests;
