//! The extern "C" functions of `kiln.h`. Each checks its pointers, runs under [`guard`] and
//! writes its outputs only on success (rules 1 and 5 of the module doc).

use std::ffi::c_char;

use super::guard::{guard, string_argument};
use super::handles;
use super::tensor::{check_host, code_of, read_tensor, write_tensor};
use super::*;
use crate::error::Error;
use crate::session::{parse_precision, parse_program, DeviceKind, Model};

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

/// Refuses a stream this ABI version cannot order work on (see [`KilnStream`]).
fn check_stream(stream: KilnStream) -> crate::Result<()> {
    check_host(stream.device, "stream").or_else(|error| match stream.device.device_type {
        KILN_DEVICE_CUDA => Ok(()),
        _ => Err(error),
    })?;
    if !stream.handle.is_null() {
        return Err(Error::Device {
            what: "stream".to_string(),
            reason: "a non-null stream handle: this ABI version runs every call synchronously; \
                     pass a null handle"
                .to_string(),
        });
    }
    Ok(())
}

/// Loads `model` (a Hugging Face directory or a preset name) on `device` in `precision`
/// ("f32", "bf16-gemm" or "bf16"; a preset's weights random from `seed`), exactly as
/// `kiln eval --model` loads it; the handle goes to `*out`.
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

/// Copies the caller's `tensor` into input (or state) `name` of `program`; its dtype and shape
/// must be the input's. kiln keeps no reference to the caller's memory.
///
/// # Safety
/// `name` is a NUL-terminated string; `tensor` points at a descriptor valid for the call.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_set_input(
    program: KilnProgram,
    name: *const c_char,
    tensor: *const KilnTensor,
    stream: KilnStream,
) -> KilnStatus {
    guard(|| {
        check_stream(stream)?;
        // SAFETY: the caller's contract.
        let name = unsafe { string_argument(name, "name")? };
        handles::with_program(program.id, |program| {
            let what = format!("input `{name}`");
            // SAFETY: the caller's contract.
            let value = unsafe { read_tensor(tensor, &what)? };
            program.set(name, &value)
        })
    })
}

/// Runs `program` once: every per-run input must have been set; states carry over.
#[no_mangle]
pub extern "C" fn kiln_program_run(program: KilnProgram, stream: KilnStream) -> KilnStatus {
    guard(|| {
        check_stream(stream)?;
        handles::with_program(program.id, |program| program.run())
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
/// whose dtype and shape must be the output's; nothing is written on failure.
///
/// # Safety
/// `name` is a NUL-terminated string; `out` points at a descriptor of writable memory.
#[no_mangle]
pub unsafe extern "C" fn kiln_program_get_output(
    program: KilnProgram,
    name: *const c_char,
    out: *const KilnTensor,
    stream: KilnStream,
) -> KilnStatus {
    guard(|| {
        check_stream(stream)?;
        // SAFETY: the caller's contract.
        let name = unsafe { string_argument(name, "name")? };
        let value = handles::with_program(program.id, |program| program.get(name))?;
        // SAFETY: the caller's contract.
        unsafe { write_tensor(&value, out, &format!("output `{name}`")) }
    })
}
