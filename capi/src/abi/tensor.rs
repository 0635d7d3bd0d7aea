//! Tensor descriptors in and out (rule 3 of the module doc): each field checked before the
//! memory is touched, then one checked copy: host memory through `kiln_runtime`'s host-bytes
//! seam, device memory as a range the runtime checks with the driver and copies on the
//! device.

use kiln_ir::{DType, Layout, Shape};
use kiln_runtime::{DeviceSpan, Tensor};

use super::*;
use crate::error::{Error, Result};

/// The kiln dtype of a C dtype code.
pub(crate) fn dtype_of(code: KilnDType, what: &str) -> Result<DType> {
    Ok(match code {
        KILN_DTYPE_F32 => DType::F32,
        KILN_DTYPE_F64 => DType::F64,
        KILN_DTYPE_BF16 => DType::BF16,
        KILN_DTYPE_F16 => DType::F16,
        KILN_DTYPE_I32 => DType::I32,
        KILN_DTYPE_I64 => DType::I64,
        other => {
            return Err(Error::DType {
                what: what.to_string(),
                expected: "a KILN_DTYPE_* code (0..=5)".to_string(),
                got: format!("code {other}"),
            })
        }
    })
}

/// The C dtype code of a kiln dtype.
pub(crate) fn code_of(dtype: DType) -> KilnDType {
    match dtype {
        DType::F32 => KILN_DTYPE_F32,
        DType::F64 => KILN_DTYPE_F64,
        DType::BF16 => KILN_DTYPE_BF16,
        DType::F16 => KILN_DTYPE_F16,
        DType::I32 => KILN_DTYPE_I32,
        DType::I64 => KILN_DTYPE_I64,
    }
}

/// Where a descriptor's memory is: the host, or CUDA device `index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Memory {
    Host,
    Cuda(usize),
}

/// The memory `device` names, or an error naming `what`.
pub(crate) fn memory_of(device: KilnDevice, what: &str) -> Result<Memory> {
    match (device.device_type, usize::try_from(device.index)) {
        (KILN_DEVICE_CPU, Ok(0)) => Ok(Memory::Host),
        (KILN_DEVICE_CUDA, Ok(index)) => Ok(Memory::Cuda(index)),
        (device_type, _) => Err(Error::Device {
            what: what.to_string(),
            reason: format!(
                "device type {device_type} index {}: expected KILN_DEVICE_CPU 0 or \
                 KILN_DEVICE_CUDA with an ordinal",
                device.index
            ),
        }),
    }
}

/// The dtype, layout and bytes `tensor` describes, every field checked.
///
/// # Safety
/// `tensor.shape` and a non-null `tensor.strides` point at `tensor.rank` numbers, and
/// `tensor.data` at `tensor.accessible_bytes` bytes valid for the call.
unsafe fn described(tensor: &KilnTensor, what: &str) -> Result<(DType, Layout)> {
    let dtype = dtype_of(tensor.dtype, what)?;
    if tensor.rank > KILN_MAX_RANK {
        return Err(Error::Shape {
            what: what.to_string(),
            reason: format!(
                "rank {} exceeds KILN_MAX_RANK ({KILN_MAX_RANK})",
                tensor.rank
            ),
        });
    }
    let rank = tensor.rank as usize;
    let numbers = |pointer: *const i64, argument: &'static str| -> Result<Vec<usize>> {
        if rank == 0 {
            return Ok(Vec::new());
        }
        if pointer.is_null() {
            return Err(Error::NullPointer { argument });
        }
        // SAFETY: `rank` numbers by the caller's contract; rank is at most KILN_MAX_RANK.
        let values = unsafe { std::slice::from_raw_parts(pointer, rank) };
        (values.iter().enumerate())
            .map(|(axis, &v)| {
                usize::try_from(v).map_err(|_| Error::Shape {
                    what: what.to_string(),
                    reason: format!("{argument}[{axis}] is {v}; it must not be negative"),
                })
            })
            .collect()
    };
    let dims = numbers(tensor.shape, "shape")?;
    let shape = Shape::from(dims);
    // The element count and byte size must be representable before any stride math.
    kiln_ir::TensorType::new(dtype, shape.clone()).map_err(|error| Error::Shape {
        what: what.to_string(),
        reason: error.to_string(),
    })?;
    let layout = match tensor.strides.is_null() {
        true => Layout::contiguous(shape),
        false => Layout::new(shape, &numbers(tensor.strides, "strides")?, 0).map_err(|e| {
            Error::Shape {
                what: what.to_string(),
                reason: e.to_string(),
            }
        })?,
    };
    if tensor.data.is_null() && tensor.accessible_bytes != 0 {
        return Err(Error::NullPointer { argument: "data" });
    }
    if isize::try_from(tensor.accessible_bytes).is_err() {
        return Err(Error::Shape {
            what: what.to_string(),
            reason: format!(
                "accessible_bytes {} is beyond any allocation",
                tensor.accessible_bytes
            ),
        });
    }
    Ok((dtype, layout))
}

/// The descriptor `tensor` points at, and where its memory is.
///
/// # Safety
/// A non-null `tensor` points at a descriptor valid for the call.
pub(crate) unsafe fn descriptor<'t>(
    tensor: *const KilnTensor,
    argument: &'static str,
    what: &str,
) -> Result<(&'t KilnTensor, Memory)> {
    // SAFETY: checked for null; valid for the call by the caller's contract.
    let tensor = unsafe { tensor.as_ref() }.ok_or(Error::NullPointer { argument })?;
    Ok((tensor, memory_of(tensor.device, what)?))
}

/// The dtype, shape and range of a device descriptor: row-major (device copies move whole
/// ranges), `accessible_bytes` holding every element.
///
/// # Safety
/// As [`described`]; the range is checked with the driver before it is used.
pub(crate) unsafe fn device_span(
    tensor: &KilnTensor,
    what: &str,
) -> Result<(DType, Shape, DeviceSpan)> {
    // SAFETY: as this function's contract.
    let (dtype, layout) = unsafe { described(tensor, what) }?;
    if !layout.is_contiguous() {
        return Err(Error::Shape {
            what: what.to_string(),
            reason: format!(
                "device memory with strides {:?}: kiln copies device tensors whole, so they \
                 must be row-major (make it contiguous first)",
                layout.strides()
            ),
        });
    }
    let bytes = layout.numel() * dtype.size_bytes();
    if (tensor.accessible_bytes as usize) < bytes {
        return Err(Error::Shape {
            what: what.to_string(),
            reason: format!(
                "its elements take {bytes} bytes; accessible_bytes is {}",
                tensor.accessible_bytes
            ),
        });
    }
    let span = DeviceSpan {
        ptr: tensor.data as u64,
        bytes,
    };
    Ok((dtype, layout.shape().clone(), span))
}

/// A kiln tensor holding a copy of the host memory `tensor` describes.
///
/// # Safety
/// As [`described`].
pub(crate) unsafe fn read_tensor(tensor: &KilnTensor, what: &str) -> Result<Tensor> {
    // SAFETY: as this function's contract.
    let (dtype, layout) = unsafe { described(tensor, what) }?;
    let bytes: &[u8] = match tensor.accessible_bytes {
        0 => &[],
        // SAFETY: non-null (checked) and `accessible_bytes` readable by the contract.
        n => unsafe { std::slice::from_raw_parts(tensor.data as *const u8, n as usize) },
    };
    Tensor::from_host_bytes(dtype, &layout, bytes).map_err(|error| Error::Shape {
        what: what.to_string(),
        reason: error.to_string(),
    })
}

/// Copies `source` into the memory `tensor` describes, after checking its dtype, shape and
/// bounds; nothing is written on failure.
///
/// # Safety
/// As [`described`], with the bytes writable.
pub(crate) unsafe fn write_tensor(source: &Tensor, tensor: &KilnTensor, what: &str) -> Result<()> {
    // SAFETY: as this function's contract.
    let (dtype, layout) = unsafe { described(tensor, what) }?;
    if dtype != source.dtype() {
        return Err(Error::DType {
            what: what.to_string(),
            expected: source.dtype().to_string(),
            got: dtype.to_string(),
        });
    }
    if layout.shape() != source.shape() {
        return Err(Error::Shape {
            what: what.to_string(),
            reason: format!("expected shape {}, got {}", source.shape(), layout.shape()),
        });
    }
    let bytes: &mut [u8] = match tensor.accessible_bytes {
        0 => &mut [],
        // SAFETY: non-null (checked) and `accessible_bytes` writable by the contract.
        n => unsafe { std::slice::from_raw_parts_mut(tensor.data as *mut u8, n as usize) },
    };
    source
        .copy_to_host_bytes(&layout, bytes)
        .map_err(|error| Error::Shape {
            what: what.to_string(),
            reason: error.to_string(),
        })
}
