//! DLPack: the structs of `dlpack.h` (v1.1, the version PyTorch 2.x and NumPy 2.x speak) and
//! the Python capsule protocol around them (`__dlpack__` / `__dlpack_device__`, capsules
//! named `dltensor` or `dltensor_versioned`, renamed `used_…` by the consumer that takes
//! them).
//!
//! Only the structs are written here; dlpark (a complete DLPack crate) was weighed and left
//! out: kiln needs the two managed-tensor layouts and nothing of its allocation framework.
//!
//! Ownership (the rule of DESIGN.md): an exported tensor's `manager_ctx` holds a share of the
//! memory's owner ([`Owner`]), freed by the deleter whoever calls it; an imported tensor is
//! owned by [`Imported`], whose drop calls the producer's deleter exactly once. No pointer's
//! ownership is inferred from its value.

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use kiln_ir::DType;
use kiln_runtime::{DeviceBuffer, Tensor};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

/// `DLDeviceType` codes kiln meets.
pub const DEVICE_CPU: i32 = 1;
pub const DEVICE_CUDA: i32 = 2;
pub const DEVICE_CUDA_HOST: i32 = 3;

/// `DLManagedTensorVersioned::flags`: the consumer must not write.
const FLAG_READ_ONLY: u64 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DLDataType {
    /// `kDLInt` 0, `kDLUInt` 1, `kDLFloat` 2, `kDLBfloat` 4.
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    /// Element strides; null means row-major.
    pub strides: *mut i64,
    pub byte_offset: u64,
}

#[repr(C)]
pub struct DLManagedTensor {
    pub dl_tensor: DLTensor,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

const LEGACY: &CStr = c"dltensor";
const LEGACY_USED: &CStr = c"used_dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";
const VERSIONED_USED: &CStr = c"used_dltensor_versioned";

/// The DLPack dtype of a kiln dtype.
pub fn dl_dtype(dtype: DType) -> DLDataType {
    let (code, bits) = match dtype {
        DType::F32 => (2, 32),
        DType::F64 => (2, 64),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::I32 => (0, 32),
        DType::I64 => (0, 64),
    };
    DLDataType {
        code,
        bits,
        lanes: 1,
    }
}

/// The kiln dtype of a DLPack dtype, or a TypeError naming it.
fn kiln_dtype(dtype: DLDataType) -> PyResult<DType> {
    match (dtype.code, dtype.bits, dtype.lanes) {
        (2, 32, 1) => Ok(DType::F32),
        (2, 64, 1) => Ok(DType::F64),
        (2, 16, 1) => Ok(DType::F16),
        (4, 16, 1) => Ok(DType::BF16),
        (0, 32, 1) => Ok(DType::I32),
        (0, 64, 1) => Ok(DType::I64),
        (code, bits, lanes) => Err(PyTypeError::new_err(format!(
            "DLPack dtype (code {code}, {bits} bits, {lanes} lanes) has no kiln dtype; kiln \
             takes float32/64, float16, bfloat16, int32 and int64"
        ))),
    }
}

/// Who keeps an exported or imported tensor's memory alive.
pub enum Owner {
    /// A kiln host tensor (its storage).
    Kiln(Tensor),
    /// Device memory kiln allocated for a program's output (freed with the last share).
    Device(DeviceBuffer),
    /// A tensor another library exported to kiln (held for its drop, which releases it).
    #[allow(dead_code)]
    Imported(Imported),
}

/// A managed tensor taken from a capsule; dropping it calls the producer's deleter once.
pub enum Imported {
    Legacy(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

// SAFETY: DLPack lets a deleter run on any thread, and kiln only reads the descriptor.
unsafe impl Send for Imported {}
// SAFETY: the descriptor is read-only after import.
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the pointers came from a consumed capsule and are released only here.
        unsafe {
            match *self {
                Imported::Legacy(m) => {
                    if let Some(deleter) = (*m).deleter {
                        deleter(m)
                    }
                }
                Imported::Versioned(m) => {
                    if let Some(deleter) = (*m).deleter {
                        deleter(m)
                    }
                }
            }
        }
    }
}

/// What a tensor's memory looks like: the fields of a `DLTensor`, owned.
#[derive(Clone, Debug)]
pub struct Described {
    /// Address of the first element (byte offset applied).
    pub data: usize,
    pub device: DLDevice,
    pub dtype: DType,
    pub shape: Vec<i64>,
    /// Element strides, one per dimension.
    pub strides: Vec<i64>,
    pub read_only: bool,
}

impl Described {
    /// Bytes from `data` that the elements reach (0 for an empty tensor), or a ValueError for
    /// negative or overflowing numbers.
    pub fn extent_bytes(&self) -> PyResult<usize> {
        let bad = || PyValueError::new_err("a DLPack tensor with negative or overflowing shape");
        let mut last: usize = 0;
        for (&dim, &stride) in self.shape.iter().zip(&self.strides) {
            let (dim, stride) = (usize::try_from(dim), usize::try_from(stride));
            let (dim, stride) = (dim.map_err(|_| bad())?, stride.map_err(|_| bad())?);
            if dim == 0 {
                return Ok(0);
            }
            last = (dim - 1)
                .checked_mul(stride)
                .and_then(|reach| last.checked_add(reach))
                .ok_or_else(bad)?;
        }
        (last.checked_add(1))
            .and_then(|n| n.checked_mul(self.dtype.size_bytes()))
            .ok_or_else(bad)
    }
}

/// Reads `tensor`'s fields (`ndim` bounded before the shape is read).
///
/// # Safety
/// `tensor` is a valid `DLTensor` of a live managed tensor.
unsafe fn describe(tensor: &DLTensor, read_only: bool) -> PyResult<Described> {
    let ndim = usize::try_from(tensor.ndim)
        .ok()
        .filter(|&n| n <= 64)
        .ok_or_else(|| {
            PyValueError::new_err(format!("DLPack ndim {} is out of range", tensor.ndim))
        })?;
    let dtype = kiln_dtype(tensor.dtype)?;
    let read = |p: *const i64| match (ndim, p.is_null()) {
        (0, _) | (_, true) => Vec::new(),
        // SAFETY: `ndim` numbers by the DLPack contract.
        (n, false) => unsafe { std::slice::from_raw_parts(p, n) }.to_vec(),
    };
    let shape = read(tensor.shape);
    if shape.len() != ndim {
        return Err(PyValueError::new_err("a DLPack tensor without a shape"));
    }
    let strides = match tensor.strides.is_null() {
        false => read(tensor.strides),
        true => {
            let mut strides = vec![1i64; ndim];
            for axis in (0..ndim.saturating_sub(1)).rev() {
                strides[axis] = strides[axis + 1].saturating_mul(shape[axis + 1].max(1));
            }
            strides
        }
    };
    let offset = usize::try_from(tensor.byte_offset)
        .map_err(|_| PyValueError::new_err("DLPack byte_offset beyond the address space"))?;
    Ok(Described {
        data: (tensor.data as usize).wrapping_add(offset),
        device: tensor.device,
        dtype,
        shape,
        strides,
        read_only,
    })
}

/// Takes the managed tensor out of `capsule` (renaming it used), or fails naming why.
pub fn import_capsule(capsule: &Bound<'_, PyAny>) -> PyResult<(Imported, Described)> {
    let object = capsule.as_ptr();
    // SAFETY: the capsule calls take any object and check its type and name.
    unsafe {
        if ffi::PyCapsule_IsValid(object, VERSIONED.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(object, VERSIONED.as_ptr())
                as *mut DLManagedTensorVersioned;
            if managed.is_null() || (*managed).version.major != 1 {
                let major = managed.as_ref().map_or(0, |m| m.version.major);
                return Err(PyBufferError::new_err(format!(
                    "DLPack major version {major}; kiln reads version 1"
                )));
            }
            let read_only = (*managed).flags & FLAG_READ_ONLY != 0;
            let described = describe(&(*managed).dl_tensor, read_only)?;
            ffi::PyCapsule_SetName(object, VERSIONED_USED.as_ptr());
            return Ok((Imported::Versioned(managed), described));
        }
        if ffi::PyCapsule_IsValid(object, LEGACY.as_ptr()) == 1 {
            let managed =
                ffi::PyCapsule_GetPointer(object, LEGACY.as_ptr()) as *mut DLManagedTensor;
            if managed.is_null() {
                return Err(PyBufferError::new_err("an empty DLPack capsule"));
            }
            let described = describe(&(*managed).dl_tensor, false)?;
            ffi::PyCapsule_SetName(object, LEGACY_USED.as_ptr());
            return Ok((Imported::Legacy(managed), described));
        }
    }
    Err(PyTypeError::new_err(
        "__dlpack__ returned something other than an unused DLPack capsule",
    ))
}

/// What an exported managed tensor's `manager_ctx` points at: the owner share and the shape
/// and strides its `DLTensor` points into.
struct Context {
    _owner: Arc<Owner>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

fn tensor_of(described: &Described, context: &mut Context) -> DLTensor {
    DLTensor {
        data: described.data as *mut c_void,
        device: described.device,
        ndim: described.shape.len() as i32,
        dtype: dl_dtype(described.dtype),
        shape: context.shape.as_mut_ptr(),
        strides: context.strides.as_mut_ptr(),
        byte_offset: 0,
    }
}

unsafe extern "C" fn delete_legacy(managed: *mut DLManagedTensor) {
    // SAFETY: made by `export` from a Box; called once by the consumer or the capsule.
    unsafe {
        drop(Box::from_raw((*managed).manager_ctx as *mut Context));
        drop(Box::from_raw(managed));
    }
}

unsafe extern "C" fn delete_versioned(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: as `delete_legacy`.
    unsafe {
        drop(Box::from_raw((*managed).manager_ctx as *mut Context));
        drop(Box::from_raw(managed));
    }
}

/// Frees a capsule's managed tensor unless a consumer took it (renamed it used).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: the capsule is ours; its pointer is a managed tensor made by `export`.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            delete_versioned(managed as *mut DLManagedTensorVersioned);
        } else if ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let managed = ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            delete_legacy(managed as *mut DLManagedTensor);
        }
    }
}

/// A fresh capsule of `described` memory kept alive by `owner`: versioned when the consumer
/// reads version 1 (`max_version`), else the legacy layout every consumer reads.
pub fn export(
    py: Python<'_>,
    owner: Arc<Owner>,
    described: &Described,
    versioned: bool,
) -> PyResult<Py<PyAny>> {
    let mut context = Box::new(Context {
        _owner: owner,
        shape: described.shape.clone(),
        strides: described.strides.clone(),
    });
    let tensor = tensor_of(described, &mut context);
    let context = Box::into_raw(context) as *mut c_void;
    let (pointer, name) = match versioned {
        true => {
            let managed = Box::new(DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 1 },
                manager_ctx: context,
                deleter: Some(delete_versioned),
                flags: if described.read_only {
                    FLAG_READ_ONLY
                } else {
                    0
                },
                dl_tensor: tensor,
            });
            (Box::into_raw(managed) as *mut c_void, VERSIONED)
        }
        false => {
            let managed = Box::new(DLManagedTensor {
                dl_tensor: tensor,
                manager_ctx: context,
                deleter: Some(delete_legacy),
            });
            (Box::into_raw(managed) as *mut c_void, LEGACY)
        }
    };
    // SAFETY: a non-null pointer with a static name and a destructor that frees it.
    let capsule = unsafe { ffi::PyCapsule_New(pointer, name.as_ptr(), Some(capsule_destructor)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not made, so the managed tensor is still ours to free.
        unsafe {
            match versioned {
                true => delete_versioned(pointer as *mut DLManagedTensorVersioned),
                false => delete_legacy(pointer as *mut DLManagedTensor),
            }
        }
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a new reference from PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}
