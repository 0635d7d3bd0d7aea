//! Writing safetensors files: streamed and atomic.
//!
//! The data is streamed tensor by tensor through a small reused buffer (model files are
//! gigabytes; the file is never assembled in memory). The file is written to a temporary name
//! in the target's directory, synced, then moved to the target's name only if nothing is there
//! (see `temp`), so a reader sees no file or the whole new one and an existing path is never
//! replaced; on any failure the temporary file is removed.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use half::{bf16, f16};
use kiln_ir::DType;
use kiln_kernels::Element;
use kiln_runtime::Tensor;
use serde_json::{json, Map, Value};

use super::convert::LittleEndian;
use super::header::LENGTH_PREFIX;
use super::temp::TempFile;
use crate::error::{Error, Result};

/// Elements converted per write: bounds the memory writing takes beyond the tensors.
const CHUNK_ELEMENTS: usize = 1 << 16;

/// One tensor's place in the file being written.
struct Planned<'t> {
    name: &'t str,
    tensor: &'t Tensor,
    dtype: DType,
}

/// Writes `tensors` to `path`, each converted to `target` when given (float to float only),
/// else in its own dtype. See [`super::write_safetensors`].
pub(super) fn write_file(
    path: &Path,
    tensors: &[(String, Tensor)],
    target: Option<DType>,
    metadata: Option<BTreeMap<String, String>>,
) -> Result<()> {
    let path_text = path.display().to_string();
    let plan = plan(&path_text, tensors, target)?;
    let header = header_bytes(&path_text, &plan, metadata)?;

    atomically(path, |out| {
        out.write_all(&(header.len() as u64).to_le_bytes())?;
        out.write_all(&header)?;
        for planned in &plan {
            write_tensor(out, planned)?;
        }
        Ok(())
    })
}

/// Writes `bytes` to `path` atomically (see [`atomically`]).
pub(super) fn write_bytes(path: &Path, bytes: &[u8]) -> Result<()> {
    atomically(path, |out| Ok(out.write_all(bytes)?))
}

/// Runs `write` into a temporary file beside `path`, syncs it and publishes it as `path`
/// unless something is already there (see `temp`): a reader sees no file or the whole new one,
/// and nothing at `path` is ever replaced. On any failure the temporary file is removed.
pub(super) fn atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<(), Failure>,
) -> Result<()> {
    let path_text = path.display().to_string();
    let (temp, file) = TempFile::create(path)?;
    let io_error = |what: &str, e: std::io::Error| Error::Io {
        path: path_text.clone(),
        reason: format!(
            "cannot {what} the temporary file {}: {e}",
            temp.path.display()
        ),
    };
    let mut out = BufWriter::with_capacity(1 << 20, file);
    write(&mut out).map_err(|e| match e {
        Failure::Io(e) => io_error("write", e),
        Failure::Kiln(e) => e,
    })?;
    let file = out
        .into_inner()
        .map_err(|e| io_error("write", e.into_error()))?;
    file.sync_all().map_err(|e| io_error("sync", e))?;
    drop(file);
    temp.publish()?;
    // Make the rename itself durable. The new file is already in place, so a directory that
    // cannot be synced (some filesystems refuse) is not reported as a failed write.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }
    }
    Ok(())
}

/// Checks names and dtypes and orders the tensors: larger elements first, then by name (as the
/// `safetensors` crate does), so that every tensor starts aligned to its element size.
fn plan<'t>(
    path: &str,
    tensors: &'t [(String, Tensor)],
    target: Option<DType>,
) -> Result<Vec<Planned<'t>>> {
    let mut plan = Vec::with_capacity(tensors.len());
    for (name, tensor) in tensors {
        if name == "__metadata__" {
            return Err(Error::Safetensors {
                path: path.into(),
                reason: "`__metadata__` is reserved and cannot name a tensor".into(),
            });
        }
        let dtype = target.unwrap_or(tensor.dtype());
        if dtype.is_float() != tensor.dtype().is_float()
            || (!dtype.is_float() && dtype != tensor.dtype())
        {
            return Err(Error::TensorDType {
                path: path.into(),
                name: name.clone(),
                expected: format!("a dtype that converts to {dtype}"),
                found: tensor.dtype().to_string(),
            });
        }
        plan.push(Planned {
            name,
            tensor,
            dtype,
        });
    }
    let mut names = BTreeSet::new();
    if let Some(twice) = plan.iter().find(|p| !names.insert(p.name)) {
        return Err(Error::Safetensors {
            path: path.into(),
            reason: format!("tensor `{}` is given twice", twice.name),
        });
    }
    plan.sort_by(|a, b| (b.dtype.size_bytes(), a.name).cmp(&(a.dtype.size_bytes(), b.name)));
    Ok(plan)
}

/// The JSON header, padded with spaces to a multiple of 8 bytes so the data section starts
/// aligned.
fn header_bytes(
    path: &str,
    plan: &[Planned<'_>],
    metadata: Option<BTreeMap<String, String>>,
) -> Result<Vec<u8>> {
    let mut header = Map::new();
    if let Some(metadata) = metadata {
        header.insert("__metadata__".into(), json!(metadata));
    }
    let mut offset = 0usize;
    for planned in plan {
        let end = planned
            .tensor
            .numel()
            .checked_mul(planned.dtype.size_bytes())
            .and_then(|n| n.checked_add(offset))
            .ok_or_else(|| Error::Safetensors {
                path: path.into(),
                reason: format!(
                    "tensor `{}`: the file would exceed 2^64 bytes",
                    planned.name
                ),
            })?;
        header.insert(
            planned.name.to_string(),
            json!({
                "dtype": stored_name(planned.dtype),
                "shape": planned.tensor.dims(),
                "data_offsets": [offset, end],
            }),
        );
        offset = end;
    }
    let mut bytes = serde_json::to_vec(&Value::Object(header)).map_err(|e| Error::Safetensors {
        path: path.into(),
        reason: format!("cannot encode the header: {e}"),
    })?;
    bytes.resize(bytes.len().next_multiple_of(LENGTH_PREFIX), b' ');
    Ok(bytes)
}

/// How safetensors spells a kiln dtype.
fn stored_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::BF16 => "BF16",
        DType::F16 => "F16",
        DType::I32 => "I32",
        DType::I64 => "I64",
    }
}

/// A write failure: the file system, or reading the tensor.
pub(super) enum Failure {
    Io(std::io::Error),
    Kiln(Error),
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Failure::Io(e)
    }
}

/// Streams one tensor's elements, converted to its planned dtype, in row-major order.
fn write_tensor(out: &mut impl Write, planned: &Planned<'_>) -> Result<(), Failure> {
    let dense = planned
        .tensor
        .contiguous()
        .map_err(|e| Failure::Kiln(e.into()))?;
    let target = planned.dtype;
    let written = dense.read_with(|view| {
        let op = "write_safetensors";
        let values = |e: kiln_kernels::Error| Failure::Kiln(e.into());
        match view.dtype() {
            DType::F32 => floats(
                out,
                view.slice::<f32>(op, "tensor").map_err(values)?,
                target,
            ),
            DType::F64 => floats(
                out,
                view.slice::<f64>(op, "tensor").map_err(values)?,
                target,
            ),
            DType::BF16 => floats(
                out,
                view.slice::<bf16>(op, "tensor").map_err(values)?,
                target,
            ),
            DType::F16 => floats(
                out,
                view.slice::<f16>(op, "tensor").map_err(values)?,
                target,
            ),
            // `plan` only lets integers through unconverted.
            DType::I32 => chunks(out, view.slice::<i32>(op, "tensor").map_err(values)?, |x| x),
            DType::I64 => chunks(out, view.slice::<i64>(op, "tensor").map_err(values)?, |x| x),
        }
    });
    written.map_err(|e| Failure::Kiln(e.into()))?
}

/// Float elements converted to the float dtype `target` (`plan` checked it is one), rounded
/// once (see [`Element::from_f64`]). Elements already of `target` keep every bit (going through
/// f64 would quiet signalling NaNs).
fn floats<S: Element + LittleEndian>(
    out: &mut impl Write,
    values: &[S],
    target: DType,
) -> Result<(), Failure> {
    fn to<S: Element, T: Element>(value: S) -> T {
        T::from_f64(value.to_f64())
    }
    if S::DTYPE == target {
        return chunks(out, values, |x| x);
    }
    match target {
        DType::F32 => chunks(out, values, to::<S, f32>),
        DType::F64 => chunks(out, values, to::<S, f64>),
        DType::BF16 => chunks(out, values, to::<S, bf16>),
        DType::F16 => chunks(out, values, to::<S, f16>),
        DType::I32 | DType::I64 => unreachable!("plan refuses float to integer"),
    }
}

/// Writes `convert(value)` for every value, a bounded chunk at a time.
fn chunks<S: Copy, T: LittleEndian>(
    out: &mut impl Write,
    values: &[S],
    convert: impl Fn(S) -> T,
) -> Result<(), Failure> {
    let mut bytes = Vec::with_capacity(CHUNK_ELEMENTS.min(values.len()) * T::WIDTH);
    for chunk in values.chunks(CHUNK_ELEMENTS) {
        bytes.clear();
        for &value in chunk {
            convert(value).write(&mut bytes);
        }
        out.write_all(&bytes)?;
    }
    Ok(())
}
