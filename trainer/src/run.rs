//! A training run: the compiled train step (and, for validation, the eval program sharing its
//! parameters) bound once to a backend, fed a window batch, the step number and the
//! schedule's learning rate at every step, with validation, checkpoints and metrics on the way.
//!
//! Everything a step computes depends on the parameters, the moments, the step number and the
//! seed (the windows and the rate follow from them), so a run resumed from the checkpoint of
//! step `k` computes the same bits at every later step as the run that went on.
//!
//! Data parallelism: with `ranks > 1` each step takes `ranks · batch` rows, the windows a
//! one-process run of that batch would take, and each rank (a process and its device, or a
//! simulated CPU rank) runs its own `batch` rows through a train step whose gradients are
//! summed over the ranks (`ProgramOptions::data_parallel`), each loss seeded with
//! `1/(ranks · accumulate)`: every rank applies the combined batch's update. The loss a step
//! reports is the mean over the ranks (a host all-reduce of one number); rank 0 alone writes
//! the run directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use kiln_frontend::model::{ModelConfig, Precision};
use kiln_frontend::programs::{
    build, plan_program, Accumulation, DataParallel, ProgramKind, ProgramOptions,
};
use kiln_ir::{AdamWConfig, DType};
use kiln_planner::PlanOptions;
use kiln_runtime::collective::Communicator;
use kiln_runtime::{Backend, ExecutableGroup, RunMode, Tensor};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, Contents, DataState, TrainerState, FORMAT};
use crate::data::{Sampling, Split, Stream, TokenData};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, Record};
use crate::schedule::Schedule;

/// Tensors by name.
pub type Named = Vec<(String, Tensor)>;

/// Everything that defines a run; kept in every checkpoint and taken from it on a resume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOptions {
    /// The `--model` the run started from.
    pub model: String,
    pub batch: usize,
    pub seq: usize,
    /// Seed of random windows (and of a preset's initial weights).
    pub seed: u64,
    pub sampling: Sampling,
    pub schedule: Schedule,
    /// Micro-batches of `batch` rows whose gradients each step sums (their mean: each loss is
    /// seeded with `1/accumulate`).
    pub accumulate: u64,
    pub clip_grad_norm: Option<f64>,
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decay norm weights and biases too (the usual recipe exempts them).
    pub decay_vectors: bool,
    /// `f32`, `bf16-gemm` or `bf16-swiglu`.
    pub precision: String,
    /// `cpu` or `cuda`: where the run steps (a resume takes it unless told otherwise; each
    /// device's kernels round in their own way, so only a resume on the same device
    /// continues bit for bit).
    pub device: String,
    pub val_fraction: f64,
    /// Validation every this many steps (0: never).
    pub val_every: u64,
    pub val_batches: u64,
    /// A checkpoint every this many steps (0: only at the end).
    pub save_every: u64,
    /// Checkpoints kept.
    pub keep: usize,
    /// The most arena bytes a train step's plan may take: values the backward reads are
    /// recomputed to fit (the same bits as without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_budget: Option<u64>,
    /// Data-parallel ranks: each step takes `ranks · batch` rows, `batch` on each rank (see
    /// the module doc). A resume takes the same count, so the same rows go into each step.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub ranks: usize,
}

fn one() -> usize {
    1
}

fn is_one(ranks: &usize) -> bool {
    *ranks == 1
}

impl RunOptions {
    fn precision(&self) -> Result<Precision> {
        match self.precision.as_str() {
            "f32" => Ok(Precision::F32),
            "bf16-gemm" => Ok(Precision::Bf16Gemm),
            "bf16-swiglu" => Ok(Precision::Bf16Swiglu),
            other => Err(Error::Option {
                flag: "--precision",
                reason: format!("training runs in f32, bf16-gemm or bf16-swiglu, not {other}"),
            }),
        }
    }

    /// The options of `kind`'s program; `data_parallel`: a rank's train step (its gradients
    /// summed over the ranks; in a world of one too, where the sum is the identity).
    fn program_options(
        &self,
        kind: ProgramKind,
        accumulation: Accumulation,
        data_parallel: bool,
    ) -> Result<ProgramOptions> {
        Ok(ProgramOptions {
            batch: self.batch,
            seq: self.seq,
            precision: self.precision()?,
            adamw: AdamWConfig {
                beta1: self.beta1,
                beta2: self.beta2,
                eps: self.eps,
                weight_decay: self.weight_decay,
            },
            decay_exempt_vectors: !self.decay_vectors,
            clip_grad_norm: if kind == ProgramKind::Train {
                self.clip_grad_norm
            } else {
                None
            },
            accumulation,
            data_parallel: (data_parallel && kind == ProgramKind::Train)
                .then(DataParallel::default),
            ..ProgramOptions::default()
        })
    }
}

/// One finished step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepRecord {
    pub step: u64,
    pub loss: f64,
    pub lr: f64,
    /// The global gradient norm before clipping (with `--clip-grad-norm`).
    pub grad_norm: Option<f64>,
    pub seconds: f64,
    pub tokens: usize,
}

/// What a run reports while it goes; every method has a do-nothing default.
pub trait Observer {
    fn on_step(&mut self, _record: &StepRecord) {}
    fn on_validation(&mut self, _step: u64, _loss: f64) {}
    fn on_save(&mut self, _dir: &Path) {}
    /// Asked after every step: stop now (a checkpoint is written first).
    fn stop_requested(&self) -> bool {
        false
    }
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Steps taken in all, resumed ones included.
    pub step: u64,
    pub stopped: bool,
    pub checkpoint: Option<PathBuf>,
}

/// A run bound to its backend.
pub struct Session {
    options: RunOptions,
    config: ModelConfig,
    data: TokenData,
    split: Split,
    /// The train programs (one, or first/between/last of accumulation), then eval if any.
    group: ExecutableGroup,
    trains: usize,
    mode: RunMode,
    params: Vec<(String, Vec<usize>)>,
    /// Steps taken.
    step: u64,
    /// The run directory and its metrics: rank 0's (the other ranks write nothing).
    run_dir: Option<(PathBuf, Metrics)>,
    source: Option<PathBuf>,
    /// This rank's communicator in a data-parallel run.
    world: Option<Arc<dyn Communicator>>,
}

/// Where a session starts: fresh weights, or a checkpoint's weights and moments at its step.
pub struct Start {
    pub params: Vec<(String, Tensor)>,
    pub moments: Option<Vec<(String, Tensor)>>,
    pub step: u64,
}

impl Session {
    /// Plans the train step (and the eval program when validating), binds them to `backend`
    /// as one group and uploads `start`. `streams`: the train step's streams (`None`: 2 on one
    /// GPU, where the weight gradients' GEMMs and their updates run beside the rest of the
    /// backward with the same bits, else 1; a data-parallel run takes 1). `run_dir` must exist; its metrics file is cut back
    /// to `start.step`; `None` for a rank other than 0 of a data-parallel run, which writes
    /// nothing. `world`: this rank's communicator in a data-parallel run, of
    /// `options.ranks` ranks.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: &Backend,
        (mode, streams): (RunMode, Option<usize>),
        (config, options): (ModelConfig, RunOptions),
        data: TokenData,
        start: Start,
        (run_dir, source): (Option<PathBuf>, Option<PathBuf>),
        world: Option<Arc<dyn Communicator>>,
    ) -> Result<Session> {
        let ranks = world.as_ref().map_or(1, |w| w.world_size());
        if options.ranks != ranks {
            return Err(Error::Option {
                flag: "--nproc",
                reason: format!(
                    "the run takes {} data-parallel ranks (each step {} rows of --batch {}), \
                     not {ranks}",
                    options.ranks,
                    options.ranks * options.batch,
                    options.batch
                ),
            });
        }
        let split = data.split(options.seq, options.val_fraction)?;
        (options.sampling).check(&data, &split, (options.batch, ranks, options.seq))?;
        if options.accumulate == 0 {
            return Err(Error::Option {
                flag: "--accumulate",
                reason: "must be at least 1".into(),
            });
        }
        let validates = options.val_every > 0 && options.val_batches > 0 && !split.val.is_empty();
        let mut roles = match options.accumulate {
            1 => vec![Accumulation::None],
            2 => vec![Accumulation::First, Accumulation::Last],
            _ => vec![Accumulation::First, Accumulation::Add, Accumulation::Last],
        }
        .into_iter()
        .map(|role| (ProgramKind::Train, role))
        .collect::<Vec<_>>();
        let trains = roles.len();
        if validates {
            roles.push((ProgramKind::Eval, Accumulation::None));
        }
        let one_gpu = world.is_none() && !matches!(backend, Backend::Cpu);
        let streams = match streams {
            Some(0) => Err("must be at least 1".to_string()),
            Some(n) if n > 1 && world.is_some() => Err("is 1 in a data-parallel run".to_string()),
            Some(n) => Ok(n),
            None => Ok(if one_gpu { 2 } else { 1 }),
        }
        .map_err(|reason| Error::Option {
            flag: "--streams",
            reason,
        })?;
        let mut programs = Vec::new();
        for (kind, role) in roles {
            let program = options.program_options(kind, role, world.is_some())?;
            let graph = build(kind, &config, &program)?;
            let budget = options.memory_budget.filter(|_| kind == ProgramKind::Train);
            let workspaces = backend.workspaces();
            let plan_options = PlanOptions {
                streams: if kind == ProgramKind::Train {
                    streams
                } else {
                    1
                },
                ..PlanOptions::default()
            };
            let (graph, planned) = plan_program(graph, &plan_options, &workspaces, budget)?;
            programs.push((graph, planned));
        }
        let pairs: Vec<_> = programs.iter().map(|(g, p)| (g, p)).collect();
        let mut group = backend.compile_group(&pairs)?;
        if let Some(world) = &world {
            group.join(world)?;
        }
        let seed = Tensor::scalar(1.0 / (options.accumulate * ranks as u64) as f64, DType::F32);
        for train in &mut group.executables[..trains] {
            train.set("loss_seed", &seed)?;
        }
        let update = &mut group.executables[trains - 1];
        let mut shapes = Vec::with_capacity(start.params.len());
        for (name, tensor) in &start.params {
            update.set(name, tensor)?;
            shapes.push((name.clone(), tensor.dims().to_vec()));
        }
        match &start.moments {
            Some(moments) => {
                for (name, tensor) in moments {
                    update.set(name, tensor)?;
                }
            }
            None => {
                for (name, _) in &shapes {
                    update.zero(&format!("adamw.m.{name}"))?;
                    update.zero(&format!("adamw.v.{name}"))?;
                }
            }
        }
        if trains > 1 {
            // Overwritten by every step's first micro-batch before anything reads them.
            for (name, _) in &shapes {
                update.zero(&format!("grad_acc.{name}"))?;
            }
        }
        let run_dir = match run_dir {
            Some(dir) => {
                let metrics = Metrics::open(&dir, start.step)?;
                Some((dir, metrics))
            }
            None => None,
        };
        Ok(Session {
            options,
            config,
            data,
            split,
            group,
            trains,
            mode,
            params: shapes,
            step: start.step,
            run_dir,
            source,
            world,
        })
    }

    pub fn step(&self) -> u64 {
        self.step
    }

    pub fn options(&self) -> &RunOptions {
        &self.options
    }

    /// The `tokens`, `positions` and `targets` of a `[B, T+1]` window batch: each row's first
    /// `T` ids, `0..T`, and its last `T` ids (every position predicts the next id).
    fn batch_inputs(&self, ids: &[i64]) -> Result<[(&'static str, Tensor); 3]> {
        let (batch, seq) = (self.options.batch, self.options.seq);
        let mut tokens = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for row in ids.chunks(seq + 1) {
            tokens.extend_from_slice(&row[..seq]);
            targets.extend_from_slice(&row[1..]);
        }
        let positions = (0..batch * seq).map(|i| (i % seq) as i64).collect();
        Ok([
            ("tokens", Tensor::from_vec(tokens, [batch, seq])?),
            ("positions", Tensor::from_vec(positions, [batch, seq])?),
            ("targets", Tensor::from_vec(targets, [batch * seq])?),
        ])
    }

    fn scalar(exe: &dyn kiln_runtime::Executable, name: &str) -> Result<f64> {
        Ok(exe.get(name)?.to_f64_vec()?[0])
    }

    /// Takes step `step() + 1`: its micro-batches through the train programs, the last one
    /// updating.
    pub fn train_step(&mut self) -> Result<StepRecord> {
        let step = self.step + 1;
        let started = Instant::now();
        let micro = self.options.accumulate;
        let lr = self.options.schedule.lr_at(step);
        let mut loss = 0.0;
        for k in 0..micro {
            let windows = self.own_rows(self.data.windows(
                &self.split.train,
                (self.options.batch * self.options.ranks, self.options.seq),
                (self.options.sampling, self.options.seed),
                Stream::Train {
                    batch: (step - 1) * micro + k,
                },
            ));
            let inputs = self.batch_inputs(&windows)?;
            let last = k + 1 == micro;
            let program = match (k, last) {
                (_, true) => self.trains - 1,
                (0, false) => 0,
                _ => 1,
            };
            let train = &mut self.group.executables[program];
            for (name, tensor) in &inputs {
                train.set(name, tensor)?;
            }
            if last {
                train.set(
                    "step",
                    &Tensor::from_vec(vec![step as i64], kiln_ir::Shape::scalar())?,
                )?;
                train.set("lr", &Tensor::scalar(lr, DType::F64))?;
            }
            train.run(self.mode)?;
            loss += Self::scalar(train.as_ref(), "loss")?;
        }
        let update = self.group.executables[self.trains - 1].as_ref();
        let grad_norm = match self.options.clip_grad_norm {
            Some(_) => Some(Self::scalar(update, "grad_norm")?),
            None => None,
        };
        self.step = step;
        let record = StepRecord {
            step,
            loss: self.mean_over_ranks(loss / micro as f64)?,
            lr,
            grad_norm,
            seconds: started.elapsed().as_secs_f64(),
            tokens: micro as usize * self.options.ranks * self.options.batch * self.options.seq,
        };
        if let Some((_, metrics)) = &mut self.run_dir {
            metrics.append(&Record::step(&record))?;
        }
        Ok(record)
    }

    /// This rank's `batch` rows of the `[ranks · batch, T+1]` windows of a step.
    fn own_rows(&self, mut windows: Vec<i64>) -> Vec<i64> {
        let rank = self.world.as_ref().map_or(0, |w| w.rank());
        let per_rank = self.options.batch * (self.options.seq + 1);
        windows.truncate((rank + 1) * per_rank);
        windows.split_off(rank * per_rank)
    }

    /// The mean of `value` over the ranks (itself in a one-process run).
    fn mean_over_ranks(&self, value: f64) -> Result<f64> {
        let Some(world) = &self.world else {
            return Ok(value);
        };
        let ranks = world.world_size() as f64;
        let sum = world.all_reduce(&[Tensor::scalar(value / ranks, DType::F32)])?;
        Ok(sum[0].to_f64_vec()?[0])
    }

    /// The mean loss over the validation batches (the same windows every time), or `None`
    /// when the run does not validate.
    pub fn validate(&mut self) -> Result<Option<f64>> {
        if self.group.executables.len() == self.trains {
            return Ok(None);
        }
        let mut sum = 0.0;
        for batch in 0..self.options.val_batches {
            let windows = self.data.windows(
                &self.split.val,
                (self.options.batch, self.options.seq),
                (self.options.sampling, self.options.seed),
                Stream::Validation { batch },
            );
            let inputs = self.batch_inputs(&windows)?;
            let eval = &mut self.group.executables[self.trains];
            for (name, tensor) in &inputs {
                eval.set(name, tensor)?;
            }
            eval.run(self.mode)?;
            sum += Self::scalar(eval.as_ref(), "loss")?;
        }
        let loss = sum / self.options.val_batches as f64;
        if let Some((_, metrics)) = &mut self.run_dir {
            metrics.append(&Record::validation(self.step, loss))?;
        }
        Ok(Some(loss))
    }

    /// Parameters and moments as they are now on the device.
    pub fn state(&self) -> Result<(Named, Named)> {
        let train = &self.group.executables[self.trains - 1];
        let mut params = Vec::with_capacity(self.params.len());
        let mut moments = Vec::with_capacity(2 * self.params.len());
        for (name, _) in &self.params {
            params.push((name.clone(), train.get(name)?));
            for moment in ["m", "v"] {
                let key = format!("adamw.{moment}.{name}");
                moments.push((key.clone(), train.get(&key)?));
            }
        }
        Ok((params, moments))
    }

    /// Writes the checkpoint of the current step and prunes older ones; `None` on a rank that
    /// writes nothing.
    pub fn save(&mut self) -> Result<Option<PathBuf>> {
        let Some((run_dir, _)) = &self.run_dir else {
            return Ok(None);
        };
        let (params, moments) = self.state()?;
        let state = TrainerState {
            format: FORMAT,
            step: self.step,
            options: self.options.clone(),
            data: DataState {
                path: self.data.path().to_path_buf(),
                tokens: self.data.len(),
                dtype: self.data.dtype(),
                fingerprint: self.data.fingerprint(),
            },
        };
        let contents = Contents {
            config: &self.config,
            params: &params,
            moments: &moments,
            state: &state,
            source: self.source.as_deref(),
        };
        let dir = checkpoint::save(run_dir, &contents)?;
        checkpoint::prune(run_dir, self.options.keep)?;
        Ok(Some(dir))
    }

    /// Runs steps up to `schedule.steps`, validating and saving as the options say, until the
    /// observer asks to stop (then saves at once). The last step is always saved.
    pub fn run(&mut self, observer: &mut dyn Observer) -> Result<Outcome> {
        let total = self.options.schedule.steps;
        let mut checkpoint = None;
        let mut stopped = false;
        while self.step < total {
            let record = self.train_step()?;
            observer.on_step(&record);
            let step = self.step;
            let every = |n: u64| n > 0 && step.is_multiple_of(n);
            if every(self.options.val_every) || (step == total && self.options.val_every > 0) {
                if let Some(loss) = self.validate()? {
                    observer.on_validation(self.step, loss);
                }
            }
            // Every rank stops at the same step, or the others would wait for it.
            let asked = if observer.stop_requested() { 1.0 } else { 0.0 };
            stopped = self.mean_over_ranks(asked)? > 0.0;
            if every(self.options.save_every) || step == total || stopped {
                if let Some(dir) = self.save()? {
                    observer.on_save(&dir);
                    checkpoint = Some(dir);
                }
            }
            if stopped {
                break;
            }
        }
        if let Some((_, metrics)) = &self.run_dir {
            metrics.write_curves()?;
        }
        Ok(Outcome {
            step: self.step,
            stopped,
            checkpoint,
        })
    }
}

#[cfg(test)]
#[path = "run_tests.rs"]
mod tests;
