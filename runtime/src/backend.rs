//! The backends a planned program runs on, behind one contract: memory allocated once (the
//! arena, parameter, state and I/O slots), inputs copied into their slots, each run either
//! eager (every launch issued) or a replay of a recording made once (a CUDA graph on the GPU;
//! a list of launches with bound addresses on the CPU), state carried between runs, results
//! copied out. The GPU backends share their host logic ([`crate::gpu::GpuExecutable`]): CUDA,
//! and HIP where kiln is built with the `hip` feature.

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_ir::Graph;
use kiln_planner::Plan;

use crate::collective::Communicator;
use crate::cuda::{CudaDevice, CudaExecutable};
use crate::device_io::DeviceIo;
use crate::error::Result;
use crate::group::{ExecutableGroup, GroupMemory};
use crate::planned::CpuExecutable;
use crate::tensor::Tensor;
use crate::workspaces::Workspaces;

/// How a program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// Every launch issued now.
    Eager,
    /// A recording (captured on first use) replayed.
    Graph,
}

/// A planned program bound to a backend's memory.
pub trait Executable {
    /// The backend and device, for reports.
    fn describe(&self) -> String;
    /// Copies `tensor` into the slot of graph input `name` (param, per-run input or state).
    fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()>;
    /// Fills graph input `name` with zeros where it lives, with no host tensor to copy (fresh
    /// optimizer moments, empty KV caches: gigabytes on a large model).
    fn zero(&mut self, name: &str) -> Result<()>;
    /// Runs the program once; the graph's writes update their input slots.
    fn run(&mut self, mode: RunMode) -> Result<()>;
    /// A fresh CPU tensor holding output `name`, or the current contents of input `name`.
    fn get(&self, name: &str) -> Result<Tensor>;
    /// Device copies and stream ordering, where the program runs on a device (not the CPU).
    fn device_io(&mut self) -> Option<&mut dyn DeviceIo> {
        None
    }
    /// Makes the program's `all_reduce` ops sum over `communicator`'s ranks, this executable
    /// being rank `communicator.rank()`. The CPU executable sums through `communicator` itself
    /// (until then, in a world of one); a device executable's collectives always go through
    /// its device's communicator (NCCL), so this only checks that it is that rank of a world
    /// of that size. An executable that cannot take part in collectives says so.
    fn join(&mut self, communicator: Arc<dyn Communicator>) -> Result<()> {
        Err(crate::Error::Collective {
            rank: communicator.rank(),
            reason: format!("{} runs in a world of one rank", self.describe()),
        })
    }
}

/// Where programs run.
#[derive(Clone)]
pub enum Backend {
    /// The CPU reference kernels over one host arena.
    Cpu,
    Cuda(Arc<CudaDevice>),
    #[cfg(feature = "hip")]
    Hip(Arc<crate::hip::HipDevice>),
}

impl Backend {
    /// The scratch this backend's kernels need: what its plans are made for.
    pub fn workspaces(&self) -> Workspaces {
        match self {
            Backend::Cpu => Workspaces::Cpu,
            Backend::Cuda(_) => Workspaces::Cuda,
            // The same kernels; GEMMs take no workspace of the plan on either.
            #[cfg(feature = "hip")]
            Backend::Hip(_) => Workspaces::Cuda,
        }
    }

    /// `cpu`, `cuda` or `hip`.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda(_) => "cuda",
            #[cfg(feature = "hip")]
            Backend::Hip(_) => "hip",
        }
    }

    /// The backend and its device, for reports: `cpu`, `NVIDIA H200 (sm_90)`.
    pub fn describe(&self) -> String {
        match self {
            Backend::Cpu => "cpu".to_string(),
            Backend::Cuda(device) => device.describe(),
            #[cfg(feature = "hip")]
            Backend::Hip(device) => device.describe(),
        }
    }

    /// The first CUDA device, or an error saying why none can be used.
    pub fn cuda() -> Result<Self> {
        Ok(Backend::Cuda(CudaDevice::open(0)?))
    }

    /// The first HIP device, or an error saying why none can be used (also when kiln was built
    /// without the `hip` feature).
    pub fn hip() -> Result<Self> {
        #[cfg(feature = "hip")]
        return Ok(Backend::Hip(crate::hip::HipDevice::open(0)?));
        #[cfg(not(feature = "hip"))]
        Err(crate::Error::Device {
            backend: "hip",
            what: "no usable device".to_string(),
            reason: "this kiln was built without the `hip` feature (cargo build --release \
                     --features hip, on a machine with ROCm)"
                .to_string(),
        })
    }

    /// Binds `plan` of `graph` to this backend (allocating everything it needs): the group of
    /// one.
    pub fn compile(&self, graph: &Graph, plan: &Plan) -> Result<Box<dyn Executable>> {
        let mut group = self.compile_group(&[(graph, plan)])?;
        Ok(group
            .executables
            .pop()
            .expect("a group has one executable per program"))
    }

    /// Binds several plans to one memory (see [`ExecutableGroup`]): one executable per
    /// program, in the order given, sharing one arena of the largest plan's bytes and one slot
    /// per param and state name. A shared input of one name with different kinds or types in
    /// two programs is refused.
    pub fn compile_group(&self, programs: &[(&Graph, &Plan)]) -> Result<ExecutableGroup> {
        fn boxed<E: Executable + 'static>(
            (executables, memory): (Vec<E>, GroupMemory),
        ) -> ExecutableGroup {
            let executables = (executables.into_iter())
                .map(|e| Box::new(e) as Box<dyn Executable>)
                .collect();
            ExecutableGroup {
                executables,
                memory,
            }
        }
        Ok(match self {
            Backend::Cpu => boxed(CpuExecutable::group(programs, false)?),
            Backend::Cuda(device) => boxed(CudaExecutable::group(device, programs)?),
            #[cfg(feature = "hip")]
            Backend::Hip(device) => boxed(crate::hip::HipExecutable::group(device, programs)?),
        })
    }

    /// Binds `plan` of `graph`, sets every graph input found in `values` (other names are
    /// ignored), runs `runs` times in `mode` and returns every output and every write (the
    /// written input's contents after the runs) by name.
    pub fn run(
        &self,
        graph: &Graph,
        plan: &Plan,
        values: &BTreeMap<String, Tensor>,
        mode: RunMode,
        runs: usize,
    ) -> Result<BTreeMap<String, Tensor>> {
        let mut exe = self.compile(graph, plan)?;
        for (name, tensor) in values {
            if graph.input_named(name).is_some() {
                exe.set(name, tensor)?;
            }
        }
        for _ in 0..runs {
            exe.run(mode)?;
        }
        let names = graph.outputs().iter().chain(graph.writes()).map(|(n, _)| n);
        names
            .map(|name| Ok((name.clone(), exe.get(name)?)))
            .collect()
    }
}

impl Executable for CpuExecutable {
    fn describe(&self) -> String {
        "cpu".to_string()
    }

    fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        CpuExecutable::set(self, name, tensor)
    }

    fn zero(&mut self, name: &str) -> Result<()> {
        CpuExecutable::zero(self, name)
    }

    fn run(&mut self, mode: RunMode) -> Result<()> {
        match mode {
            RunMode::Eager => CpuExecutable::run(self),
            RunMode::Graph => {
                if self.captured_launches().is_none() {
                    self.capture()?;
                }
                self.replay()
            }
        }
    }

    fn get(&self, name: &str) -> Result<Tensor> {
        CpuExecutable::get(self, name)
    }

    fn join(&mut self, communicator: Arc<dyn Communicator>) -> Result<()> {
        CpuExecutable::join(self, communicator);
        Ok(())
    }
}

impl<D: crate::gpu::Driver> Executable for crate::gpu::GpuExecutable<D> {
    fn describe(&self) -> String {
        format!("{}: {}", D::BACKEND, self.device().describe())
    }

    fn set(&mut self, name: &str, tensor: &Tensor) -> Result<()> {
        crate::gpu::GpuExecutable::set(self, name, tensor)
    }

    fn zero(&mut self, name: &str) -> Result<()> {
        crate::gpu::GpuExecutable::zero(self, name)
    }

    fn run(&mut self, mode: RunMode) -> Result<()> {
        crate::gpu::GpuExecutable::run(self, mode)
    }

    fn get(&self, name: &str) -> Result<Tensor> {
        crate::gpu::GpuExecutable::get(self, name)
    }

    fn device_io(&mut self) -> Option<&mut dyn DeviceIo> {
        Some(self)
    }

    fn join(&mut self, communicator: Arc<dyn Communicator>) -> Result<()> {
        let wanted = (communicator.rank(), communicator.world_size());
        let device = self.device().communicator()?;
        if device != wanted {
            return Err(crate::Error::Collective {
                rank: wanted.0,
                reason: format!(
                    "the device's communicator is rank {} of {}, not rank {} of {}",
                    device.0, device.1, wanted.0, wanted.1
                ),
            });
        }
        Ok(())
    }
}
