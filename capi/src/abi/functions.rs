//! The extern "C" functions of `kiln.h`. Each checks its pointers, runs under [`guard`] and
//! writes its outputs only on success (rules 1 and 5 of the module doc).

use std::ffi::c_char;

use super::guard::{guard, string_argument};
use super::handles;
use super::tensor::{
    code_of, descriptor, device_span, memory_of, read_tensor, write_tensor, Memory,
};
use super::*;
use crate::error::Error;
use crate::session::{parse_precision, parse_program, DeviceKind, Model, Order, Program};

/// The ABI version this library implements ([`KILN_ABI_VERSION`]); a caller compiled against
/// another major header should refuse to run.
#[no_mangle]
pub extern "C" fn kiln_abi_version() -> u32 {
    KILN_ABI_VERSION
}

/// kiln's version, a static NUL-terminated string (never freed).
#[no_mangle]
pub extern "C" fn kiln_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast()
}

/// Stores `value` through `out`, or fails when `out` is null.
fn store<T>(out: *mut T, value: T, argument: &'static str) -> crate::Result<()> {
    // SAFETY: checked for null; the caller's contract makes a non-null `out` writable.
    match unsafe { out.as_mut() } {
        Some(slot) => {
            *slot = value;
            Ok(())
        }
        None => Err(Error::NullPointer { argument }),
    }
}

/// How a call on `program` is ordered by `stream` (see [`KilnStream`]): a null handle is
/// synchronous; a handle must be a stream of the program's CUDA device.
fn order_of(program: &mut Program, stream: KilnStream) -> crate::Result<Order> {
    let memory = memory_of(stream.device, "stream")?;
    if stream.handle.is_null() {
        return Ok(Order::Synchronous);
    }
    let ordinal = program.device_stream().map(|(ordinal, _)| ordinal);
    match (memory, ordinal) {
        (Memory::Cuda(index), Some(ordinal)) if index == ordinal => {
            Ok(Order::Stream(stream.handle as u64))
        }
        (_, None) => Err(Error::Device {
            what: "stream".to_string(),
            reason: "a stream handle for a program that runs on the CPU; pass a null handle"
                .to_string(),
        }),
        (_, Some(ordinal)) => Err(Error::Device {
            what: "stream".to_string(),
            reason: format!(
                "a stream handle must name CUDA device {ordinal}, the program's (it names {:?})",
                memory
            ),
        }),
    }
}

/// Fails unless device memory of CUDA device `index` is the program's device's.
fn check_device(program: &mut Program, index: usize, what: &str) -> crate::Result<()> {
    match program.device_stream() {
        Some((ordinal, _)) if ordinal == index => Ok(()),
        Some((ordinal, _)) => Err(Error::Device {
            what: what.to_string(),
            reason: format!("is memory of CUDA device {index}; the program runs on {ordinal}"),
        }),
        None => Err(Error::Device {
            what: what.to_string(),
            reason: "is CUDA memory; the program runs on the CPU and takes host memory (describe \
                     a host buffer with KILN_DEVICE_CPU)"
                .to_string(),
        }),
    }
}

/// Loads `model` (a Hugging Face directory or a preset name) on `device` in `precision`
/// ("f32", "bf16-gemm", "bf16-swiglu" or "bf16"; a preset's weights random from `seed`),
/// exactly as `kiln eval --model` loads it; the handle goes to `*out`.
///
/// # Safety
/// `model` and `precision` are NUL-terminated strings; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_model_load(
    model: *const c_char,
    device: KilnDevice,
    precision: *const c_char,
    seed: u64,
    out: *mut KilnModel,
) -> KilnStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let (model, precision) = unsafe {
            (
                string_argument(model, "model")?,
                string_argument(precision, "precision")?,
            )
        };
        if out.is_null() {
            return Err(Error::NullPointer { argument: "out" });
        }
        let device = match (device.device_type, device.index) {
            (KILN_DEVICE_CPU, 0) => DeviceKind::Cpu,
            (KILN_DEVICE_CUDA, 0) => DeviceKind::Cuda,
            (kind, index) => {
                return Err(Error::Device {
                    what: "device".to_string(),
                    reason: format!("type {kind} index {index}: expected CPU 0 or CUDA 0"),
                })
            }
        };
        let loaded = Model::load(model, device, parse_precision(precision)?, seed)?;
        let id = handles::add_model(loaded);
        store(out, KilnModel { id }, "out")
    })
}

/// Frees a model. Its compiled programs stay usable. Freeing it again is an error.
#[no_mangle]
pub extern "C" fn kiln_model_free(model: KilnModel) -> KilnStatus {
    guard(|| handles::free_model(model.id))
}

/// Compiles `program` ("prefill", "decode", "train" or "eval") of `model` with `options`:
/// traced, planned, bound to the model's device, the weights set and every state zero.
///
/// # Safety
/// `program` is a NUL-terminated string; `options` points at options; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_compile(
    model: KilnModel,
    program: *const c_char,
    options: *const KilnProgramOptions,
    out: *mut KilnProgram,
) -> KilnStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let program = unsafe { string_argument(program, "program")? };
        // SAFETY: checked for null; readable by the caller's contract.
        let options = *unsafe { options.as_ref() }.ok_or(Error::NullPointer {
            argument: "options",
        })?;
        if out.is_null() {
            return Err(Error::NullPointer { argument: "out" });
        }
        let kind = parse_program(program)?;
        let count = |value: u64, name: &str| {
            usize::try_from(value).map_err(|_| Error::argument(name, "does not fit this machine"))
        };
        let (batch, seq) = (count(options.batch, "batch")?, count(options.seq, "seq")?);
        let max_seq = match options.max_seq {
            0 => None,
            rows => Some(count(rows, "max_seq")?),
        };
        let flag = |value: u32, name: &str| match value {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(Error::argument(
                name,
                format!("is {other}; expected 0 or 1"),
            )),
        };
        let fusion = flag(options.fusion, "fusion")?;
        let mode = match flag(options.replay, "replay")? {
            true => kiln_runtime::RunMode::Graph,
            false => kiln_runtime::RunMode::Eager,
        };
        let compiled = handles::with_model(model.id, |model| {
            let options = model.program_options(kind, (batch, seq, max_seq), fusion)?;
            model.compile(kind, &options, mode)
        })?;
        let id = handles::add_program(compiled);
        store(out, KilnProgram { id }, "out")
    })
}

/// Frees a program. Freeing it again is an error.
#[no_mangle]
pub extern "C" fn kiln_program_free(program: KilnProgram) -> KilnStatus {
    guard(|| handles::free_program(program.id))
}

/// The descriptor `tensor` (the argument named `argument`) of `what`, where its memory is and
/// how `stream` orders the call, every field checked; the program's work is then ordered
/// after the stream's (see [`Program::begin`]).
///
/// # Safety
/// A non-null `tensor` points at a descriptor valid for the call.
unsafe fn begin<'t>(
    program: &mut Program,
    (tensor, argument): (*const KilnTensor, &'static str),
    what: &str,
    stream: KilnStream,
) -> crate::Result<(&'t KilnTensor, Memory, Order)> {
    let order = order_of(program, stream)?;
    // SAFETY: the caller's contract.
    let (tensor, memory) = unsafe { descriptor(tensor, argument, what)? };
    if let Memory::Cuda(index) = memory {
        check_device(program, index, what)?;
    }
    program.begin(order)?;
    Ok((tensor, memory, order))
}

/// Copies the caller's `tensor` into input (or state) `name` of `program`; its dtype and shape
/// must be the input's. Host memory is copied before the call returns; device memory is
/// copied on the device, ordered by `stream`. kiln keeps no reference to the caller's memory.
///
/// # Safety
/// `name` is a NUL-terminated string; `tensor` points at a descriptor valid for the call (its
/// device memory until `stream` reaches the call's work).
#[no_mangle]
pub unsafe extern "C" fn kiln_program_set_input(
    program: KilnProgram,
    name: *const c_char,
    tensor: *const KilnTensor,
    stream: KilnStream,
) -> KilnStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let name = unsafe { string_argument(name, "name")? };
        handles::with_program(program.id, |program| {
            let what = format!("input `{name}`");
            // SAFETY: the caller's contract.
            let (tensor, memory, order) =
                unsafe { begin(program, (tensor, "tensor"), &what, stream)? };
            match memory {
                // SAFETY: the caller's contract.
                Memory::Host => program.set(name, &unsafe { read_tensor(tensor, &what)? })?,
                Memory::Cuda(_) => {
                    // SAFETY: the caller's contract; the runtime checks the range.
                    let (dtype, shape, span) = unsafe { device_span(tensor, &what)? };
                    program.set_device(name, (dtype, &shape), span)?;
                }
            }
            program.end(order)
        })
    })
}

/// Runs `program` once, ordered by `stream`: every per-run input must have been set; states
/// carry over.
#[no_mangle]
pub extern "C" fn kiln_program_run(program: KilnProgram, stream: KilnStream) -> KilnStatus {
    guard(|| {
        handles::with_program(program.id, |program| {
            let order = order_of(program, stream)?;
            program.begin(order)?;
            program.run()?;
            program.end(order)
        })
    })
}

/// The dtype and shape of output (or written state) `name`: `*rank` gets its rank and
/// `shape[0..rank]` its dimensions when `capacity >= rank` (else the call fails and names
/// the rank needed, writing nothing).
///
/// # Safety
/// `name` is a NUL-terminated string; `shape` points at `capacity` writable numbers; `rank`
/// and `dtype` are writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_output_type(
    program: KilnProgram,
    name: *const c_char,
    dtype: *mut KilnDType,
    shape: *mut i64,
    capacity: u32,
    rank: *mut u32,
) -> KilnStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let name = unsafe { string_argument(name, "name")? };
        if dtype.is_null() || rank.is_null() {
            let argument = if dtype.is_null() { "dtype" } else { "rank" };
            return Err(Error::NullPointer { argument });
        }
        let ty = handles::with_program(program.id, |program| Ok(program.output(name)?.clone()))?;
        let dims = ty.dims();
        if dims.len() > capacity as usize {
            return Err(Error::Shape {
                what: format!("output `{name}`"),
                reason: format!("has rank {}; capacity is {capacity}", dims.len()),
            });
        }
        if !dims.is_empty() && shape.is_null() {
            return Err(Error::NullPointer { argument: "shape" });
        }
        for (axis, &dim) in dims.iter().enumerate() {
            // SAFETY: `axis < rank <= capacity` writable numbers by the contract.
            unsafe { *shape.add(axis) = dim as i64 };
        }
        store(dtype, code_of(ty.dtype), "dtype")?;
        store(rank, dims.len() as u32, "rank")
    })
}

/// Copies output (or written state) `name` of the last run into the caller's memory `out`,
/// whose dtype and shape must be the output's; nothing is written on failure. Host memory is
/// written before the call returns; device memory on the device, ordered by `stream`.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` points at a descriptor of writable memory (its
/// device memory until `stream` reaches the call's work).
#[no_mangle]
pub unsafe extern "C" fn kiln_program_get_output(
    program: KilnProgram,
    name: *const c_char,
    out: *const KilnTensor,
    stream: KilnStream,
) -> KilnStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let name = unsafe { string_argument(name, "name")? };
        handles::with_program(program.id, |program| {
            let what = format!("output `{name}`");
            // SAFETY: the caller's contract.
            let (out, memory, order) = unsafe { begin(program, (out, "out"), &what, stream)? };
            match memory {
                Memory::Host => {
                    let value = program.get(name)?;
                    // SAFETY: the caller's contract.
                    unsafe { write_tensor(&value, out, &what)? }
                }
                Memory::Cuda(_) => {
                    // SAFETY: the caller's contract; the runtime checks the range.
                    let (dtype, shape, span) = unsafe { device_span(out, &what)? };
                    program.get_device(name, (dtype, &shape), span)?;
                }
            }
            program.end(order)
        })
    })
}
