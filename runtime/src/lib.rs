//! kiln-runtime: devices, storage, tensors, kernel launches and the reference interpreter.
//!
//! A [`Storage`] is one allocation on a [`Device`] with shared lifetime; a [`Tensor`] is a
//! [`Layout`](kiln_ir::Layout) (shape, element strides, element offset) over a shared Storage and obeys the Tensor
//! N0 invariants of DESIGN.md. Views (reshape, transpose, slice) share storage; `contiguous()`
//! is the one call that materializes.
//!
//! [`interpret`] runs an IR program with one fresh allocation per value on the CPU reference
//! kernels: the baseline every planned executor must match bit for bit.
//!
//! [`execute`] runs a planned program with every activation and workspace in ONE host arena at
//! the plan's offsets (optionally poisoning dead bytes) and matches [`interpret`] bit for bit.
//!
//! A [`Backend`] binds a planned program to memory allocated once and runs it eagerly or as a
//! replayed recording, behind the [`Executable`] trait: [`CpuExecutable`] (the reference
//! kernels over one host arena; its recording is a list of launches with bound addresses) and
//! [`gpu::GpuExecutable`] (one device arena, streams and events from the plan, device graphs)
//! over a GPU [`gpu::Driver`]: [`cuda::CudaExecutable`] on CUDA.
//! [`Backend::compile_group`] binds several plans of one model to ONE memory (one arena of
//! the largest plan's bytes, one slot per param and state), an [`ExecutableGroup`].
//! [`lower_for_device`] lowers a plan to device launches without a device (what CI checks).

mod backend;
pub mod collective;
pub mod cuda;
mod derived;
mod device;
mod device_io;
mod error;
pub mod gpu;
mod group;
#[cfg(feature = "hip")]
pub mod hip;
pub mod hiprtc;
mod host_bytes;
mod index_inputs;
mod interpret;
pub mod kernel_cache;
mod launch;
mod lower;
mod placed;
mod planned;
mod program;
mod storage;
mod tensor;
mod workspaces;

pub use backend::{Backend, Executable, RunMode};
pub use device::Device;
pub use device_io::{DeviceBuffer, DeviceIo, DeviceSpan};
pub use error::{Error, Result};
pub use group::{join_all, ExecutableGroup, GroupMemory, SharedInput};
pub use interpret::{interpret, interpret_in};
pub use launch::launch;
pub use lower::LowerOptions;
pub use planned::execute;
pub use planned::CpuExecutable;
pub use program::{lower_for_device, LoweringSummary};
pub use storage::{Storage, StorageRead, StorageWrite};
pub use tensor::Tensor;
pub use workspaces::Workspaces;
