//! A compiled program of the session layer: an executable with the model's weights set, its
//! per-run inputs and states, and its outputs, each checked by name, dtype and shape before
//! the executable sees it.

use kiln_ir::{DType, InputKind, Shape, TensorType};
use kiln_runtime::{DeviceBuffer, DeviceIo, DeviceSpan, Executable, RunMode, Tensor};

use crate::error::{Error, Result};

/// A per-run input (or state) of a compiled program.
#[derive(Clone, Debug)]
pub struct ProgramInput {
    pub name: String,
    pub kind: InputKind,
    pub ty: TensorType,
}

impl ProgramInput {
    pub(crate) fn new(name: &str, kind: InputKind, ty: &TensorType) -> Self {
        ProgramInput {
            name: name.to_string(),
            kind,
            ty: ty.clone(),
        }
    }
}

/// A compiled program: an executable with the model's weights set. Inputs are copied into its
/// slots (from host or, on a device, device memory); a run updates its states in place (a
/// decode step appends to the KV cache); outputs are copied out into fresh host tensors,
/// caller's device memory or fresh device buffers.
pub struct Program {
    name: &'static str,
    exe: Box<dyn Executable>,
    mode: RunMode,
    inputs: Vec<ProgramInput>,
    outputs: Vec<(String, TensorType)>,
    arena_bytes: u64,
}

impl Program {
    /// A program named `name` over `exe` run per `mode`, with its per-run inputs and outputs.
    pub(crate) fn new(
        name: &'static str,
        (exe, mode): (Box<dyn Executable>, RunMode),
        (inputs, outputs): (Vec<ProgramInput>, Vec<(String, TensorType)>),
        arena_bytes: u64,
    ) -> Self {
        Program {
            name,
            exe,
            mode,
            inputs,
            outputs,
            arena_bytes,
        }
    }

    /// `prefill`, `decode`, `train` or `eval`.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The backend and device it runs on.
    pub fn describe(&self) -> String {
        self.exe.describe()
    }
    /// Bytes of its activation arena.
    pub fn arena_bytes(&self) -> u64 {
        self.arena_bytes
    }
    /// Its per-run inputs and states (parameters are set at compile time).
    pub fn inputs(&self) -> &[ProgramInput] {
        &self.inputs
    }
    /// Its outputs, then its writes (states after a run), by name, with their types.
    pub fn outputs(&self) -> &[(String, TensorType)] {
        &self.outputs
    }

    /// The type of output (or write) `name`.
    pub fn output(&self, name: &str) -> Result<&TensorType> {
        let known = || {
            (self.outputs.iter().map(|(n, _)| n.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        (self.outputs.iter().find(|(n, _)| n == name))
            .map(|(_, ty)| ty)
            .ok_or_else(|| Error::NotFound {
                what: "output",
                name: name.to_string(),
                known: known(),
            })
    }

    /// The input or state `name`.
    pub fn input(&self, name: &str) -> Result<&ProgramInput> {
        let known = || {
            (self.inputs.iter().map(|i| i.name.as_str()))
                .collect::<Vec<_>>()
                .join(", ")
        };
        (self.inputs.iter().find(|i| i.name == name)).ok_or_else(|| Error::NotFound {
            what: "input",
            name: name.to_string(),
            known: known(),
        })
    }

    /// Fails unless `(dtype, shape)`, given for `what` (`input` or `output`) `name`, is
    /// `expected`.
    fn check_type(
        &self,
        (what, name): (&str, &str),
        expected: &TensorType,
        (dtype, shape): (DType, &Shape),
    ) -> Result<()> {
        if dtype != expected.dtype {
            return Err(Error::DType {
                what: format!("{what} `{name}` of {}", self.name),
                expected: expected.dtype.to_string(),
                got: dtype.to_string(),
            });
        }
        if shape != &expected.shape {
            return Err(Error::Shape {
                what: format!("{what} `{name}` of {}", self.name),
                reason: format!("expected shape {}, got {shape}", expected.shape),
            });
        }
        Ok(())
    }

    /// Copies `tensor` into input `name`'s slot, after checking its dtype and shape.
    pub fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let ty = self.input(name)?.ty.clone();
        self.check_type(("input", name), &ty, (tensor.dtype(), tensor.shape()))?;
        Ok(self.exe.set(name, tensor)?)
    }

    /// Runs once; every per-run input must have been set.
    pub fn run(&mut self) -> Result<()> {
        Ok(self.exe.run(self.mode)?)
    }

    /// A fresh host tensor holding output (or write) `name`.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        self.output(name)?;
        Ok(self.exe.get(name)?)
    }

    /// The device ordinal and kiln's stream (a `CUstream` as a number) where the program runs
    /// on a device; `None` on the CPU.
    pub fn device_stream(&mut self) -> Option<(usize, u64)> {
        (self.exe.device_io()).map(|io| (io.ordinal(), io.stream_handle()))
    }

    /// The executable's device half, or an error naming `what` that needs it.
    fn device_io(&mut self, what: &str) -> Result<&mut dyn DeviceIo> {
        let name = self.name;
        self.exe.device_io().ok_or_else(|| Error::Device {
            what: what.to_string(),
            reason: format!("the {name} program runs on the CPU; it takes host memory"),
        })
    }

    /// Orders the program's next work (copies, runs) after the work issued so far on the
    /// caller's stream; for [`Order::Synchronous`], on a device, after the legacy default
    /// stream (CUDA's stream 0, where a caller without streams works).
    pub fn begin(&mut self, order: Order) -> Result<()> {
        match (order, self.exe.device_io()) {
            (Order::Stream(stream), _) => self.device_io("a stream")?.wait_for(stream)?,
            (Order::Synchronous, Some(io)) => io.wait_for(LEGACY_STREAM)?,
            (Order::Synchronous, None) => {}
        }
        Ok(())
    }

    /// Orders the caller's later work on its stream after the program's work issued so far,
    /// or, for [`Order::Synchronous`], waits for that work (nothing is pending on the CPU).
    pub fn end(&mut self, order: Order) -> Result<()> {
        match (order, self.exe.device_io()) {
            (Order::Stream(stream), _) => self.device_io("a stream")?.signal(stream)?,
            (Order::Synchronous, Some(io)) => io.synchronize()?,
            (Order::Synchronous, None) => {}
        }
        Ok(())
    }

    /// Copies device memory `src`, the dense row-major elements of a `(dtype, shape)` tensor,
    /// into input `name`'s slot on kiln's stream (see [`begin`](Self::begin)).
    pub fn set_device(&mut self, name: &str, ty: (DType, &Shape), src: DeviceSpan) -> Result<()> {
        let expected = self.input(name)?.ty.clone();
        self.check_type(("input", name), &expected, ty)?;
        let io = self.device_io(&format!("input `{name}`"))?;
        Ok(io.set_from_device(name, src)?)
    }

    /// Copies output (or write) `name` into device memory `dst`, described as a dense
    /// row-major `(dtype, shape)` tensor, on kiln's stream (see [`end`](Self::end)).
    pub fn get_device(&mut self, name: &str, ty: (DType, &Shape), dst: DeviceSpan) -> Result<()> {
        let expected = self.output(name)?.clone();
        self.check_type(("output", name), &expected, ty)?;
        let io = self.device_io(&format!("output `{name}`"))?;
        Ok(io.get_to_device(name, dst)?)
    }

    /// Output (or write) `name` in a fresh device buffer kiln owns, complete when this returns.
    pub fn get_buffer(&mut self, name: &str) -> Result<(DeviceBuffer, TensorType)> {
        let ty = self.output(name)?.clone();
        let io = self.device_io(&format!("output `{name}`"))?;
        let buffer = io.alloc(ty.size_bytes())?;
        io.get_to_device(name, buffer.span())?;
        io.synchronize()?;
        Ok((buffer, ty))
    }
}

/// CUDA's legacy default stream, as DLPack and the driver number it.
pub const LEGACY_STREAM: u64 = 1;

/// How a call that touches device memory is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// The call returns once its work is complete.
    Synchronous,
    /// The call's work runs after the work issued so far on the caller's stream (a `CUstream`
    /// as a number), and the work the caller issues there afterwards runs after it; the call
    /// returns without waiting.
    Stream(u64),
}
