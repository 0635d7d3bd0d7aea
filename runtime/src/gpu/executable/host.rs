//! What the host sees of a GPU executable: synchronization (with the fault words and failed
//! releases reported), copies of inputs in and outputs out, and its sizes.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_ir::TensorType;
use kiln_kernels::gpu::Addr;

use super::super::{error, Driver};
use super::{issuing, GpuExecutable};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::interpret::type_of;
use crate::placed::bytes;
use crate::placed::bytes::read_view;
use crate::placed::ValueLayout;
use crate::program::SlotKind;
use crate::tensor::Tensor;

impl<D: Driver> GpuExecutable<D> {
    /// Waits for everything issued on every stream, then reports what went wrong meanwhile: a
    /// raised fault word (an invalid index met by a kernel, named by its op; the words are
    /// cleared) or a failed release of device resources.
    pub fn synchronize(&self) -> Result<()> {
        for stream in &self.streams {
            self.device.synchronize(stream)?;
        }
        self.device.check_released()?;
        self.check_faults()
    }

    fn check_faults(&self) -> Result<()> {
        let slot = &self.slots[self.program.fault_slot as usize];
        let mut words = vec![0u8; slot.bytes];
        // The slot holds exactly these words; the streams are idle.
        self.device
            .download(&mut words, slot.ptr, Some(&self.streams[0]))?;
        let raised = words.chunks_exact(4).position(|word| word != [0; 4]);
        let Some(step) = raised else {
            return Ok(());
        };
        // The slot's own range; the streams are idle.
        let main = Some(&self.streams[0]);
        self.device.fill_and_wait(slot.ptr, 0, slot.bytes, main)?;
        let raiser = (self.program.steps.iter()).find(|s| s.schedule == Some(step));
        let op = raiser.map_or("?", |s| s.op.as_str());
        Err(Error::DeviceFault {
            program: self.program.name.clone(),
            step,
            op: op.to_string(),
        })
    }

    /// The main stream (timing events go there).
    pub fn stream(&self) -> &D::Stream {
        &self.streams[0]
    }

    pub fn device(&self) -> &Arc<D> {
        &self.device
    }

    /// Launches per run (kernels, GEMMs and copies).
    pub fn launches(&self) -> usize {
        self.program.launch_count()
    }

    /// Bytes of the plan's arena (a group's arena holds the largest member's), and the plan's
    /// lower bound of live bytes.
    pub fn arena_bytes(&self) -> (u64, u64) {
        (self.program.arena_bytes, self.program.lower_bound_bytes)
    }

    /// Bytes allocated per slot kind: (params, state, per-run inputs, outputs, arena).
    pub fn slot_bytes(&self) -> BTreeMap<&'static str, u64> {
        let mut bytes = BTreeMap::new();
        for slot in &self.program.slots {
            let kind = match slot.kind {
                SlotKind::Arena => "arena",
                SlotKind::Input(kiln_ir::InputKind::Param) => "params",
                SlotKind::Input(kiln_ir::InputKind::State) => "state",
                SlotKind::Input(kiln_ir::InputKind::Input) => "inputs",
                SlotKind::Output => "outputs",
                SlotKind::Faults => "fault words",
            };
            *bytes.entry(kind).or_insert(0) += slot.bytes;
        }
        let workspaces = self.gemm_workspaces.iter().map(|w| w.bytes as u64).sum();
        bytes.insert("gemm workspaces", workspaces);
        bytes
    }

    /// Writes the graph makes in their input's slot, and writes copied back after the run.
    pub fn writes(&self) -> (&[String], &[String]) {
        (&self.program.in_place_writes, &self.program.copied_writes)
    }

    pub(super) fn input(&self, name: &str) -> Result<(u32, &TensorType)> {
        self.program
            .inputs
            .get(name)
            .map(|(slot, ty)| (*slot, ty))
            .ok_or_else(|| Error::Graph {
                what: format!("program `{}`", self.program.name),
                reason: format!("has no input `{name}`"),
            })
    }

    /// Where output `name` (or input slot `name`) lies, and its layout there.
    pub(super) fn output_place(&self, name: &str) -> Result<(Addr, ValueLayout)> {
        Ok(match self.program.outputs.get(name) {
            Some(t) => (t.base, t.layout.clone()),
            None => {
                let (slot, ty) = self.input(name)?;
                (Addr { slot, offset: 0 }, ValueLayout::contiguous(ty))
            }
        })
    }

    /// Copies `tensor` into the slot of graph input `name` (after the work in flight; in a
    /// group, a shared slot is every member's). Setting a param also sets its derived copies
    /// (`Graph::derive`, cast on the host); a copy is not set directly.
    pub fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        self.derived.refuse_direct(name, "set")?;
        self.upload_input(name, tensor)?;
        for (copy, cast) in self.derived.casts(name, tensor)? {
            self.upload_input(&copy, &cast)?;
        }
        Ok(())
    }

    /// Copies `tensor` into input `name`'s slot (see [`GpuExecutable::set`]).
    fn upload_input(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        let (slot, ty) = self.input(name)?;
        if tensor.dtype() != ty.dtype || tensor.shape() != &ty.shape {
            return Err(Error::InputType {
                name: name.to_string(),
                expected: Box::new(ty.clone()),
                found: Box::new(type_of(tensor)),
            });
        }
        self.index_rules.check(name, tensor)?;
        let dense = tensor.contiguous()?;
        let guard = dense.storage().read()?;
        let size = dense.dtype().size_bytes();
        let all = bytes::of_data(guard.data());
        let host = &all[dense.offset() * size..(dense.offset() + dense.numel()) * size];
        let _issuing = issuing::<D>(&self.issue)?;
        self.synchronize()?;
        let dst = self.slots[slot as usize].ptr;
        // The slot holds exactly the input's bytes; the streams are idle.
        (self.device.upload(dst, host, &self.streams[0]))
            .map_err(|e| error(D::BACKEND, format!("copy input `{name}` to the device"), e))
    }

    /// Fills the slot of graph input `name`, and a param's derived copies, with zero bytes on
    /// the device (after the work in flight).
    pub fn zero(&mut self, name: &str) -> Result<()> {
        self.derived.refuse_direct(name, "zero")?;
        let copies: Vec<String> = self.derived.copies(name).map(|(c, _)| c.into()).collect();
        for name in std::iter::once(name).chain(copies.iter().map(String::as_str)) {
            self.zero_slot(name)?;
        }
        Ok(())
    }

    fn zero_slot(&mut self, name: &str) -> Result<()> {
        let (slot, _) = self.input(name)?;
        let _issuing = issuing::<D>(&self.issue)?;
        self.synchronize()?;
        let slot = &self.slots[slot as usize];
        // The slot's own range; the streams are idle.
        (self
            .device
            .fill_and_wait(slot.ptr, 0, slot.bytes, Some(&self.streams[0])))
        .map_err(|e| error(D::BACKEND, format!("zero input `{name}` on the device"), e))
    }

    /// A fresh CPU tensor with output `name` (or input slot `name`: a param or state after
    /// the runs so far), after the work in flight.
    pub fn get(&self, name: &str) -> Result<Tensor> {
        let (addr, layout) = self.output_place(name)?;
        let _issuing = issuing::<D>(&self.issue)?;
        self.synchronize()?;
        let slot = &self.slots[addr.slot as usize];
        let len = slot.bytes - addr.offset as usize;
        let mut host = bytes::aligned_zeros(len);
        let host_bytes = bytes::prefix_mut(&mut host, len);
        // The range lies inside the slot; the streams are idle.
        (self
            .device
            .download(host_bytes, self.address(addr), Some(&self.streams[0])))
        .map_err(|e| error(D::BACKEND, format!("copy `{name}` from the device"), e))?;
        let source = read_view(host_bytes, &layout)?;
        let out = Tensor::zeros(layout.shape().clone(), layout.dtype, Device::Cpu);
        out.write_with(|mut dst| kiln_kernels::copy::copy(&source, &mut dst))??;
        Ok(out)
    }
}
