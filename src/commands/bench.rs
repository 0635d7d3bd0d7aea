//! `kiln bench`: one program of one model on a device, timed per step with device events.
//!
//! Steps: trace the program, plan it, lower it, allocate its slots once, copy in parameters
//! (seeded random weights for a preset) and example inputs, warm up, then time `steps` runs
//! (eager: every launch issued; graph: the captured CUDA graph replayed), each between two
//! device events on the main stream. Reports median and p95, tokens/s, the arena against the
//! plan's lower bound, device memory beyond parameters and optimizer/cache state, capture time
//! and launches per step; for decode, the HBM floor (bytes a step must read over the measured
//! copy bandwidth) and the fraction of it kiln reaches.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::ModelConfig;
use kiln_frontend::programs::{build, example_inputs, plan_program, ProgramKind, ProgramOptions};
use kiln_planner::PlanOptions;
use kiln_runtime::cuda::{CudaDevice, CudaExecutable};
use kiln_runtime::gpu::Driver;
use kiln_runtime::{LowerOptions, RunMode};
use serde::Serialize;

/// HBM copy bandwidth of the H200 measured on the device machine (bytes read + written per
/// second, ANCHORS.md); the decode floor divides the bytes a step must read by it.
const HBM_BYTES_PER_SECOND: f64 = 4.3e12;

/// What `kiln bench` runs.
pub struct BenchArgs {
    pub model: String,
    pub seed: u64,
    pub kind: ProgramKind,
    pub options: ProgramOptions,
    /// Decode: tokens already in the cache (the position decoded).
    pub context: usize,
    pub mode: RunMode,
    pub streams: usize,
    pub warmup: usize,
    pub steps: usize,
    /// Fused linears of at most this many rows on the skinny kernel (None: the default).
    pub linear_rows: Option<u64>,
    /// Programmatic dependent launch where the device supports it.
    pub pdl: bool,
    /// Split skinny linears finished inside thread block clusters where the device has them.
    pub clusters: bool,
    /// The HIP backend's lowering (`LowerOptions::portable`) on this device.
    pub portable: bool,
    /// cuBLASLt's algorithms chosen by timing its candidates (`LowerOptions::tune_gemms`).
    pub gemm_tune: bool,
    /// The most bytes each side-stream launch prefetches of the next linears' weights into L2
    /// (`LowerOptions::l2_prefetch_bytes`; None: the default).
    pub l2_prefetch: Option<u64>,
    /// `LowerOptions::l2_prefetch_lead` (None: the default).
    pub l2_prefetch_lead: Option<usize>,
    /// `LowerOptions::l2_prefetch_min_rows` (None: the default).
    pub l2_prefetch_min_rows: Option<u64>,
    /// Also time every step alone once (eager, one stream) and report the ops that take
    /// the most time.
    pub profile: bool,
    /// Also run once eagerly on the program's streams with an event after every step, and
    /// report how the streams overlap.
    pub timeline: bool,
    /// Train: the most arena bytes; values the backward reads are recomputed to fit.
    pub memory_budget: Option<u64>,
}

/// One step of `--timeline`: a step starts once the step before it on its stream and the
/// steps it waits for have ended (ms from the program's start; events after every step add
/// gaps, so the times are longer than a replay's).
#[derive(Serialize)]
pub struct TimelineStep {
    pub op: String,
    pub stream: usize,
    pub start_ms: f32,
    pub end_ms: f32,
}

/// One benchmark's results (`--json` prints this).
#[derive(Serialize)]
pub struct BenchResult {
    pub model: String,
    pub program: String,
    pub precision: String,
    pub mode: String,
    pub device: String,
    pub batch: usize,
    pub seq: usize,
    pub context: usize,
    pub streams: usize,
    /// Whether the fusion pass ran.
    pub fusion: bool,
    /// `--linear-rows` when given: fused linears of at most this many rows on the skinny
    /// kernel, larger ones on cuBLASLt.
    pub linear_rows: Option<u64>,
    /// Whether kernels were launched with programmatic dependent launch.
    pub pdl: bool,
    /// Whether split skinny linears finished inside thread block clusters.
    pub clusters: bool,
    /// Whether the HIP backend's lowering ran (tiled GEMM, portable tensor-core modules).
    pub portable: bool,
    /// Whether cuBLASLt's algorithms were chosen by timing its candidates.
    pub gemm_tune: bool,
    /// `--l2-prefetch`: the most bytes each side-stream launch may prefetch of the next
    /// linears' weights into L2 (beside splits of at least `l2_prefetch_min_rows` rows; 0
    /// before sm_90).
    pub l2_prefetch_bytes: u64,
    pub l2_prefetch_lead: usize,
    pub l2_prefetch_min_rows: u64,
    pub steps: usize,
    pub median_ms: f64,
    pub p95_ms: f64,
    pub min_ms: f64,
    pub tokens_per_second: f64,
    pub launches_per_step: usize,
    pub capture_ms: Option<f64>,
    pub arena_bytes: u64,
    pub lower_bound_bytes: u64,
    /// `--memory-budget` when given, and the values recomputed in the backward to meet it
    /// (their count and the bytes they no longer keep).
    pub memory_budget: Option<u64>,
    pub recomputed_values: usize,
    pub recomputed_bytes: u64,
    pub param_bytes: u64,
    pub state_bytes: u64,
    /// Arena + per-run inputs + outputs + GEMM workspace.
    pub beyond_params_and_state_bytes: u64,
    pub in_place_writes: usize,
    pub copied_writes: usize,
    pub hbm_floor_ms: Option<f64>,
    pub floor_fraction: Option<f64>,
    /// With `--profile`: (op name, steps, total ms) of the costliest ops, summed over steps.
    pub profile: Vec<(String, usize, f64)>,
    /// With `--profile`: the same by op text and first result type (`cast{to=bf16} ->
    /// bf16[2048,896]`).
    pub profile_shapes: Vec<(String, usize, f64)>,
    /// With `--timeline`: every step of one eager run on the program's streams, in issue order
    /// (the plan's, each L2 prefetch after the step it waits for).
    pub timeline: Vec<TimelineStep>,
    /// Train: the loss of the last step; prefill/decode: max |logit| (a sanity check that the
    /// numbers are finite and not all zero).
    pub check: f64,
    pub startup: Startup,
    /// This rank and the ranks of the run: under `kiln launch`, each rank times its own
    /// program (`tokens_per_second` is one rank's; the world's is `ranks` times it for data
    /// parallelism); 0 of 1 otherwise.
    pub rank: usize,
    pub ranks: usize,
    /// `--data-parallel` (bucket bytes) and `--tensor-parallel` when given.
    pub data_parallel: Option<u64>,
    pub tensor_parallel: Option<usize>,
}

/// Where the time from the command's start to its first step went, milliseconds.
#[derive(Serialize, Default, Clone, Debug)]
pub struct Startup {
    /// Tracing the program (the fusion pass included).
    pub trace_ms: f64,
    pub plan_ms: f64,
    /// Waiting for the device after the weights were read: opening it (context, cuBLASLt
    /// handle) and loading the kernel modules run on another thread from before tracing, so
    /// this is what tracing, planning and reading did not hide.
    pub device_ms: f64,
    /// Reading the weights (and converting them to the program's dtype).
    pub weights_ms: f64,
    /// Binding the plan: lowering, cuBLASLt heuristics, allocation.
    pub bind_ms: f64,
    /// On the device's thread: getting every kernel module (`kernels_cached` of `kernels`
    /// from the on-disk cache, the rest compiled by NVRTC in parallel).
    pub kernels_ms: f64,
    pub kernels: usize,
    pub kernels_cached: usize,
    /// Copying the weights and inputs to the device.
    pub upload_ms: f64,
    /// The first run: in graph mode, capture, instantiate and the first replay.
    pub first_step_ms: f64,
    /// From the process's start (`main`) to the end of its first step: the parts above, and
    /// parsing the arguments, checking the options and reading config.json.
    pub total_ms: f64,
}

/// Bytes one decode step must read at least: every weight once (the embedding table only for
/// the rows it gathers, unless the output head shares it), every cached K/V row up to the
/// position, all in f32.
/// Bytes a decode step must read: every weight (the embedding only for the gathered rows unless
/// tied) and every cached K/V row, at `element_bytes` each (the precision's storage).
fn decode_bytes(config: &ModelConfig, batch: usize, context: usize, element_bytes: f64) -> f64 {
    let params = kiln_frontend::programs::parameter_count(config) as f64;
    let embedding = (config.vocab_size * config.hidden_size) as f64;
    let weights = if config.tie_word_embeddings {
        params
    } else {
        params - embedding + (batch * config.hidden_size) as f64
    };
    let cache = 2.0
        * (config.num_hidden_layers
            * batch
            * config.num_key_value_heads
            * (context + 1)
            * config.head_dim) as f64;
    element_bytes * (weights + cache)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

pub fn bench(args: &BenchArgs) -> Result<BenchResult> {
    let mut startup = Startup::default();
    let mut lap = {
        let mut last = Instant::now();
        move || {
            let ms = last.elapsed().as_secs_f64() * 1e3;
            last = Instant::now();
            ms
        }
    };
    // Every option is checked against the model before anything touches the device.
    if args.steps == 0 {
        bail!("--steps 0: must be at least 1");
    }
    let plan_options = PlanOptions {
        streams: args.streams,
        ..PlanOptions::default()
    };
    plan_options.validate()?;
    let source = ModelSource::resolve(&args.model)?;
    let (config, _) = source.config()?;
    args.options.validate(args.kind, &config)?;
    if args.kind == ProgramKind::Decode {
        args.options.check_position(&config, args.context)?;
    }
    let launched = crate::launch::Rank::from_env()?;
    let (rank, ranks) = launched.as_ref().map_or((0, 1), |r| (r.rank, r.world_size));
    let parallel = args.options.data_parallel.is_some() || args.options.tensor_parallel.is_some();
    if launched.is_some() && !parallel {
        bail!(
            "rank {rank} of {ranks}: under `kiln launch`, bench a rank's program: \
             --data-parallel BYTES (train) or --tensor-parallel {ranks} (prefill, decode)"
        );
    }
    if let Some(n) = args.options.tensor_parallel.filter(|&n| n != ranks) {
        bail!(
            "--tensor-parallel {n} runs as {n} ranks: `kiln launch --nproc {n} -- kiln bench \
             ...` (this is {ranks})"
        );
    }
    if parallel {
        crate::launch::nccl_built(launched.as_ref())?;
    }
    if let Some(reason) = kiln_runtime::cuda::unavailable() {
        bail!("--device cuda: no CUDA device can be used here: {reason}");
    }
    // The driver takes a quarter of a second to open the device: it opens (and loads the
    // kernel modules) on another thread while the program is traced and planned and the
    // weights are read. A launched rank owns its own GPU.
    let opening = CudaDevice::open_in_background(launched.as_ref().map_or(0, |r| r.local_rank));
    lap();
    let graph = build(args.kind, &config, &args.options)?;
    startup.trace_ms = lap();
    let workspaces = kiln_runtime::Workspaces::Cuda;
    let (graph, planned) = plan_program(graph, &plan_options, &workspaces, args.memory_budget)?;
    let recomputed = (
        planned.recomputed.len(),
        planned.recomputed.iter().map(|r| r.bytes).sum::<u64>(),
    );
    startup.plan_ms = lap();
    // A tensor-parallel rank reads only its part of each split projection.
    let dtype = args.options.precision.weight_dtype();
    let shard = args.options.tensor_parallel.map(|ranks| (rank, ranks));
    let (config, loaded) = (source.load_shard(args.seed, dtype, shard))
        .with_context(|| format!("loading model {}", args.model))?;
    startup.weights_ms = lap();
    let device = opening.wait()?;
    if parallel {
        // The all-reduces run through NCCL: over the launch's ranks, or a world of one.
        crate::launch::join_nccl(&device, launched.as_ref())?;
    }
    startup.device_ms = lap();
    let (_, total) = device.memory()?;
    let what = format!("{} {}", args.model, args.kind.name());
    let memory = format!("the device ({})", device.describe());
    crate::memory::ensure_fits(
        &what,
        crate::memory::plan_bytes(&planned),
        total as u64,
        &memory,
    )?;
    lap();
    if let Some(note) = loaded.note() {
        eprintln!("note: {}: {note}", args.model);
    }
    if let Some(warning) = loaded.warning() {
        eprintln!("warning: {}: {warning}", args.model);
    }
    let weights = loaded.weights;
    eprintln!(
        "kiln bench: {} {} on {}: {} ops planned into a {:.2} MiB arena",
        args.model,
        args.kind.name(),
        device.describe(),
        planned.schedule.len(),
        planned.arena_bytes as f64 / (1u64 << 20) as f64
    );
    let defaults = match args.portable {
        true => LowerOptions::portable(),
        false => LowerOptions::default(),
    };
    // As this device runs them (no clusters or bulk L2 prefetch before sm_90), so the result
    // reports what ran.
    let options = device.lower_options(LowerOptions {
        linear_rows: args.linear_rows.unwrap_or(defaults.linear_rows),
        clusters: defaults.clusters && args.clusters,
        tune_gemms: args.gemm_tune && defaults.vendor_gemm,
        l2_prefetch_bytes: args.l2_prefetch.unwrap_or(defaults.l2_prefetch_bytes),
        l2_prefetch_lead: args.l2_prefetch_lead.unwrap_or(defaults.l2_prefetch_lead),
        l2_prefetch_min_rows: (args.l2_prefetch_min_rows).unwrap_or(defaults.l2_prefetch_min_rows),
        ..defaults
    });
    let mut exe = CudaExecutable::with_options(&device, &graph, &planned, options)?;
    let pdl = exe.set_programmatic_launch(args.pdl);
    startup.bind_ms = lap();
    let kernels = device.kernel_report();
    startup.kernels_ms = kernels.seconds * 1e3;
    startup.kernels = kernels.modules;
    startup.kernels_cached = kernels.hits;
    for (name, var) in weights.named() {
        exe.set(&name, var.value())?;
    }
    drop(weights);
    // Data-parallel ranks take batches of their own; tensor-parallel ranks the same one.
    let seed = match args.options.data_parallel {
        Some(_) => args.seed + rank as u64,
        None => args.seed,
    };
    let inputs = example_inputs(
        &graph,
        &config,
        args.kind,
        &args.options,
        args.context,
        seed,
    )?;
    // State (KV caches, optimizer moments) starts as zeros: filled on the device.
    let states: Vec<&str> = (graph.inputs().into_iter())
        .filter(|(_, _, kind, _)| *kind == kiln_ir::InputKind::State)
        .map(|(_, name, _, _)| name)
        .collect();
    for (name, tensor) in &inputs {
        match states.contains(&name.as_str()) {
            true => exe.zero(name)?,
            false => exe.set(name, tensor)?,
        }
    }
    exe.synchronize()?;
    startup.upload_ms = lap();

    let ctx = device.clone();
    let timing = || {
        ctx.timing_event()
            .context("creating a timing event on the device")
    };
    let (start, end) = (timing()?, timing()?);
    exe.run(args.mode)?;
    exe.synchronize()?;
    startup.first_step_ms = lap();
    startup.total_ms = crate::started().elapsed().as_secs_f64() * 1e3;
    eprintln!("kiln bench: start-up {}", startup.line());
    for _ in 1..args.warmup {
        exe.run(args.mode)?;
    }
    exe.synchronize()?;
    // One rank of a launch shows it.
    let bar = match rank {
        0 => ProgressBar::new(args.steps as u64),
        _ => ProgressBar::hidden(),
    };
    let bar = bar.with_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len}")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("timing {} steps", args.steps));
    let wall = Instant::now();
    let mut times = Vec::new();
    for _ in 0..args.steps {
        start.record(exe.stream())?;
        exe.run(args.mode)?;
        end.record(exe.stream())?;
        times.push(start.elapsed_ms(&end)? as f64);
        bar.inc(1);
    }
    bar.finish_and_clear();
    eprintln!(
        "kiln bench: {} steps in {:.2} s wall",
        args.steps,
        wall.elapsed().as_secs_f64()
    );
    times.sort_by(f64::total_cmp);
    let (mut profile, mut profile_shapes) = (Vec::new(), Vec::new());
    if args.profile {
        let steps = exe.profile()?;
        // By op name, and by op text and first result's type (which cast, which matmul).
        profile = summed(
            steps
                .iter()
                .map(|(_, op, ms)| (kiln_ir::name_of_text(op).to_string(), *ms)),
        );
        let results: std::collections::HashMap<usize, _> = (graph.node_indices())
            .filter_map(|n| Some((n.index(), graph.node(n)?.outputs.first()?)))
            .collect();
        profile_shapes = summed(steps.iter().map(|(node, op, ms)| {
            let result = results.get(node);
            (result.map_or(op.clone(), |ty| format!("{op} -> {ty}")), *ms)
        }));
    }
    let timeline = match args.timeline {
        true => (exe.timeline()?.into_iter())
            .map(|t| TimelineStep {
                op: t.op,
                stream: t.stream,
                start_ms: t.start_ms,
                end_ms: t.end_ms,
            })
            .collect(),
        false => Vec::new(),
    };
    let median = percentile(&times, 0.5);

    let check = match args.kind {
        ProgramKind::Train => exe.get("loss")?.to_f64_vec()?[0],
        _ => (exe.get("logits")?.to_f64_vec()?)
            .iter()
            .fold(0.0f64, |m, v| m.max(v.abs())),
    };
    if !check.is_finite() || check == 0.0 {
        bail!("the program's result is not sane ({check}); the timings are not reported");
    }
    let slots = exe.slot_bytes();
    let slot = |name: &str| slots.get(name).copied().unwrap_or(0);
    let (arena, lower_bound) = exe.arena_bytes();
    let (in_place, copied) = exe.writes();
    let (batch, seq) = (args.options.batch, args.options.seq);
    let tokens = match args.kind {
        ProgramKind::Decode => batch,
        _ => batch * seq,
    };
    let floor = (args.kind == ProgramKind::Decode).then(|| {
        let element = args.options.precision.weight_dtype().size_bytes() as f64;
        1e3 * decode_bytes(&config, batch, args.context, element) / HBM_BYTES_PER_SECOND
    });
    Ok(BenchResult {
        model: args.model.clone(),
        program: args.kind.name().to_string(),
        precision: args.options.precision.name().to_string(),
        mode: match args.mode {
            RunMode::Eager => "eager",
            RunMode::Graph => "graph",
        }
        .to_string(),
        device: device.describe(),
        batch,
        seq: if args.kind == ProgramKind::Decode {
            1
        } else {
            seq
        },
        context: if args.kind == ProgramKind::Decode {
            args.context
        } else {
            0
        },
        streams: args.streams,
        fusion: args.options.fusion,
        linear_rows: args.linear_rows,
        pdl,
        clusters: options.clusters,
        portable: args.portable,
        gemm_tune: options.tune_gemms,
        l2_prefetch_bytes: options.l2_prefetch_bytes,
        l2_prefetch_lead: options.l2_prefetch_lead,
        l2_prefetch_min_rows: options.l2_prefetch_min_rows,
        steps: args.steps,
        median_ms: median,
        p95_ms: percentile(&times, 0.95),
        min_ms: times[0],
        tokens_per_second: tokens as f64 / (median / 1e3),
        launches_per_step: exe.launches(),
        capture_ms: exe.capture_seconds().map(|s| s * 1e3),
        arena_bytes: arena,
        lower_bound_bytes: lower_bound,
        memory_budget: args.memory_budget,
        recomputed_values: recomputed.0,
        recomputed_bytes: recomputed.1,
        param_bytes: slot("params"),
        state_bytes: slot("state"),
        beyond_params_and_state_bytes: slot("arena")
            + slot("inputs")
            + slot("outputs")
            + slot("gemm workspaces")
            + slot("fault words"),
        in_place_writes: in_place.len(),
        copied_writes: copied.len(),
        profile,
        profile_shapes,
        timeline,
        hbm_floor_ms: floor,
        floor_fraction: floor.map(|f| f / median),
        check,
        startup,
        rank,
        ranks,
        data_parallel: args.options.data_parallel.map(|d| d.bucket_bytes),
        tensor_parallel: args.options.tensor_parallel,
    })
}

impl Startup {
    /// `1234 ms to the first step: trace 12, plan 3, ...`.
    pub fn line(&self) -> String {
        format!(
            "{:.0} ms to the first step: trace {:.0}, plan {:.0}, weights {:.0}, device {:.0} \
             more (opened meanwhile; kernels {:.0}: {} of {} cached), bind {:.0}, upload {:.0}, \
             first step {:.0} ms",
            self.total_ms,
            self.trace_ms,
            self.plan_ms,
            self.weights_ms,
            self.device_ms,
            self.kernels_ms,
            self.kernels_cached,
            self.kernels,
            self.bind_ms,
            self.upload_ms,
            self.first_step_ms
        )
    }
}

/// The result as a table for people.
pub fn table(r: &BenchResult) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut rows = vec![
        ("model", r.model.clone()),
        (
            "program",
            format!(
                "{} B={} T={}{} ({}, {})",
                r.program,
                r.batch,
                r.seq,
                if r.program == "decode" {
                    format!(" context={}", r.context)
                } else {
                    String::new()
                },
                r.precision,
                r.mode
            ),
        ),
        ("device", format!("{} ({} streams)", r.device, r.streams)),
        (
            "step time",
            format!(
                "median {:.3} ms, p95 {:.3} ms, min {:.3} ms over {} steps",
                r.median_ms, r.p95_ms, r.min_ms, r.steps
            ),
        ),
        ("tokens/s", format!("{:.0}", r.tokens_per_second)),
        ("launches per step", r.launches_per_step.to_string()),
        (
            "arena",
            format!(
                "{:.2} MiB, lower bound {:.2} MiB (ratio {:.4})",
                mib(r.arena_bytes),
                mib(r.lower_bound_bytes),
                r.arena_bytes as f64 / r.lower_bound_bytes.max(1) as f64
            ),
        ),
        (
            "recomputed",
            match r.memory_budget {
                None => "nothing (no --memory-budget)".to_string(),
                Some(budget) => format!(
                    "{} values, {:.2} MiB no longer kept, to fit a budget of {:.2} MiB",
                    r.recomputed_values,
                    mib(r.recomputed_bytes),
                    mib(budget)
                ),
            },
        ),
        (
            "device memory",
            format!(
                "params {:.1} MiB, state {:.1} MiB, beyond both {:.1} MiB",
                mib(r.param_bytes),
                mib(r.state_bytes),
                mib(r.beyond_params_and_state_bytes)
            ),
        ),
        (
            "state writes",
            format!(
                "{} in place, {} copied back",
                r.in_place_writes, r.copied_writes
            ),
        ),
    ];
    if let Some(capture) = r.capture_ms {
        rows.push(("capture+instantiate", format!("{capture:.1} ms")));
    }
    if let (Some(floor), Some(fraction)) = (r.hbm_floor_ms, r.floor_fraction) {
        rows.push((
            "HBM floor",
            format!("{floor:.3} ms; kiln at {:.0}% of it", 100.0 * fraction),
        ));
    }
    for (op, steps, ms) in r.profile.iter().take(12) {
        rows.push(("profile", format!("{op:<24} {steps:>5} steps {ms:>9.3} ms")));
    }
    for (op, steps, ms) in r.profile_shapes.iter().take(16) {
        rows.push((
            "by shape",
            format!("{op:<56} {steps:>5} steps {ms:>9.3} ms"),
        ));
    }
    rows.extend(timeline_rows(&r.timeline));
    let check = if r.program == "train" {
        "loss"
    } else {
        "max |logit|"
    };
    rows.push((check, format!("{:.4}", r.check)));
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:>width$}  {v}\n"))
        .collect()
}

/// The `--timeline` summary: where the run ends, each stream's busy time, how long more than
/// one stream is busy (the streams' busy times less the time any is) and how long none is,
/// how long stream 0 stood waiting for the others, and the ops that end in the run's last 5%.
fn timeline_rows(steps: &[TimelineStep]) -> Vec<(&'static str, String)> {
    let Some(end) = steps.iter().map(|s| s.end_ms).reduce(f32::max) else {
        return Vec::new();
    };
    let streams = steps.iter().map(|s| s.stream + 1).max().unwrap_or(1);
    let mut busy = vec![0f32; streams];
    let mut waited = 0f32;
    let mut last_end = vec![0f32; streams];
    for step in steps {
        busy[step.stream] += step.end_ms - step.start_ms;
        if step.stream == 0 {
            waited += (step.start_ms - last_end[0]).max(0.0);
        }
        last_end[step.stream] = step.end_ms;
    }
    let any = busy_union(steps);
    let both = busy.iter().sum::<f32>() - any;
    let busy: Vec<String> = (busy.iter().enumerate())
        .map(|(i, ms)| format!("stream {i} {ms:.3}"))
        .collect();
    let mut rows = vec![(
        "timeline",
        format!(
            "eager, an event after every step: ends at {end:.3} ms; busy ms: {}; more than \
             one stream busy {both:.3} ms, none {:.3} ms; stream 0 waits {waited:.3} ms on the \
             others",
            busy.join(", "),
            end - any,
        ),
    )];
    let mut tail: Vec<&TimelineStep> = (steps.iter()).filter(|s| s.end_ms >= 0.95 * end).collect();
    tail.sort_by(|a, b| b.end_ms.total_cmp(&a.end_ms));
    for step in tail.iter().take(8) {
        let op = kiln_ir::name_of_text(&step.op);
        rows.push((
            "at the end",
            format!(
                "{op:<28} stream {} {:>9.3} -> {:>9.3} ms",
                step.stream, step.start_ms, step.end_ms
            ),
        ));
    }
    rows
}

/// Milliseconds in which at least one stream runs a step: the union of the steps' spans.
fn busy_union(steps: &[TimelineStep]) -> f32 {
    let mut spans: Vec<(f32, f32)> = steps.iter().map(|s| (s.start_ms, s.end_ms)).collect();
    spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut open: Option<(f32, f32)> = None;
    for (start, end) in spans {
        open = match open {
            Some((first, last)) if start <= last => Some((first, last.max(end))),
            Some((first, last)) => {
                total += last - first;
                Some((start, end))
            }
            None => Some((start, end)),
        };
    }
    total + open.map_or(0.0, |(first, last)| last - first)
}

/// (key, count, total ms) of `steps`' (key, ms), costliest first.
fn summed(steps: impl Iterator<Item = (String, f32)>) -> Vec<(String, usize, f64)> {
    let mut by_key: std::collections::BTreeMap<String, (usize, f64)> = Default::default();
    for (key, ms) in steps {
        let entry = by_key.entry(key).or_default();
        entry.0 += 1;
        entry.1 += f64::from(ms);
    }
    let mut summed: Vec<_> = by_key.into_iter().map(|(k, (n, ms))| (k, n, ms)).collect();
    summed.sort_by(|a, b| b.2.total_cmp(&a.2));
    summed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(stream: usize, start_ms: f32, end_ms: f32) -> TimelineStep {
        TimelineStep {
            op: "add".to_string(),
            stream,
            start_ms,
            end_ms,
        }
    }

    #[test]
    fn the_timeline_summary_splits_the_run_into_overlap_and_gaps() {
        // Stream 0: 0–2 and 5–6; stream 1: 1–3 (overlapping 1–2), then 3–4 (touching).
        let steps = [
            step(0, 0.0, 2.0),
            step(1, 1.0, 3.0),
            step(1, 3.0, 4.0),
            step(0, 5.0, 6.0),
        ];
        assert_eq!(busy_union(&steps), 5.0);
        let rows = timeline_rows(&steps);
        let summary = &rows[0].1;
        assert!(summary.contains("ends at 6.000 ms"), "{summary}");
        assert!(
            summary.contains("stream 0 3.000, stream 1 3.000"),
            "{summary}"
        );
        assert!(
            summary.contains("more than one stream busy 1.000 ms, none 1.000 ms"),
            "{summary}"
        );
        // Stream 0's second step starts 3 ms after its first ended.
        assert!(summary.contains("stream 0 waits 3.000 ms"), "{summary}");
        assert!(timeline_rows(&[]).is_empty());
    }
}
