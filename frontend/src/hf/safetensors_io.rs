//! Reading and writing safetensors files.
//!
//! [`SafetensorsFile`] memory-maps a file and validates its header once at [`open`]
//! (see `header`): afterwards every tensor's bytes are known to lie inside the file, hold exactly
//! `numel × dtype size` bytes and not overlap another tensor's, so reading a tensor cannot fail
//! on the file's layout. Nothing is copied until [`SafetensorsFile::tensor`] converts one tensor
//! into a contiguous kiln [`Tensor`].
//!
//! [`write_safetensors`] streams tensors to a temporary file beside the target and moves it into
//! place only if nothing is at the target: kiln never replaces an existing path.
//!
//! Like every memory-mapped reader, this assumes the file is not modified while it is open
//! (model files are written once, and kiln's own writer never rewrites a file).
//!
//! [`open`]: SafetensorsFile::open

mod convert;
mod header;
mod temp;
mod write;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kiln_ir::DType;
use kiln_runtime::Tensor;
use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::hf::files::open_regular;
use convert::StoredFloat;
use header::{Entry, Header};

pub(crate) use header::OrderedEntries;
pub use temp::{check_absent, exit_removing_temp_files};

/// A memory-mapped safetensors file with its validated header.
pub struct SafetensorsFile {
    path: PathBuf,
    map: Mmap,
    header: Header,
}

impl std::fmt::Debug for SafetensorsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFile")
            .field("path", &self.path)
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl SafetensorsFile {
    /// Maps `path` and validates its header; errors name the path and the problem.
    pub fn open(path: &Path) -> Result<SafetensorsFile> {
        let path_text = path.display().to_string();
        let file = open_regular(path).map_err(|reason| Error::Io {
            path: path_text.clone(),
            reason: format!("cannot open the safetensors file: {reason}"),
        })?;
        // SAFETY: the map is read-only and private to this value. Its contents stay valid as
        // long as no one truncates or rewrites the file in place while it is open, the usual
        // contract of memory-mapped model files (see the module docs).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::Io {
            path: path_text.clone(),
            reason: format!("cannot memory-map the safetensors file: {e}"),
        })?;
        let header = header::parse(&map).map_err(|reason| Error::Safetensors {
            path: path_text,
            reason,
        })?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.header.tensors.keys().cloned().collect()
    }

    /// A tensor's stored dtype and shape, or `None` if the file has no such tensor.
    pub fn info(&self, name: &str) -> Option<(safetensors::Dtype, Vec<usize>)> {
        let entry = self.header.tensors.get(name)?;
        Some((entry.dtype, entry.shape.clone()))
    }

    /// The header's `__metadata__` (empty if it has none).
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.header.metadata
    }

    /// The tensor `name` as a contiguous kiln tensor of `dtype`. Floats convert to any float
    /// dtype (exact when widening, rounded to nearest even when narrowing); integers convert to
    /// either integer dtype when every value fits; float ↔ integer is refused.
    pub fn tensor(&self, name: &str, dtype: DType) -> Result<Tensor> {
        let entry = self.entry(name)?;
        self.decode(name, self.bytes(name, entry)?, dtype, &entry.shape)
    }

    /// The part `start..end` of dim `axis` of tensor `name` (all of every other dim), read as
    /// [`SafetensorsFile::tensor`] reads a whole one: only the part's bytes are copied out of
    /// the map and converted (a tensor-parallel rank's share of a projection).
    pub fn tensor_part(
        &self,
        name: &str,
        dtype: DType,
        (axis, start, end): (usize, usize, usize),
    ) -> Result<Tensor> {
        let entry = self.entry(name)?;
        let dims = &entry.shape;
        let Some(&length) = dims.get(axis).filter(|&&n| start <= end && end <= n) else {
            return Err(Error::Safetensors {
                path: self.path.display().to_string(),
                reason: format!(
                    "tensor `{name}` {dims:?} has no part {start}..{end} of dim {axis}"
                ),
            });
        };
        let bytes = self.bytes(name, entry)?;
        // Each of the `outer` blocks of dim `axis` holds `length` runs of `inner` bytes.
        let outer: usize = dims[..axis].iter().product();
        let inner = bytes.len() / (outer * length).max(1);
        let mut part = Vec::with_capacity(outer * (end - start) * inner);
        for block in bytes.chunks_exact((length * inner).max(1)).take(outer) {
            part.extend_from_slice(&block[start * inner..end * inner]);
        }
        let mut shape = dims.clone();
        shape[axis] = end - start;
        self.decode(name, &part, dtype, &shape)
    }

    /// The stored bytes of `entry` (tensor `name`).
    fn bytes(&self, name: &str, entry: &Entry) -> Result<&[u8]> {
        (self.map)
            .get(self.header.data_start + entry.begin..self.header.data_start + entry.end)
            .ok_or_else(|| Error::Safetensors {
                path: self.path.display().to_string(),
                reason: format!("tensor `{name}`: its bytes are no longer in the file"),
            })
    }

    /// Stored `bytes` of tensor `name`, of its dtype, as a contiguous tensor of `dtype` and
    /// `shape` (see [`SafetensorsFile::tensor`]).
    fn decode(&self, name: &str, bytes: &[u8], dtype: DType, shape: &[usize]) -> Result<Tensor> {
        let path_text = self.path.display().to_string();
        let entry = self.entry(name)?;
        let refuse = |expected: String, found: String| Error::TensorDType {
            path: path_text.clone(),
            name: name.to_string(),
            expected,
            found,
        };
        let stored = entry.dtype;
        let buffer = match stored_kind(stored) {
            Some(Stored::Float(kind)) => {
                convert::decode_floats(bytes, kind, dtype).ok_or_else(|| {
                    refuse(
                        format!("an integer dtype (to read as {dtype})"),
                        stored.to_string(),
                    )
                })?
            }
            Some(Stored::Int(kind)) => convert::decode_ints(bytes, kind, dtype)
                .map_err(|(index, value)| {
                    refuse(
                        dtype.to_string(),
                        format!("{stored} (element {index} = {value} does not fit in {dtype})"),
                    )
                })?
                .ok_or_else(|| {
                    refuse(
                        format!("a float dtype (to read as {dtype})"),
                        stored.to_string(),
                    )
                })?,
            None => {
                return Err(refuse(
                    "one of F32, F64, BF16, F16, I32, I64 (the dtypes kiln reads)".into(),
                    stored.to_string(),
                ))
            }
        };
        Ok(Tensor::from_buffer(buffer, shape)?)
    }

    fn entry(&self, name: &str) -> Result<&Entry> {
        self.header
            .tensors
            .get(name)
            .ok_or_else(|| Error::Safetensors {
                path: self.path.display().to_string(),
                reason: format!(
                    "no tensor named `{name}` (the file has {} tensors)",
                    self.header.tensors.len()
                ),
            })
    }
}

/// What kind of stored dtype kiln can read.
enum Stored {
    Float(StoredFloat),
    /// `DType::I32` or `DType::I64`.
    Int(DType),
}

fn stored_kind(dtype: safetensors::Dtype) -> Option<Stored> {
    use safetensors::Dtype as S;
    Some(match dtype {
        S::F32 => Stored::Float(StoredFloat::F32),
        S::F64 => Stored::Float(StoredFloat::F64),
        S::BF16 => Stored::Float(StoredFloat::BF16),
        S::F16 => Stored::Float(StoredFloat::F16),
        S::I32 => Stored::Int(DType::I32),
        S::I64 => Stored::Int(DType::I64),
        _ => return None,
    })
}

/// Writes `tensors` (any layout; f32, f64, bf16, f16, i32, i64, each in its own dtype) to
/// `path` with the optional `__metadata__`. The header lists the names sorted; the data is
/// streamed to a temporary file in the same directory, synced, and moved to `path` only if
/// nothing is there: anything at `path` (a file, a directory, a dangling symbolic link) is
/// refused with [`Error::AlreadyExists`], before the write or at its end, and left untouched.
/// On any error the temporary file is removed.
pub fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: Option<BTreeMap<String, String>>,
) -> Result<()> {
    write::write_file(path, tensors, None, metadata)
}

/// Writes `bytes` to a new file `path` atomically, like [`write_safetensors`]: never replaces
/// anything at `path`.
pub fn write_file_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    write::write_bytes(path, bytes)
}

/// Like [`write_safetensors`], with every tensor converted to the float dtype `dtype` while it
/// is streamed (rounded to nearest even when narrowing), so no converted copy of the whole set
/// is ever held. Integer tensors are refused.
pub(crate) fn write_safetensors_as(
    path: &Path,
    tensors: &[(String, Tensor)],
    dtype: DType,
    metadata: Option<BTreeMap<String, String>>,
) -> Result<()> {
    write::write_file(path, tensors, Some(dtype), metadata)
}

#[cfg(test)]
#[path = "safetensors_io_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "safetensors_io_conversion_tests.rs"]
mod conversion_tests;

#[cfg(test)]
#[path = "safetensors_io_rejection_tests.rs"]
mod rejection_tests;

#[cfg(all(test, unix))]
#[path = "safetensors_io_publish_tests.rs"]
mod publish_tests;
