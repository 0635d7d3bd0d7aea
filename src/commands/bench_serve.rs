//! `kiln bench --program serve`: one workload — `requests` greedy requests with prompts of
//! random lengths, arriving every `arrival_every` steps — through the serial reference
//! scheduler, continuous batching over one engine and (with `--buckets`) length-bucketed
//! batching, on the same device: tokens per second, time to first token and inter-token
//! latency (P50/P95), and how many requests got the reference's tokens. Each scheduler runs the
//! workload once untimed first, so every program it uses is compiled and captured before the
//! timed run.

use anyhow::{bail, Result};
use kiln_engine::engine::{Engine, EngineOptions};
use kiln_engine::generate::ReferenceGenerator;
use kiln_engine::sampling::SamplingParams;
use kiln_engine::scheduler::bucketed::LengthBucketedBatchScheduler;
use kiln_engine::scheduler::continuous::ContinuousBatchScheduler;
use kiln_engine::scheduler::metrics::{run_workload, Arrival, Percentiles, WorkloadReport};
use kiln_engine::scheduler::reference::ReferenceScheduler;
use kiln_engine::scheduler::{Request, Scheduler};
use kiln_engine::stop::StopCriteria;
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::Precision;
use kiln_runtime::{Backend, RunMode};
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The workload and where it runs.
pub struct ServeArgs {
    pub model: String,
    pub seed: u64,
    pub requests: usize,
    /// Prompts of `prompt_len / 2 ..= prompt_len` tokens.
    pub prompt_len: usize,
    pub new_tokens: usize,
    /// A request arrives every this many steps (0: all at the start).
    pub arrival_every: usize,
    pub slots: usize,
    /// Also through the length-bucketed scheduler over these pools (slots, positions).
    pub buckets: Vec<(usize, usize)>,
    pub precision: Precision,
    pub mode: RunMode,
    pub backend: Backend,
}

/// One scheduler's figures.
#[derive(Serialize)]
pub struct SchedulerResult {
    pub scheduler: &'static str,
    pub seconds: f64,
    pub steps: usize,
    pub generated_tokens: usize,
    pub tokens_per_second: f64,
    pub first_token_s: Option<Percentiles>,
    pub inter_token_s: Option<Percentiles>,
    pub total_s: Option<Percentiles>,
}

/// What `--program serve` prints (`--json`: this object).
#[derive(Serialize)]
pub struct ServeResult {
    pub model: String,
    pub device: String,
    pub precision: String,
    pub requests: usize,
    pub prompt_len: usize,
    pub new_tokens: usize,
    pub arrival_every: usize,
    pub slots: usize,
    pub reference: SchedulerResult,
    pub continuous: SchedulerResult,
    /// With `--buckets`: the length-bucketed scheduler's figures and how many requests got
    /// the reference's tokens from it.
    pub bucketed: Option<(SchedulerResult, usize)>,
    /// Continuous tokens/s over the reference's.
    pub speedup: f64,
    /// Requests whose tokens are the same under both schedulers.
    pub same_tokens: usize,
    /// For the others, the reference's top-two logit margin at the first token that differs:
    /// the largest of them (a tie broken the other way by rounding has a margin near 0).
    pub largest_margin_where_different: Option<f32>,
    pub programs: usize,
    pub arena_bytes: u64,
    pub arena_sum_bytes: u64,
    pub pool_bytes: u64,
}

fn figures(scheduler: &'static str, report: &WorkloadReport) -> SchedulerResult {
    SchedulerResult {
        scheduler,
        seconds: report.seconds,
        steps: report.steps,
        generated_tokens: report.tokens(),
        tokens_per_second: report.tokens_per_second(),
        first_token_s: Percentiles::of(&report.first_token()),
        inter_token_s: Percentiles::of(&report.inter_token()),
        total_s: Percentiles::of(&report.total()),
    }
}

/// Runs `arrivals` untimed, then timed.
fn timed(scheduler: &mut dyn Scheduler, arrivals: &[Arrival]) -> Result<WorkloadReport> {
    run_workload(scheduler, arrivals, |_| {})?;
    Ok(run_workload(scheduler, arrivals, |_| {})?)
}

pub fn bench_serve(args: &ServeArgs) -> Result<ServeResult> {
    if args.requests == 0 || args.prompt_len == 0 || args.new_tokens == 0 {
        bail!("--requests, --seq and --new-tokens must be at least 1");
    }
    let source = ModelSource::resolve(&args.model)?;
    let (config, loaded) = source.load(args.seed, args.precision.weight_dtype())?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let arrivals: Vec<Arrival> = (0..args.requests)
        .map(|i| {
            let length = rng.random_range(args.prompt_len.div_ceil(2)..=args.prompt_len);
            let prompt = (0..length)
                .map(|_| rng.random_range(0..config.vocab_size as u32))
                .collect();
            let stop = StopCriteria {
                eos_token_ids: Vec::new(),
                stop_strings: Vec::new(),
                max_new_tokens: args.new_tokens,
            };
            Arrival {
                step: i.saturating_mul(args.arrival_every),
                request: Request {
                    prompt,
                    sampling: SamplingParams::greedy(),
                    stop,
                },
            }
        })
        .collect();
    let backend = &args.backend;
    let max_seq = (args.prompt_len.checked_add(args.new_tokens))
        .ok_or_else(|| anyhow::anyhow!("--seq plus --new-tokens does not fit a count"))?;
    let model = (&config, &loaded.weights);
    let generator =
        ReferenceGenerator::new(model, backend.clone(), (args.mode, args.precision), max_seq)?;
    let reference = timed(&mut ReferenceScheduler::new(generator, None), &arrivals)?;
    let options = EngineOptions::new(args.slots, max_seq, args.precision, args.mode);
    let engine = Engine::new(model, backend, options)?;
    let memory = engine.memory().clone();
    let continuous = timed(&mut ContinuousBatchScheduler::new(engine, None), &arrivals)?;
    let pairs = || reference.outcomes.iter().zip(&continuous.outcomes);
    let same_tokens = pairs().filter(|(a, b)| a.tokens == b.tokens).count();
    let largest_margin_where_different = pairs()
        .filter_map(|(a, b)| {
            let at = a.tokens.iter().zip(&b.tokens).position(|(x, y)| x != y)?;
            a.margins.get(at).copied().flatten()
        })
        .reduce(f32::max);
    let bucketed = match args.buckets.is_empty() {
        true => None,
        false => {
            let options = (args.buckets.iter())
                .map(|&(slots, positions)| {
                    EngineOptions::new(slots, positions, args.precision, args.mode)
                })
                .collect();
            let engines = Engine::group(model, backend, options)?;
            let mut scheduler = LengthBucketedBatchScheduler::new(engines, None, false);
            let report = timed(&mut scheduler, &arrivals)?;
            let same = (reference.outcomes.iter().zip(&report.outcomes))
                .filter(|(a, b)| a.tokens == b.tokens)
                .count();
            Some((figures("bucketed", &report), same))
        }
    };
    let (reference, continuous) = (
        figures("reference", &reference),
        figures("continuous", &continuous),
    );
    Ok(ServeResult {
        model: args.model.clone(),
        device: backend.describe(),
        precision: args.precision.name().to_string(),
        requests: args.requests,
        prompt_len: args.prompt_len,
        new_tokens: args.new_tokens,
        arrival_every: args.arrival_every,
        slots: args.slots,
        speedup: continuous.tokens_per_second / reference.tokens_per_second,
        reference,
        continuous,
        bucketed,
        same_tokens,
        largest_margin_where_different,
        programs: memory.programs,
        arena_bytes: memory.group.arena_bytes,
        arena_sum_bytes: memory.group.arena_sum_bytes,
        pool_bytes: memory.pool_bytes,
    })
}

/// The result as a table.
pub fn serve_table(r: &ServeResult) -> String {
    let ms = |p: &Option<Percentiles>| match p {
        Some(p) => format!("P50 {:.1} ms, P95 {:.1} ms", p.p50 * 1e3, p.p95 * 1e3),
        None => "-".to_string(),
    };
    let mut out = format!(
        "serve {}: {} requests, prompts {}..={} tokens, {} new each, one every {} steps, {} slots ({}, {})\n",
        r.model,
        r.requests,
        r.prompt_len.div_ceil(2),
        r.prompt_len,
        r.new_tokens,
        r.arrival_every,
        r.slots,
        r.precision,
        r.device
    );
    let bucketed = r.bucketed.as_ref().map(|(figures, _)| figures);
    for s in [&r.reference, &r.continuous].into_iter().chain(bucketed) {
        out += &format!(
            "  {:<10} {:>8.1} tokens/s  {:>6} steps  {:.3} s  first token {}  inter-token {}  total {}\n",
            s.scheduler,
            s.tokens_per_second,
            s.steps,
            s.seconds,
            ms(&s.first_token_s),
            ms(&s.inter_token_s),
            ms(&s.total_s)
        );
    }
    out += &format!(
        "  continuous / reference: {:.2}x tokens/s; same tokens for {} of {} requests{}\n  \
         engine: {} programs, one arena of {} bytes (one per program: {}), KV pool {} bytes\n",
        r.speedup,
        r.same_tokens,
        r.requests,
        match r.largest_margin_where_different {
            Some(m) => format!(
                " (the others first differ where the reference's top-2 margin is at most {m:.2e})"
            ),
            None => String::new(),
        },
        r.programs,
        r.arena_bytes,
        r.arena_sum_bytes,
        r.pool_bytes
    );
    if let Some((_, same)) = &r.bucketed {
        out += &format!(
            "  bucketed: same tokens as the reference for {same} of {} requests\n",
            r.requests
        );
    }
    out
}
