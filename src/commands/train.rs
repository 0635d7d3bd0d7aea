//! `kiln train`: a training run of the compiled train step over a token file, with a progress
//! bar, validation, checkpoints every `--save-every` steps that resume bit for bit, a metrics
//! file and loss curves (see `kiln_trainer`). Ctrl-C stops at the next step boundary and
//! writes a checkpoint; a second Ctrl-C stops at once (no partial file is left).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_frontend::hf::source::ModelSource;
use kiln_ir::DType;
use kiln_runtime::{Backend, RunMode, Tensor};
use kiln_trainer::checkpoint::{self, TrainerState};
use kiln_trainer::metrics::{CURVES_FILE, METRICS_FILE};
use kiln_trainer::run::Start;
use kiln_trainer::{Observer, RunDir, RunOptions, Session, StepRecord, TokenDType, TokenData};

/// A run to start, or to resume.
pub struct TrainArgs {
    /// A new run's options (`None` fields take the checkpoint's on a resume).
    pub fresh: Option<FreshRun>,
    pub resume: Option<PathBuf>,
    pub data: Option<PathBuf>,
    pub data_dtype: Option<TokenDType>,
    pub out: Option<PathBuf>,
    /// `None`: a new run's CPU, a resumed run's device.
    pub cuda: Option<bool>,
    pub mode: RunMode,
    /// The train step's streams (`None`: the session's default).
    pub streams: Option<usize>,
}

/// The model and options of a run that starts from weights.
pub struct FreshRun {
    pub options: RunOptions,
}

/// Runs `args`; under `kiln launch`, as one rank of a data-parallel run (see
/// `kiln_trainer::run`): each rank on its own GPU, rank 0 writing the run directory.
pub fn train(args: TrainArgs, stop: Arc<AtomicBool>) -> Result<()> {
    let launched = crate::launch::Rank::from_env()?;
    let (mut options, start, source, run_dir, checkpoint) = match (&args.fresh, &args.resume) {
        (Some(fresh), None) => {
            let out = args
                .out
                .clone()
                .ok_or_else(|| anyhow!("--out is required"))?;
            let out = Claim::New(out);
            let model = ModelSource::resolve(&fresh.options.model)?;
            let (_, loaded) = model
                .load(fresh.options.seed, DType::F32)
                .with_context(|| format!("loading model {}", fresh.options.model))?;
            let params = tensors(&loaded.weights);
            let source = match model {
                ModelSource::Dir(dir) => Some(dir),
                ModelSource::Preset(_) => None,
            };
            let start = Start {
                params,
                moments: None,
                step: 0,
            };
            (fresh.options.clone(), start, source, out, None)
        }
        (None, Some(resume)) => {
            let dir = resolve_checkpoint(resume)?;
            let state = checkpoint::read_state(&dir)?;
            let (_, loaded) = ModelSource::Dir(dir.clone())
                .load(state.options.seed, DType::F32)
                .with_context(|| format!("loading the weights of checkpoint {}", dir.display()))?;
            let params = tensors(&loaded.weights);
            let shapes: Vec<(String, Vec<usize>)> = (params.iter())
                .map(|(n, t)| (n.clone(), t.dims().to_vec()))
                .collect();
            let moments = checkpoint::read_moments(&dir, &shapes)?;
            let parent = dir.parent().map(Path::to_path_buf).unwrap_or_default();
            let in_place = (args.out.as_ref())
                .is_none_or(|out| std::fs::canonicalize(out).ok().as_ref() == Some(&parent));
            let run_dir = match &args.out {
                Some(out) if !in_place => Claim::New(out.clone()),
                _ => Claim::InPlace {
                    dir: parent,
                    checkpoint: dir.clone(),
                    step: state.step,
                },
            };
            let start = Start {
                params,
                moments: Some(moments),
                step: state.step,
            };
            (
                state.options.clone(),
                start,
                Some(dir.clone()),
                run_dir,
                Some(state),
            )
        }
        _ => bail!("give either a new run's --model, --data and --steps, or --resume DIR"),
    };
    let source_for_config = source.clone();
    let (config, _) = match &source_for_config {
        Some(dir) => ModelSource::Dir(dir.clone()).config()?,
        None => ModelSource::resolve(&options.model)?.config()?,
    };
    let data_path = match (&args.data, &checkpoint) {
        (Some(path), _) => path.clone(),
        (None, Some(state)) => state.data.path.clone(),
        (None, None) => bail!("--data is required"),
    };
    let dtype = args
        .data_dtype
        .or(checkpoint.as_ref().map(|s| s.data.dtype));
    let data_path = std::fs::canonicalize(&data_path)
        .with_context(|| format!("--data {}", data_path.display()))?;
    let data = TokenData::open(&data_path, dtype, config.vocab_size)?;
    let tokens = data.len();
    let cuda = (args.cuda).unwrap_or(
        checkpoint
            .as_ref()
            .is_some_and(|s| s.options.device == "cuda"),
    );
    options.device = if cuda { "cuda" } else { "cpu" }.to_string();
    if let Some(rank) = &launched {
        if !cuda {
            bail!(
                "rank {} of {}: `kiln launch` runs one rank per GPU; pass --device cuda",
                rank.rank,
                rank.world_size
            );
        }
        crate::launch::nccl_built(Some(rank))?;
    }
    let ranks = launched.as_ref().map_or(1, |r| r.world_size);
    match &checkpoint {
        Some(state) if state.options.ranks != ranks => bail!(
            "the checkpoint's run takes {} data-parallel ranks (each step {} rows); resume it \
             with `kiln launch --nproc {}`{}",
            state.options.ranks,
            state.options.ranks * state.options.batch,
            state.options.ranks,
            if state.options.ranks == 1 {
                " or without kiln launch"
            } else {
                ""
            }
        ),
        _ => options.ranks = ranks,
    }
    // The device (and a launch's communicator: every rank has met) before anything is written.
    let (backend, world) = match (&launched, cuda) {
        (Some(rank), _) => {
            let (device, world) = rank.join()?;
            (Backend::Cuda(device), Some(world))
        }
        (None, true) => (Backend::cuda().context("--device cuda")?, None),
        (None, false) => (Backend::Cpu, None),
    };
    // Made or locked only once the model and the data are known to be good; by rank 0 alone
    // under `kiln launch` (the others write nothing).
    let writer = launched.as_ref().is_none_or(|r| r.rank == 0);
    let run_dir = if writer { Some(run_dir.take()?) } else { None };
    if let Some(state) = &checkpoint {
        check_same_data(state, &data)?;
    }
    let compiling = Instant::now();
    let total = options.schedule.steps;
    let run_path = run_dir.as_ref().map(|d| d.path().to_path_buf());
    let mut session = Session::new(
        &backend,
        (args.mode, args.streams),
        (config, options),
        data,
        start,
        (run_path.clone(), source),
        world,
    )?;
    let who = match &launched {
        Some(rank) => format!(" (rank {} of {})", rank.rank, rank.world_size),
        None => String::new(),
    };
    eprintln!(
        "kiln train{who}: {} in {} on {}, {tokens} tokens of {}, into {}; step {} of \
         {total}; compiled in {:.1} s",
        session.options().model,
        session.options().precision,
        backend.name(),
        data_path.display(),
        run_path
            .as_ref()
            .map_or("(rank 0's directory)".into(), |p| p.display().to_string()),
        session.step(),
        compiling.elapsed().as_secs_f64()
    );
    let mut progress = Progress::new(session.step(), total, stop, writer);
    let outcome = session.run(&mut progress)?;
    progress.bar.finish_and_clear();
    let Some(run_dir) = run_dir else {
        return Ok(());
    };
    let last = progress
        .last
        .map_or(String::new(), |r| format!(", last loss {:.4}", r.loss));
    let saved = outcome.checkpoint.map_or("no checkpoint".into(), |c| {
        format!("checkpoint {}", c.display())
    });
    println!(
        "{} at step {} of {total}{last}; {saved}; metrics in {}, curves in {}",
        if outcome.stopped { "stopped" } else { "done" },
        outcome.step,
        run_dir.path().join(METRICS_FILE).display(),
        run_dir.path().join(CURVES_FILE).display(),
    );
    Ok(())
}

fn tensors(
    weights: &kiln_frontend::model::ModelWeights<kiln_frontend::Var>,
) -> Vec<(String, Tensor)> {
    (weights.named().into_iter())
        .map(|(name, var)| (name, var.value().clone()))
        .collect()
}

/// Where a run writes, decided before anything is written.
enum Claim {
    /// A new or empty directory, to be made a run directory.
    New(PathBuf),
    /// The run directory of the checkpoint `step`, continued in place.
    InPlace {
        dir: PathBuf,
        checkpoint: PathBuf,
        step: u64,
    },
}

impl Claim {
    fn take(self) -> Result<RunDir> {
        match self {
            Claim::New(path) => Ok(RunDir::create(&path)?),
            Claim::InPlace {
                dir,
                checkpoint,
                step,
            } => {
                let run_dir = RunDir::open(&dir)?;
                let later: Vec<u64> = (checkpoint::list(run_dir.path())?.into_iter())
                    .map(|(s, _)| s)
                    .filter(|&s| s > step)
                    .collect();
                if !later.is_empty() {
                    bail!(
                        "--resume {}: its run directory holds later checkpoints (steps \
                         {later:?}) that continuing in place would clash with; pass --out with \
                         a new directory",
                        checkpoint.display()
                    );
                }
                Ok(run_dir)
            }
        }
    }
}

/// A checkpoint directory, or the newest checkpoint of a run directory.
fn resolve_checkpoint(path: &Path) -> Result<PathBuf> {
    let path =
        &std::fs::canonicalize(path).with_context(|| format!("--resume {}", path.display()))?;
    if path.join(checkpoint::STATE_FILE).is_file() {
        return Ok(path.to_path_buf());
    }
    checkpoint::latest(path)?.ok_or_else(|| {
        anyhow!(
            "--resume {}: neither a checkpoint (no {}) nor a run directory with one",
            path.display(),
            checkpoint::STATE_FILE
        )
    })
}

fn check_same_data(state: &TrainerState, data: &TokenData) -> Result<()> {
    if data.len() != state.data.tokens || data.fingerprint() != state.data.fingerprint {
        bail!(
            "data file {}: {} tokens that are not the {} tokens the checkpoint trained on ({}); \
             a resumed run takes the same data",
            data.path().display(),
            data.len(),
            state.data.tokens,
            state.data.path.display()
        );
    }
    Ok(())
}

/// The progress bar (step, loss, rate, tokens/s, ETA) and the stop flag.
struct Progress {
    bar: ProgressBar,
    stop: Arc<AtomicBool>,
    last: Option<StepRecord>,
    tokens: usize,
    started: Instant,
}

impl Progress {
    /// Shown on standard error where `shown` (one rank of a launch shows it).
    fn new(done: u64, total: u64, stop: Arc<AtomicBool>, shown: bool) -> Progress {
        let bar = match shown {
            true => ProgressBar::new(total),
            false => ProgressBar::hidden(),
        };
        let bar = bar.with_style(
            ProgressStyle::with_template("step {pos}/{len} [{bar:30}] {msg} eta {eta}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_position(done);
        Progress {
            bar,
            stop,
            last: None,
            tokens: 0,
            started: Instant::now(),
        }
    }
}

impl Observer for Progress {
    fn on_step(&mut self, record: &StepRecord) {
        self.tokens += record.tokens;
        let rate = self.tokens as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
        let norm = record
            .grad_norm
            .map_or(String::new(), |n| format!(" norm {n:.3}"));
        self.bar.set_message(format!(
            "loss {:.4} lr {:.2e}{norm} {rate:.0} tok/s",
            record.loss, record.lr
        ));
        self.bar.set_position(record.step);
        self.last = Some(record.clone());
    }

    fn on_validation(&mut self, step: u64, loss: f64) {
        self.bar
            .println(format!("step {step}: validation loss {loss:.4}"));
    }

    fn on_save(&mut self, dir: &Path) {
        self.bar.println(format!("saved {}", dir.display()));
    }

    fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}
