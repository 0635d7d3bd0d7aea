//! `kiln generate`: continue prompts through a scheduler — the serial reference (compiled B=1
//! prefill and decode programs, replayed per token), continuous batching over one compiled
//! engine and its KV pool of `--slots` sequences, or length-bucketed batching over pools of
//! `--buckets`. One `--prompt` streams its text to standard output as it comes; `--prompts
//! FILE` submits every prompt of the file at once with a progress bar, and `--json OUT` writes
//! what each produced and a latency summary (see `report.rs`).

mod prompts;
mod report;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kiln_engine::chat::Message;
use kiln_engine::engine::{Engine, EngineOptions};
use kiln_engine::generate::ReferenceGenerator;
use kiln_engine::generation_config::GenerationConfig;
use kiln_engine::sampling::SamplingParams;
use kiln_engine::scheduler::bucketed::LengthBucketedBatchScheduler;
use kiln_engine::scheduler::continuous::ContinuousBatchScheduler;
use kiln_engine::scheduler::reference::ReferenceScheduler;
use kiln_engine::scheduler::{Request, RequestId, Scheduler};
use kiln_engine::stop::StopCriteria;
use kiln_engine::tokenizer::Tokenizer;
use kiln_frontend::hf::safetensors_io::{check_absent, write_file_atomically};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::Precision;
use kiln_runtime::{Backend, RunMode};

use report::{Report, RequestRecord};

/// What to generate and how.
pub struct GenerateArgs {
    pub model: String,
    pub seed: u64,
    pub input: Input,
    pub chat: bool,
    pub max_new_tokens: usize,
    /// The sampling of every request; request `i` of a file draws with seed `seed + i`.
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub backend: Backend,
    pub mode: RunMode,
    pub precision: Precision,
    pub max_seq: Option<usize>,
    pub scheduler: SchedulerKind,
    /// Sequences the continuous scheduler's KV pool holds at once.
    pub slots: usize,
    /// The bucketed scheduler's pools: (slots, positions per slot).
    pub buckets: Vec<(usize, usize)>,
    /// Write the report here (must not exist).
    pub json: Option<PathBuf>,
}

/// Which scheduler runs the requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedulerKind {
    Reference,
    Continuous,
    /// With `spill`, a request whose bucket is full may take a larger one with room.
    Bucketed {
        spill: bool,
    },
}

/// One prompt, or a file of them.
pub enum Input {
    One(Prompt),
    File(PathBuf),
}

/// A prompt as text (through the tokenizer) or as token ids.
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// The model's tokenizer and stop ids, and how prompts become ids.
struct Model {
    tokenizer: Option<Tokenizer>,
    eos: Vec<u32>,
}

impl Model {
    fn ids(&self, prompt: &Prompt, chat: bool, model: &str) -> Result<Vec<u32>> {
        match (prompt, &self.tokenizer) {
            (Prompt::Ids(ids), _) => Ok(ids.clone()),
            (Prompt::Text(text), Some(tokenizer)) => {
                let text = match chat {
                    true => tokenizer.apply_chat_template(&[Message::new("user", text)], true)?,
                    false => text.clone(),
                };
                Ok(tokenizer.encode(&text, !chat)?)
            }
            (Prompt::Text(_), None) => bail!(
                "{model} has no tokenizer.json: give prompts as token ids (--prompt-ids 1,2,3, \
                 or `prompt_ids` in a prompts file)"
            ),
        }
    }
}

/// The tokenizer of a model directory that has one, and the ids a request stops on: the
/// generation config's `eos_token_id`, then the tokenizer's eos token.
pub(crate) fn text_side(source: &ModelSource) -> Result<(Option<Tokenizer>, Vec<u32>)> {
    let dir = match source {
        ModelSource::Dir(dir) => Some(dir.as_path()),
        ModelSource::Preset(_) => None,
    };
    let tokenizer = dir.map(Tokenizer::from_dir).transpose()?.flatten();
    let generation = match dir {
        Some(dir) => GenerationConfig::load(dir)?,
        None => GenerationConfig::default(),
    };
    let mut eos = generation.eos_token_ids.clone();
    eos.extend(
        tokenizer
            .as_ref()
            .and_then(Tokenizer::eos_token_id)
            .filter(|id| !eos.contains(id)),
    );
    Ok((tokenizer, eos))
}

/// Runs the generation (see the module doc); a summary goes to standard error. Under `kiln
/// launch` each rank runs its tensor-parallel shard of the engine on its own GPU, fed the same
/// prompts (every rank samples the same tokens), and rank 0 alone prints and writes.
pub fn generate(args: GenerateArgs) -> Result<()> {
    let launched = crate::launch::Rank::from_env()?;
    let reporter = launched.as_ref().is_none_or(|r| r.rank == 0);
    let world = match (&launched, &args.backend) {
        (None, _) => None,
        (Some(rank), kiln_runtime::Backend::Cuda(device)) => {
            if args.scheduler == SchedulerKind::Reference {
                bail!(
                    "rank {} of {}: --scheduler reference runs on one GPU; tensor-parallel \
                     generation runs the continuous or bucketed scheduler",
                    rank.rank,
                    rank.world_size
                );
            }
            crate::launch::nccl_built(Some(rank))?;
            Some(crate::launch::join_nccl(device, Some(rank))?)
        }
        (Some(rank), _) => bail!(
            "rank {} of {}: `kiln launch` runs one rank per GPU; pass --device cuda",
            rank.rank,
            rank.world_size
        ),
    };
    let shard = launched.as_ref().map(|r| (r.rank, r.world_size));
    if let Some(json) = args.json.as_ref().filter(|_| reporter) {
        check_absent(json).map_err(|e| anyhow::anyhow!("{e} (choose another --json)"))?;
    }
    let source = ModelSource::resolve(&args.model)?;
    let (tokenizer, eos) = text_side(&source)?;
    if !args.stop.is_empty() && tokenizer.is_none() {
        bail!(
            "--stop needs a tokenizer to see text; {} has none",
            args.model
        );
    }
    let model = Model { tokenizer, eos };
    let (streamed, prompts) = match &args.input {
        Input::One(prompt) => (true, vec![model.ids(prompt, args.chat, &args.model)?]),
        Input::File(path) => {
            let read = prompts::read_prompts(path)?;
            let ids = (read.iter().enumerate())
                .map(|(i, p)| {
                    model
                        .ids(p, args.chat, &args.model)
                        .with_context(|| format!("prompt {i}"))
                })
                .collect::<Result<Vec<_>>>()?;
            (false, ids)
        }
    };
    // A rank reads only its part of each split projection.
    let dtype = args.precision.weight_dtype();
    let (config, loaded) = (source.load_shard(args.seed, dtype, shard))
        .with_context(|| format!("loading model {}", args.model))?;
    if let Some(warning) = loaded.warning() {
        eprintln!("warning: {}: {warning}", args.model);
    }
    // The last generated token is never decoded: the cache holds one row less.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let needed = longest
        .saturating_add(args.max_new_tokens)
        .saturating_sub(1);
    let positions = config.max_position_embeddings;
    if args.max_seq.is_none() && needed > positions {
        bail!(
            "{longest} prompt tokens and --max-new-tokens {} need {needed} positions; the model \
             has {positions} (max_position_embeddings)",
            args.max_new_tokens
        );
    }
    let started = Instant::now();
    let max_seq = args.max_seq.unwrap_or(needed);
    let tokenizer = model.tokenizer.as_ref();
    let mut scheduler: Box<dyn Scheduler + '_> = match args.scheduler {
        SchedulerKind::Reference => {
            let generator = ReferenceGenerator::new(
                (&config, &loaded.weights),
                args.backend.clone(),
                (args.mode, args.precision),
                max_seq,
            )?;
            Box::new(ReferenceScheduler::new(generator, tokenizer))
        }
        SchedulerKind::Continuous => {
            let options = EngineOptions {
                tensor_parallel: shard,
                ..EngineOptions::new(args.slots, max_seq, args.precision, args.mode)
            };
            let mut engine = Engine::new((&config, &loaded.weights), &args.backend, options)?;
            if let Some(world) = &world {
                engine.join(world)?;
            }
            let memory = engine.memory();
            eprintln!(
                "kiln generate: {} programs over one arena of {} bytes (one per program: {}), \
                 KV pool of {} slots × {max_seq} positions = {} bytes",
                memory.programs,
                memory.group.arena_bytes,
                memory.group.arena_sum_bytes,
                args.slots,
                memory.pool_bytes
            );
            Box::new(ContinuousBatchScheduler::new(engine, tokenizer))
        }
        SchedulerKind::Bucketed { spill } => {
            if args.buckets.is_empty() {
                bail!(
                    "--scheduler bucketed needs --buckets SLOTSxPOSITIONS,... (e.g. 8x256,2x2048)"
                );
            }
            let options = (args.buckets.iter())
                .map(|&(slots, positions)| EngineOptions {
                    tensor_parallel: shard,
                    ..EngineOptions::new(slots, positions, args.precision, args.mode)
                })
                .collect();
            let mut engines = Engine::group((&config, &loaded.weights), &args.backend, options)?;
            if let Some(world) = &world {
                for engine in &mut engines {
                    engine.join(world)?;
                }
            }
            if let Some(memory) = engines.first().map(Engine::memory) {
                eprintln!(
                    "kiln generate: {} buckets over one arena of {} bytes, KV pools of {} bytes",
                    engines.len(),
                    memory.group.arena_bytes,
                    engines.iter().map(|e| e.memory().pool_bytes).sum::<u64>()
                );
            }
            Box::new(LengthBucketedBatchScheduler::new(engines, tokenizer, spill))
        }
    };
    let compiled = started.elapsed();
    let ids = (prompts.iter().enumerate())
        .map(|(index, prompt)| {
            let request = Request {
                prompt: prompt.clone(),
                sampling: SamplingParams {
                    seed: args.sampling.seed.wrapping_add(index as u64),
                    ..args.sampling.clone()
                },
                stop: StopCriteria {
                    eos_token_ids: model.eos.clone(),
                    stop_strings: args.stop.clone(),
                    max_new_tokens: args.max_new_tokens,
                },
            };
            scheduler
                .submit(request)
                .with_context(|| format!("prompt {index}"))
        })
        .collect::<Result<Vec<RequestId>>>()?;
    let progress = match streamed || !reporter {
        true => indicatif::ProgressBar::hidden(),
        false => indicatif::ProgressBar::new(prompts.len() as u64),
    };
    // With stop strings the text is printed once it is done, cut before the stop string
    // (OpenAI's semantics: the stop string is not returned); otherwise as it comes.
    let streamed = streamed && reporter;
    let print_now = streamed && args.stop.is_empty();
    let mut out = std::io::stdout().lock();
    while !scheduler.is_idle() {
        let stepped = scheduler.step();
        if let Some(world) = &world {
            // Every rank sampled the same tokens, or the ranks stop here (a failed step
            // checks too, so the ranks' collectives stay paired).
            kiln_engine::engine::agree(world.as_ref(), stepped.as_deref().unwrap_or_default())?;
        }
        let events = stepped?;
        for event in events {
            if print_now {
                match (&event.text, event.token, tokenizer) {
                    (Some(piece), _, Some(_)) => write!(out, "{piece}")?,
                    (None, Some(token), None) => write!(out, "{token} ")?,
                    _ => {}
                }
                out.flush()?;
            }
            if event.finished.is_some() {
                progress.inc(1);
            }
        }
    }
    progress.finish_and_clear();
    let ms = |seconds: Option<f64>| seconds.unwrap_or_default() * 1e3;
    let mut records = Vec::with_capacity(ids.len());
    for (index, &id) in ids.iter().enumerate() {
        let outcome = scheduler
            .outcome(id)
            .with_context(|| format!("prompt {index} has no outcome"))?;
        if streamed {
            match (print_now, &outcome.text) {
                (true, _) => writeln!(out)?,
                (false, Some(text)) => writeln!(out, "{text}")?,
                (false, None) => writeln!(out, "{}", ids_text(&outcome.tokens))?,
            }
        }
        records.push(RequestRecord {
            index,
            finish_reason: outcome
                .finish_reason
                .with_context(|| format!("prompt {index} did not finish"))?,
            first_token_ms: ms(outcome.first_token_s),
            total_ms: ms(outcome.total_s),
            tokens: outcome.tokens,
            text: outcome.text,
        });
    }
    let failed: Vec<String> = (ids.iter().enumerate())
        .filter_map(|(index, &id)| {
            let error = scheduler.outcome(id)?.error?;
            Some(format!("prompt {index}: {error}"))
        })
        .collect();
    let report = Report::new(records, started.elapsed().as_secs_f64() * 1e3);
    if !reporter {
        return Ok(()); // rank 0 reports for the launch
    }
    let s = &report.summary;
    eprintln!(
        "kiln generate: {} request(s), {} tokens generated ({}), compile {:.0} ms, first token \
         P50 {:.0} ms, total P50 {:.0} / P95 {:.0} ms, {:.1} tokens/s",
        s.requests,
        s.generated_tokens,
        finish_reasons(&report.requests),
        compiled.as_secs_f64() * 1e3,
        s.first_token_ms.p50,
        s.total_ms.p50,
        s.total_ms.p95,
        s.tokens_per_second,
    );
    if let Some(json) = &args.json {
        let text = serde_json::to_string_pretty(&report)?;
        write_file_atomically(json, text.as_bytes())?;
    }
    if !failed.is_empty() {
        bail!(
            "{} of {} request(s) failed (the others finished):\n  {}",
            failed.len(),
            ids.len(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

fn ids_text(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(" ")
}

/// "finish reason: length" or "finish reasons: 3 stop, 1 length".
fn finish_reasons(records: &[RequestRecord]) -> String {
    let name = |r: &RequestRecord| r.finish_reason.as_str();
    if let [only] = records {
        return format!("finish reason: {}", name(only));
    }
    let mut counts = std::collections::BTreeMap::new();
    for record in records {
        *counts.entry(name(record)).or_insert(0) += 1;
    }
    let listed: Vec<String> = counts.iter().map(|(n, c)| format!("{c} {n}")).collect();
    format!("finish reasons: {}", listed.join(", "))
}
