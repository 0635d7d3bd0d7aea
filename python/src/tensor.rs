//! `kiln.Tensor`: memory kiln shares through DLPack — a kiln host tensor or device buffer (a
//! program's output) or a tensor another library exported (`kiln.from_dlpack`) — and the
//! conversions between Python values and program inputs.
//!
//! Zero-copy where DLPack allows it: exporting a `kiln.Tensor` or importing one never copies.
//! A program's inputs are copied into its slots — on the device, from a CUDA tensor, when
//! the program runs there — and its outputs are copied out of its arena: into NumPy arrays,
//! or into memory kiln allocates for a `kiln.Tensor` (on the program's device), which
//! `torch.from_dlpack` then shares. Nothing outside holds an address into kiln's arenas.

use std::sync::Arc;

use half::f16;
use kiln_ir::{DType, Layout, Shape, TensorType};
use kiln_runtime::{DeviceBuffer, DeviceSpan, Tensor};
use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::dlpack::{self, Described, Owner, DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_HOST};
use crate::errors::to_py;

/// NumPy's name of a kiln dtype.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        DType::I32 => "int32",
        DType::I64 => "int64",
    }
}

/// A tensor shared through DLPack (see the module doc). Immutable: its memory belongs to its
/// owner, which this object keeps alive as long as it or any export of it lives.
#[pyclass(module = "kiln", name = "Tensor", frozen)]
pub struct PyTensor {
    owner: Arc<Owner>,
    described: Described,
}

impl PyTensor {
    /// Shares `tensor` (a kiln host tensor) without copying.
    pub fn from_kiln(tensor: Tensor) -> Self {
        let size = tensor.dtype().size_bytes();
        let described = Described {
            data: tensor.storage().address() + tensor.offset() * size,
            device: dlpack::DLDevice {
                device_type: DEVICE_CPU,
                device_id: 0,
            },
            dtype: tensor.dtype(),
            shape: tensor.dims().iter().map(|&d| d as i64).collect(),
            strides: tensor.strides().iter().map(|&s| s as i64).collect(),
            read_only: false,
        };
        PyTensor {
            owner: Arc::new(Owner::Kiln(tensor)),
            described,
        }
    }

    /// Shares `buffer`, kiln device memory of CUDA device `ordinal` holding a dense `ty`.
    pub fn from_device(buffer: DeviceBuffer, ty: &TensorType, ordinal: usize) -> Self {
        let described = Described {
            data: buffer.ptr() as usize,
            device: dlpack::DLDevice {
                device_type: DEVICE_CUDA,
                device_id: ordinal as i32,
            },
            dtype: ty.dtype,
            shape: ty.dims().iter().map(|&d| d as i64).collect(),
            strides: (ty.shape.contiguous_strides().iter())
                .map(|&s| s as i64)
                .collect(),
            read_only: false,
        };
        PyTensor {
            owner: Arc::new(Owner::Device(buffer)),
            described,
        }
    }

    /// As a program input on CUDA device `ordinal`: its device range when it is CUDA memory
    /// of that device (row-major), else `None` (host memory); other devices are refused.
    fn device_input(&self, what: &str, ordinal: usize) -> PyResult<Option<DeviceInput>> {
        let described = &self.described;
        if self.is_host() {
            return Ok(None);
        }
        // Checks the shape and strides (no negative or overflowing numbers) first.
        let bytes = described.extent_bytes()?;
        if described.device
            != (dlpack::DLDevice {
                device_type: DEVICE_CUDA,
                device_id: ordinal as i32,
            })
        {
            return Err(PyValueError::new_err(format!(
                "{what} is on {}; the program runs on cuda:{ordinal}",
                self.device()
            )));
        }
        let shape = Shape::from(
            described
                .shape
                .iter()
                .map(|&d| d as usize)
                .collect::<Vec<_>>(),
        );
        let strides: Vec<usize> = described.strides.iter().map(|&s| s as usize).collect();
        if described.strides.iter().any(|&s| s < 0) || !shape.is_contiguous(&strides) {
            return Err(PyValueError::new_err(format!(
                "{what} is a strided CUDA tensor (strides {:?}); kiln copies device tensors \
                 whole, so pass a contiguous one (tensor.contiguous())",
                described.strides
            )));
        }
        Ok(Some(DeviceInput {
            dtype: described.dtype,
            shape,
            span: DeviceSpan {
                ptr: described.data as u64,
                bytes,
            },
            owner: self.owner.clone(),
        }))
    }

    fn is_host(&self) -> bool {
        matches!(
            self.described.device.device_type,
            DEVICE_CPU | DEVICE_CUDA_HOST
        )
    }

    /// A kiln host tensor with these elements: the tensor itself when kiln owns it, else a
    /// checked copy of the host memory (device memory is refused, naming `what`).
    pub fn to_kiln(&self, what: &str) -> PyResult<Tensor> {
        match &*self.owner {
            Owner::Kiln(tensor) => return Ok(tensor.clone()),
            Owner::Device(buffer) => {
                // kiln's own device memory: complete (its program synchronized), so a plain
                // copy reads it.
                let bytes = buffer.to_host().map_err(|e| to_py(e.into()))?;
                let dims: Vec<usize> = self.described.shape.iter().map(|&d| d as usize).collect();
                let layout = Layout::contiguous(Shape::from(dims));
                return Tensor::from_host_bytes(self.described.dtype, &layout, &bytes)
                    .map_err(|e| PyValueError::new_err(format!("{what}: {e}")));
            }
            Owner::Imported(_) => {}
        }
        if !self.is_host() {
            return Err(PyValueError::new_err(format!(
                "{what} is on {}; only host inputs can be read here (a program on the CPU, \
                 numpy()): copy it to the CPU first, e.g. tensor.cpu()",
                self.device()
            )));
        }
        let described = &self.described;
        let extent = described.extent_bytes()?;
        let bytes: &[u8] = match extent {
            0 => &[],
            // SAFETY: the producer's DLPack contract makes `extent` bytes from `data` readable
            // while the imported tensor (owned by `self.owner`) lives.
            n => unsafe { std::slice::from_raw_parts(described.data as *const u8, n) },
        };
        let dims: Vec<usize> = described.shape.iter().map(|&d| d as usize).collect();
        let strides: Vec<usize> = described.strides.iter().map(|&s| s as usize).collect();
        let layout = Layout::new(Shape::from(dims), &strides, 0)
            .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
        Tensor::from_host_bytes(described.dtype, &layout, bytes)
            .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
    }
}

#[pymethods]
impl PyTensor {
    /// Dimensions.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.described.shape)
    }

    /// Strides in elements, not bytes.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.described.strides)
    }

    /// NumPy's name of the dtype ("float32", "int64", "bfloat16", ...).
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.described.dtype)
    }

    /// "cpu", "cuda:N", or the DLPack device of other memory ("dlpack device type T:N").
    #[getter]
    fn device(&self) -> String {
        match self.described.device {
            dlpack::DLDevice {
                device_type: DEVICE_CUDA,
                device_id,
            } => format!("cuda:{device_id}"),
            dlpack::DLDevice {
                device_type: DEVICE_CPU | DEVICE_CUDA_HOST,
                ..
            } => "cpu".to_string(),
            dlpack::DLDevice {
                device_type,
                device_id,
            } => format!("dlpack device type {device_type}:{device_id}"),
        }
    }

    /// Address of the first element: equal to the producer's when the memory is shared.
    #[getter]
    fn data_ptr(&self) -> usize {
        self.described.data
    }

    /// A NumPy array holding a copy of the elements (host tensors and kiln's CUDA outputs).
    fn numpy(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        to_numpy(py, &self.to_kiln("the tensor")?)
    }

    /// The DLPack protocol: a fresh capsule sharing this tensor's memory (never a copy).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Py<PyAny>> {
        // kiln has no work pending on any stream for this memory: any consumer stream is
        // already ordered after it.
        let _ = stream;
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "kiln.Tensor exports without copying; copy=True is not offered",
            ));
        }
        let device = self.described.device;
        if let Some(wanted) = dl_device {
            if wanted != (device.device_type, device.device_id) {
                return Err(PyBufferError::new_err(format!(
                    "the tensor is on DLPack device {:?}, not {wanted:?}; kiln does not move it",
                    (device.device_type, device.device_id)
                )));
            }
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        dlpack::export(py, self.owner.clone(), &self.described, versioned)
    }

    /// The DLPack protocol: `(device_type, device_id)`.
    fn __dlpack_device__(&self) -> (i32, i32) {
        (
            self.described.device.device_type,
            self.described.device.device_id,
        )
    }

    fn __repr__(&self) -> String {
        format!(
            "kiln.Tensor(shape={:?}, dtype={}, device={})",
            self.described.shape,
            self.dtype(),
            self.device()
        )
    }
}

/// `kiln.from_dlpack(obj)`: shares the memory of any object with `__dlpack__` (a PyTorch
/// tensor, a NumPy array, a kiln.Tensor) without copying.
#[pyfunction]
pub fn from_dlpack(object: &Bound<'_, PyAny>) -> PyResult<PyTensor> {
    take(object, None)
}

/// The tensor `object` exports; for CUDA memory, `stream` (a `CUstream` as a number) is the
/// consumer's stream, which the producer orders after its pending work (DLPack's protocol).
fn take(object: &Bound<'_, PyAny>, stream: Option<u64>) -> PyResult<PyTensor> {
    let py = object.py();
    if !object.hasattr("__dlpack__")? {
        return Err(PyTypeError::new_err(format!(
            "{} has no __dlpack__ method",
            object.get_type().name()?
        )));
    }
    let kwargs = PyDict::new(py);
    if let Some(stream) = stream {
        kwargs.set_item("stream", stream)?;
    }
    kwargs.set_item("max_version", (1u32, 1u32))?;
    let capsule = match object.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(capsule) => capsule,
        // A producer older than DLPack 1.0 takes no max_version.
        Err(error) if error.is_instance_of::<PyTypeError>(py) => {
            let _ = kwargs.del_item("max_version");
            object.call_method("__dlpack__", (), Some(&kwargs))?
        }
        Err(error) => return Err(error),
    };
    let (imported, described) = dlpack::import_capsule(&capsule)?;
    Ok(PyTensor {
        owner: Arc::new(Owner::Imported(imported)),
        described,
    })
}

/// A program input in device memory: its type and range, and what keeps the range alive.
pub struct DeviceInput {
    pub dtype: DType,
    pub shape: Shape,
    pub span: DeviceSpan,
    pub owner: Arc<Owner>,
}

/// A program input: host elements, or device memory of the program's device.
pub enum Input {
    Host(Tensor),
    /// `after_default`: a `kiln.Tensor`, whose memory was shared without a stream handshake,
    /// so kiln orders its copy after the legacy default stream (where PyTorch works unless
    /// told otherwise); work on another stream must be synchronized by the caller.
    Device {
        input: DeviceInput,
        after_default: bool,
    },
}

/// A typed NumPy array's elements as a kiln host tensor (one copy, any strides).
fn typed<T: numpy::Element + kiln_kernels::Element>(array: &Bound<'_, PyAny>) -> Option<Tensor> {
    let array = array.cast::<PyArrayDyn<T>>().ok()?;
    let read = array.try_readonly().ok()?;
    let view = read.as_array();
    let values: Vec<T> = view.iter().copied().collect();
    Tensor::from_vec(values, view.shape()).ok()
}

/// The value of a program input: a NumPy array, a `kiln.Tensor` or any DLPack producer.
/// For a program on CUDA device `ordinal` whose stream is `stream`, CUDA memory of that
/// device stays there (a producer orders its pending work before `stream`); everything else
/// becomes a kiln host tensor. `what` names the value in errors.
pub fn input_value(
    value: &Bound<'_, PyAny>,
    what: &str,
    device: Option<(usize, u64)>,
) -> PyResult<Input> {
    let on_device = |tensor: &PyTensor, after_default: bool| -> PyResult<Input> {
        match device {
            Some((ordinal, _)) => match tensor.device_input(what, ordinal)? {
                Some(input) => Ok(Input::Device {
                    input,
                    after_default,
                }),
                None => Ok(Input::Host(tensor.to_kiln(what)?)),
            },
            None => Ok(Input::Host(tensor.to_kiln(what)?)),
        }
    };
    if let Ok(tensor) = value.cast::<PyTensor>() {
        // Its memory may have been written through another export since: order kiln's copy
        // after the legacy default stream, where PyTorch works unless told otherwise.
        return on_device(tensor.get(), true);
    }
    let exported_on_cuda = value.cast::<PyUntypedArray>().is_err()
        && value.hasattr("__dlpack_device__")?
        && value
            .call_method0("__dlpack_device__")?
            .extract::<(i32, i32)>()?
            .0
            == DEVICE_CUDA;
    if let (true, Some((_, stream))) = (exported_on_cuda, device) {
        return on_device(&take(value, Some(stream))?, false);
    }
    input_tensor(value, what).map(Input::Host)
}

/// The value of a program input as a kiln host tensor (see [`input_value`]).
pub fn input_tensor(value: &Bound<'_, PyAny>, what: &str) -> PyResult<Tensor> {
    if let Ok(tensor) = value.cast::<PyTensor>() {
        return tensor.get().to_kiln(what);
    }
    if let Ok(array) = value.cast::<PyUntypedArray>() {
        let found = typed::<f32>(value)
            .or_else(|| typed::<f64>(value))
            .or_else(|| typed::<f16>(value))
            .or_else(|| typed::<i32>(value))
            .or_else(|| typed::<i64>(value));
        return found.ok_or_else(|| {
            let dtype = array.dtype().to_string();
            PyTypeError::new_err(format!(
                "{what} is a NumPy array of {dtype}; kiln takes float32, float64, float16, \
                 int32 and int64"
            ))
        });
    }
    if value.hasattr("__dlpack__")? {
        return from_dlpack(value)?.to_kiln(what);
    }
    Err(PyTypeError::new_err(format!(
        "{what} is a {}; expected a NumPy array, a kiln.Tensor or a DLPack tensor (e.g. torch)",
        value.get_type().name()?
    )))
}

/// A NumPy array holding a copy of `tensor`.
pub fn to_numpy(py: Python<'_>, tensor: &Tensor) -> PyResult<Py<PyAny>> {
    fn make<T: numpy::Element + kiln_kernels::Element>(
        py: Python<'_>,
        tensor: &Tensor,
    ) -> PyResult<Py<PyAny>> {
        let values = tensor.to_vec::<T>().map_err(|e| to_py(e.into()))?;
        let array = numpy::PyArray1::from_vec(py, values);
        Ok(array.reshape(tensor.dims())?.into_any().unbind())
    }
    match tensor.dtype() {
        DType::F32 => make::<f32>(py, tensor),
        DType::F64 => make::<f64>(py, tensor),
        DType::F16 => make::<f16>(py, tensor),
        DType::I32 => make::<i32>(py, tensor),
        DType::I64 => make::<i64>(py, tensor),
        DType::BF16 => Err(PyTypeError::new_err(
            "a bfloat16 tensor has no NumPy dtype; use Program.run_tensors and \
             torch.from_dlpack",
        )),
    }
}
