//! The session layer the C ABI and the Python package share: a loaded model, its compiled
//! programs, evaluation, plans and generation, in plain Rust. Each call goes to the same
//! library functions the `kiln` CLI calls, so a result never depends on the door it came
//! through (DESIGN.md, "Layers above the programs").
//!
//! Neither a [`Model`] nor a [`Program`] is `Send`: the oracle's leaves and CUDA graphs are
//! bound to the thread that made them. The bindings keep them on their thread.

use std::collections::BTreeMap;

use kiln_frontend::eval::{evaluate, evaluate_interpreted, evaluate_program, Engine};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::{ModelConfig, ModelWeights, Precision};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::{Graph, InputKind};
use kiln_planner::{Plan, PlanOptions};
use kiln_runtime::{Backend, RunMode, Tensor, Workspaces};

use crate::error::{Error, Result};
pub use crate::program::{Order, Program, ProgramInput, LEGACY_STREAM};

/// Where a model's programs run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl DeviceKind {
    /// `"cpu"` or `"cuda"`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" | "cuda:0" => Ok(DeviceKind::Cuda),
            other => Err(Error::argument(
                "device",
                format!("`{other}` is not a device; expected \"cpu\" or \"cuda\""),
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        }
    }
}

/// `"f32"`, `"bf16-gemm"`, `"bf16-swiglu"` or `"bf16"`, as `--precision` spells them.
pub fn parse_precision(text: &str) -> Result<Precision> {
    Precision::ALL
        .into_iter()
        .find(|p| p.name() == text)
        .ok_or_else(|| {
            let names: Vec<String> = Precision::ALL
                .iter()
                .map(|p| format!("\"{}\"", p.name()))
                .collect();
            Error::argument(
                "precision",
                format!(
                    "`{text}` is not a precision; expected one of {}",
                    names.join(", ")
                ),
            )
        })
}

/// `"prefill"`, `"decode"`, `"train"` or `"eval"`.
pub fn parse_program(text: &str) -> Result<ProgramKind> {
    let kinds = [
        ProgramKind::Prefill,
        ProgramKind::Decode,
        ProgramKind::Train,
        ProgramKind::Eval,
    ];
    kinds.into_iter().find(|k| k.name() == text).ok_or_else(|| {
        Error::argument(
            "program",
            format!("`{text}` is not a program; expected prefill, decode, train or eval"),
        )
    })
}

/// Which engine an evaluation runs on: `kiln eval --mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalMode {
    /// The eager oracle (tape autograd).
    Oracle,
    /// The traced eval program on the reference interpreter.
    Interpret,
    /// The eval program planned and run eagerly on the model's device.
    Planned,
    /// The same, recorded once and replayed.
    Graph,
}

impl EvalMode {
    /// `"oracle"`, `"interpret"`, `"planned"` or `"graph"`.
    pub fn parse(text: &str) -> Result<Self> {
        match text {
            "oracle" => Ok(EvalMode::Oracle),
            "interpret" => Ok(EvalMode::Interpret),
            "planned" => Ok(EvalMode::Planned),
            "graph" => Ok(EvalMode::Graph),
            other => Err(Error::argument(
                "mode",
                format!(
                    "`{other}` is not an eval mode; expected oracle, interpret, planned or graph"
                ),
            )),
        }
    }
}

/// `"eager"` or `"graph"`.
pub fn parse_run_mode(text: &str) -> Result<RunMode> {
    match text {
        "eager" => Ok(RunMode::Eager),
        "graph" => Ok(RunMode::Graph),
        other => Err(Error::argument(
            "mode",
            format!("`{other}` is not a run mode; expected \"eager\" or \"graph\""),
        )),
    }
}

/// A model loaded once: its config, its weights (host tensors, as `kiln eval` loads them) and
/// the backend its programs run on.
pub struct Model {
    name: String,
    source: ModelSource,
    config: ModelConfig,
    weights: Vec<(String, Tensor)>,
    backend: Backend,
    device: DeviceKind,
    precision: Precision,
    /// What loading had to say (ignored tensors, non-finite weights), for the caller to show.
    pub notes: Vec<String>,
}

impl Model {
    /// Loads `model` (a Hugging Face directory or a preset; a preset's weights random from
    /// `seed`) in `precision` for `device`, exactly as `kiln eval --model --seed --precision`.
    pub fn load(model: &str, device: DeviceKind, precision: Precision, seed: u64) -> Result<Self> {
        let source = ModelSource::resolve(model)?;
        // The device opens (and loads its kernels) while the weights are read.
        let opening = (device == DeviceKind::Cuda)
            .then(|| kiln_runtime::cuda::CudaDevice::open_in_background(0));
        let (config, loaded) = source.load(seed, precision.weight_dtype())?;
        let backend = match opening {
            Some(opening) => Backend::Cuda(opening.wait()?),
            None => Backend::Cpu,
        };
        let notes = [loaded.note(), loaded.warning()]
            .into_iter()
            .flatten()
            .collect();
        let weights = (loaded.weights.named().into_iter())
            .map(|(name, var)| (name, var.value().clone()))
            .collect();
        Ok(Model {
            name: model.to_string(),
            source,
            config,
            weights,
            backend,
            device,
            precision,
            notes,
        })
    }

    /// The path or preset name it was loaded from.
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn source(&self) -> &ModelSource {
        &self.source
    }
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }
    pub fn device(&self) -> DeviceKind {
        self.device
    }
    pub fn precision(&self) -> Precision {
        self.precision
    }
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The weights as fresh leaves of the eager oracle (sharing the loaded storage).
    pub fn leaves(&self) -> Result<ModelWeights<Var>> {
        let by_name: BTreeMap<&str, &Tensor> =
            self.weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
        Ok(ModelWeights::build(&self.config, |name, _| {
            let tensor = by_name
                .get(name)
                .ok_or_else(|| kiln_frontend::Error::Operand {
                    op: "load",
                    reason: format!("the loaded weights have no parameter `{name}`"),
                })?;
            Var::leaf((*tensor).clone())
        })?)
    }

    /// Options for program `kind` in the model's precision: `batch`, `seq`, `max_seq` as the
    /// CLI's flags of those names, then checked as every program's are.
    pub fn program_options(
        &self,
        kind: ProgramKind,
        (batch, seq, max_seq): (usize, usize, Option<usize>),
        fusion: bool,
    ) -> Result<ProgramOptions> {
        let options = ProgramOptions {
            batch,
            seq,
            max_seq,
            fusion,
            grads: kind == ProgramKind::Eval,
            precision: self.precision,
            ..ProgramOptions::default()
        };
        options.validate(kind, &self.config)?;
        Ok(options)
    }

    /// The traced, verified graph of `kind`.
    pub fn graph(&self, kind: ProgramKind, options: &ProgramOptions) -> Result<Graph> {
        let graph = build(kind, &self.config, options)?;
        kiln_ir::verify(&graph)?;
        Ok(graph)
    }

    /// Plans `kind` with `streams` streams, workspaces sized for `workspaces`' kernels, and
    /// checks the plan with the independent verifier: what `kiln plan --verify` prints.
    pub fn plan(
        &self,
        kind: ProgramKind,
        options: &ProgramOptions,
        streams: usize,
        workspaces: Workspaces,
    ) -> Result<Plan> {
        let plan_options = PlanOptions {
            streams,
            ..PlanOptions::default()
        };
        plan_options.validate()?;
        let graph = self.graph(kind, options)?;
        let plan = kiln_planner::plan(&graph, &plan_options, &workspaces)?;
        kiln_planner::verify_plan(&graph, &plan, &workspaces)?;
        Ok(plan)
    }

    /// Compiles `kind` for the model's backend, run per `mode`: traced, planned (one stream),
    /// bound to memory, the weights set, every state (KV caches, optimizer moments) zero.
    pub fn compile(
        &self,
        kind: ProgramKind,
        options: &ProgramOptions,
        mode: RunMode,
    ) -> Result<Program> {
        let graph = self.graph(kind, options)?;
        let workspaces = self.backend.workspaces();
        let plan = kiln_planner::plan(&graph, &PlanOptions::default(), &workspaces)?;
        let mut exe = self.backend.compile(&graph, &plan)?;
        let by_name: BTreeMap<&str, &Tensor> =
            self.weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let mut inputs = Vec::new();
        for (_, name, input_kind, ty) in graph.inputs() {
            match input_kind {
                InputKind::Param => {
                    let weight = by_name.get(name).ok_or_else(|| Error::NotFound {
                        what: "parameter",
                        name: name.to_string(),
                        known: format!("{} loaded parameters", by_name.len()),
                    })?;
                    exe.set(name, weight)?;
                }
                InputKind::State => {
                    let zeros =
                        Tensor::zeros(ty.shape.clone(), ty.dtype, kiln_runtime::Device::Cpu);
                    exe.set(name, &zeros)?;
                    inputs.push(ProgramInput::new(name, input_kind, ty));
                }
                InputKind::Input => inputs.push(ProgramInput::new(name, input_kind, ty)),
            }
        }
        let outputs = (graph.outputs().iter().chain(graph.writes()))
            .map(|(name, value)| Ok((name.clone(), graph.value_type(*value)?.clone())))
            .collect::<Result<_>>()?;
        Ok(Program::new(
            kind.name(),
            (exe, mode),
            (inputs, outputs),
            plan.arena_bytes,
        ))
    }

    /// `logits`, `loss` and with `grads` every `grad.<parameter>` for `tokens` (integer
    /// `[B,T]`), named and computed exactly as `kiln eval --mode` on the model's device.
    pub fn eval(
        &self,
        tokens: &Tensor,
        grads: bool,
        mode: EvalMode,
    ) -> Result<Vec<(String, Tensor)>> {
        if self.device == DeviceKind::Cuda && matches!(mode, EvalMode::Oracle | EvalMode::Interpret)
        {
            return Err(Error::argument(
                "mode",
                "a cuda model evaluates through its planned program: use mode \"planned\" or \
                 \"graph\"",
            ));
        }
        let weights = self.leaves()?;
        let (config, precision) = (&self.config, self.precision);
        let planned = |mode| Engine::Planned {
            backend: &self.backend,
            mode,
        };
        let result = match mode {
            EvalMode::Oracle => evaluate(config, &weights, tokens, grads, precision)?,
            EvalMode::Interpret => {
                evaluate_interpreted(config, &weights, tokens, grads, precision)?
            }
            EvalMode::Planned => {
                let engine = planned(RunMode::Eager);
                evaluate_program(config, &weights, tokens, grads, precision, engine)?
            }
            EvalMode::Graph => {
                let engine = planned(RunMode::Graph);
                evaluate_program(config, &weights, tokens, grads, precision, engine)?
            }
        };
        Ok(result.named())
    }
}
