//! `kiln.Program`: a compiled program. `run(**inputs)` copies each input into its slot, runs
//! once and returns every output and written state by name.

use std::sync::Arc;

use kiln_capi::session::{Order, Program, LEGACY_STREAM};
use kiln_ir::InputKind;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::dlpack::Owner;
use crate::errors::to_py;
use crate::tensor::{dtype_name, input_value, to_numpy, Input, PyTensor};
use crate::thread_bound::ThreadBound;

/// A compiled program of a model (`Model.compile`), used on the thread that made it.
#[pyclass(module = "kiln", name = "Program")]
pub struct PyProgram {
    pub(crate) program: ThreadBound<Program>,
}

/// `(shape, dtype)` of a type.
fn described<'py>(py: Python<'py>, ty: &kiln_ir::TensorType) -> PyResult<Bound<'py, PyTuple>> {
    let shape = PyTuple::new(py, ty.dims())?;
    PyTuple::new(
        py,
        [
            shape.into_any(),
            dtype_name(ty.dtype).into_pyobject(py)?.into_any(),
        ],
    )
}

impl PyProgram {
    /// Sets every keyword input, runs once, then reads the outputs with `outputs`. The memory
    /// of device inputs (DLPack producers' tensors) is held until kiln's copies out of it are
    /// done — also when a later input, the run or the outputs fail.
    fn run_with<R>(
        &mut self,
        inputs: Option<&Bound<'_, PyDict>>,
        outputs: impl FnOnce(&mut Program) -> PyResult<R>,
    ) -> PyResult<R> {
        let program = self.program.get_mut()?;
        let mut held: Vec<Arc<Owner>> = Vec::new();
        let result = set_and_run(program, inputs, &mut held).and_then(|()| outputs(program));
        if !held.is_empty() {
            // Copies out of the held memory may still be queued on kiln's stream.
            let synchronized = program.end(Order::Synchronous).map_err(to_py);
            drop(held);
            return result.and_then(|r| synchronized.map(|()| r));
        }
        result
    }
}

/// Sets every keyword input of `program` (device inputs' owners pushed to `held`), then runs
/// once.
fn set_and_run(
    program: &mut Program,
    inputs: Option<&Bound<'_, PyDict>>,
    held: &mut Vec<Arc<Owner>>,
) -> PyResult<()> {
    let device = program.device_stream();
    if let Some(inputs) = inputs {
        for (name, value) in inputs.iter() {
            let name: String = name.extract()?;
            // Unknown names are refused before any value is read.
            program.input(&name).map_err(to_py)?;
            match input_value(&value, &format!("input `{name}`"), device)? {
                Input::Host(tensor) => program.set(&name, &tensor).map_err(to_py)?,
                Input::Device {
                    input,
                    after_default,
                } => {
                    held.push(input.owner.clone());
                    if after_default {
                        program.begin(Order::Stream(LEGACY_STREAM)).map_err(to_py)?;
                    }
                    let ty = (input.dtype, &input.shape);
                    program.set_device(&name, ty, input.span).map_err(to_py)?;
                }
            }
        }
    }
    program.run().map_err(to_py)
}

#[pymethods]
impl PyProgram {
    /// "prefill", "decode", "train" or "eval".
    #[getter]
    fn name(&self) -> PyResult<&'static str> {
        Ok(self.program.get()?.name())
    }

    /// The backend and device it runs on.
    #[getter]
    fn device(&self) -> PyResult<String> {
        Ok(self.program.get()?.describe())
    }

    /// Bytes of its activation arena.
    #[getter]
    fn arena_bytes(&self) -> PyResult<u64> {
        Ok(self.program.get()?.arena_bytes())
    }

    /// `{name: (shape, dtype, kind)}` of its per-run inputs ("input") and states ("state",
    /// zero after compiling and carried between runs). Parameters are set at compile time.
    #[getter]
    fn inputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for input in self.program.get()?.inputs() {
            let kind = match input.kind {
                InputKind::State => "state",
                _ => "input",
            };
            let (shape, dtype) = described(py, &input.ty)?.extract::<(Py<PyAny>, String)>()?;
            dict.set_item(&input.name, (shape, dtype, kind))?;
        }
        Ok(dict)
    }

    /// `{name: (shape, dtype)}` of its outputs and written states.
    #[getter]
    fn outputs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        for (name, ty) in self.program.get()?.outputs() {
            dict.set_item(name, described(py, ty)?)?;
        }
        Ok(dict)
    }

    /// Runs once with the given inputs (NumPy arrays, kiln.Tensors or DLPack tensors, each
    /// copied into its slot — on the device from CUDA tensors of the program's device; inputs
    /// not given keep their last value) and returns every output and written state as a NumPy
    /// array.
    #[pyo3(signature = (**inputs))]
    fn run<'py>(
        &mut self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.run_with(inputs, |program| {
            let dict = PyDict::new(py);
            for (name, _) in program.outputs() {
                let tensor = program.get(name).map_err(to_py)?;
                dict.set_item(name, to_numpy(py, &tensor)?)?;
            }
            Ok(dict)
        })
    }

    /// As `run`, returning `kiln.Tensor`s: DLPack producers that `torch.from_dlpack` and
    /// `numpy.from_dlpack` take without copying (bfloat16 included). On a GPU they are CUDA
    /// memory of the program's device (its outputs copied there on the device, complete when
    /// this returns); on the CPU, host memory.
    #[pyo3(signature = (**inputs))]
    fn run_tensors<'py>(
        &mut self,
        py: Python<'py>,
        inputs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyDict>> {
        self.run_with(inputs, |program| {
            let device = program.device_stream();
            let names: Vec<String> = program.outputs().iter().map(|(n, _)| n.clone()).collect();
            let dict = PyDict::new(py);
            for name in names {
                let tensor = match device {
                    Some((ordinal, _)) => {
                        let (buffer, ty) = program.get_buffer(&name).map_err(to_py)?;
                        PyTensor::from_device(buffer, &ty, ordinal)
                    }
                    None => PyTensor::from_kiln(program.get(&name).map_err(to_py)?),
                };
                dict.set_item(name, tensor)?;
            }
            Ok(dict)
        })
    }

    fn __repr__(&self) -> PyResult<String> {
        let program = self.program.get()?;
        Ok(format!(
            "kiln.Program({}, {}, inputs: {})",
            program.name(),
            program.describe(),
            (program.inputs().iter())
                .map(|i| i.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}
