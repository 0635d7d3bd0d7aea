//! The C ABI (`include/kiln.h`). Its rules:
//!
//! 1. Every function returns a [`KilnStatus`]; on failure [`kiln_last_error`] gives kiln's
//!    message until the next kiln call on the same thread. Outputs are written only on success.
//! 2. Handles ([`KilnModel`], [`KilnProgram`]) are numbers, never pointers: a freed, forged or
//!    zero handle is an error, not a crash. A handle serves the thread that made it (models and
//!    programs hold thread-bound state: the oracle's tape, CUDA graphs).
//! 3. A [`KilnTensor`] describes memory the caller owns: kiln reads or writes it only in the
//!    call's work (during the call, or on the call's stream), only inside its
//!    `accessible_bytes`, and never frees it or keeps its address.
//! 4. Enumerations cross as plain integers, checked on entry: a C caller cannot hand Rust an
//!    invalid enum value.
//! 5. No panic unwinds into C: each function runs under `catch_unwind` and a panic becomes
//!    [`KILN_STATUS_INTERNAL`].

mod functions;
mod guard;
mod handles;
mod tensor;

pub use functions::*;
pub use guard::kiln_last_error;

use std::ffi::c_void;

/// Version of the C ABI. Bumped on every change that breaks a compiled caller (a layout, a
/// signature, a constant's meaning); additions keep it.
pub const KILN_ABI_VERSION: u32 = 1;

/// The most dimensions a descriptor may have (checked before its shape is read).
pub const KILN_MAX_RANK: u32 = 16;

/// What a call returned: [`KILN_STATUS_OK`] or why it failed.
pub type KilnStatus = i32;
pub const KILN_STATUS_OK: KilnStatus = 0;
/// A pointer argument that must point somewhere is null.
pub const KILN_STATUS_NULL_POINTER: KilnStatus = 1;
/// An argument has a value the call cannot take (a name, an option, a string).
pub const KILN_STATUS_INVALID_ARGUMENT: KilnStatus = 2;
/// A tensor has the wrong dtype (or an unknown dtype code).
pub const KILN_STATUS_DTYPE: KilnStatus = 3;
/// A tensor has the wrong shape, or its shape, strides and bytes disagree.
pub const KILN_STATUS_SHAPE: KilnStatus = 4;
/// A tensor or stream is on a device the call cannot use.
pub const KILN_STATUS_DEVICE: KilnStatus = 5;
/// No input, output or model of that name.
pub const KILN_STATUS_NOT_FOUND: KilnStatus = 6;
/// The handle is not live (freed, never made, or made on another thread).
pub const KILN_STATUS_INVALID_HANDLE: KilnStatus = 7;
/// kiln failed at the work itself (a model file, a kernel, a device).
pub const KILN_STATUS_FAILED: KilnStatus = 8;
/// kiln panicked: a bug in kiln, caught at the boundary.
pub const KILN_STATUS_INTERNAL: KilnStatus = 9;

/// Element type of a tensor.
pub type KilnDType = i32;
pub const KILN_DTYPE_F32: KilnDType = 0;
pub const KILN_DTYPE_F64: KilnDType = 1;
pub const KILN_DTYPE_BF16: KilnDType = 2;
pub const KILN_DTYPE_F16: KilnDType = 3;
pub const KILN_DTYPE_I32: KilnDType = 4;
pub const KILN_DTYPE_I64: KilnDType = 5;

/// Kind of device; the numbers are DLPack's `DLDeviceType` codes.
pub type KilnDeviceType = i32;
pub const KILN_DEVICE_CPU: KilnDeviceType = 1;
pub const KILN_DEVICE_CUDA: KilnDeviceType = 2;

/// A device: its kind and ordinal (0 for the CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KilnDevice {
    pub device_type: KilnDeviceType,
    pub index: i32,
}

/// The stream a call is ordered on.
///
/// `handle` null: the call is synchronous; on a CUDA program its work runs after the work
/// already on the legacy default stream (CUDA's stream 0), and the call returns once its work
/// and copies are complete. A non-null `handle` is a live `CUstream` of `device` (a CUDA
/// device, in the device's primary context, as the CUDA runtime's and PyTorch's streams are;
/// DLPack's 1 and 2 name the legacy and per-thread default streams): the call's work on the
/// device runs after the work issued on that stream before the call, the work issued there
/// after the call runs after it, and the call returns without waiting for its device work —
/// except a copy of an index input (token ids, positions, slots), which goes through the host
/// to have its values checked and so waits for the stream. A caller's device memory must stay
/// valid until its stream reaches the call's work. Host descriptors are always copied before
/// the call returns.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnStream {
    pub device: KilnDevice,
    pub handle: *mut c_void,
}

/// A non-owning tensor descriptor: memory the caller owns, described for one call.
///
/// `data` is the address of the element at index 0 in every dimension; `accessible_bytes`
/// bytes from `data` may be read (inputs) or written (outputs), and every element the shape
/// and strides reach must lie inside them. `shape` and `strides` point at `rank` numbers each;
/// strides count elements, not bytes, and are never negative; `strides` null means row-major.
/// `data` may be null only when `accessible_bytes` is 0 (an empty tensor).
///
/// `device` CPU: host memory, copied through the host. `device` CUDA: device memory of the
/// program's device, copied on the device (it must be row-major; kiln checks the range with
/// the driver before touching it), ordered by the call's [`KilnStream`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnTensor {
    pub data: *mut c_void,
    pub accessible_bytes: u64,
    pub rank: u32,
    pub shape: *const i64,
    pub strides: *const i64,
    pub dtype: KilnDType,
    pub device: KilnDevice,
}

/// A loaded model (a number, not a pointer; 0 is never a model).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KilnModel {
    pub id: u64,
}

/// A compiled program of a model (a number, not a pointer; 0 is never a program).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KilnProgram {
    pub id: u64,
}

/// How to compile a program; the numbers are the CLI's `--batch`, `--seq`, `--max-seq`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct KilnProgramOptions {
    pub batch: u64,
    /// Tokens per row (prefill, train, eval; decode takes one).
    pub seq: u64,
    /// Rows of the KV cache (prefill, decode); 0 takes the program's default.
    pub max_seq: u64,
    /// 1: run the fusion pass (the default); 0: the unfused reference program.
    pub fusion: u32,
    /// 0: every launch issued each run (eager); 1: recorded once and replayed (graph).
    pub replay: u32,
}
