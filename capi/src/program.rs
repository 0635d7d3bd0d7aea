//! A compiled program of the session layer: an executable with the model's weights set, its
//! per-run inputs and states, and its outputs, each checked by name, dtype and shape before
//! the executable sees it.

use kiln_ir::{InputKind, TensorType};
use kiln_runtime::{Executable, RunMode, Tensor};

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
/// slots; a run updates its states in place (a decode step appends to the KV cache); outputs
/// are copied out as fresh host tensors.
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

    /// Copies `tensor` into input `name`'s slot, after checking its dtype and shape.
    pub fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let input = self.input(name)?;
        if tensor.dtype() != input.ty.dtype {
            return Err(Error::DType {
                what: format!("input `{name}` of {}", self.name),
                expected: input.ty.dtype.to_string(),
                got: tensor.dtype().to_string(),
            });
        }
        if tensor.shape() != &input.ty.shape {
            return Err(Error::Shape {
                what: format!("input `{name}` of {}", self.name),
                reason: format!("expected shape {}, got {}", input.ty.shape, tensor.shape()),
            });
        }
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
}
