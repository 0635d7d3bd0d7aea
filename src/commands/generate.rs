//! `kiln generate`: continue prompts on the serial reference generator (compiled prefill and
//! decode programs, replayed per token). One `--prompt` streams its text to standard output as
//! it comes; `--prompts FILE` runs every prompt of the file in order with a progress bar, and
//! `--json OUT` writes what each produced and a latency summary (see `report.rs`).

mod prompts;
mod report;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kiln_engine::chat::Message;
use kiln_engine::generate::ReferenceGenerator;
use kiln_engine::generation_config::GenerationConfig;
use kiln_engine::sampler::Sampler;
use kiln_engine::sampling::SamplingParams;
use kiln_engine::stop::{StopChecker, StopCriteria};
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
    /// Write the report here (must not exist).
    pub json: Option<PathBuf>,
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

/// Runs the generation (see the module doc); a summary goes to standard error.
pub fn generate(args: GenerateArgs) -> Result<()> {
    if let Some(json) = &args.json {
        check_absent(json).map_err(|e| anyhow::anyhow!("{e} (choose another --json)"))?;
    }
    let source = ModelSource::resolve(&args.model)?;
    let dir = match &source {
        ModelSource::Dir(dir) => Some(dir.clone()),
        ModelSource::Preset(_) => None,
    };
    let tokenizer = dir
        .as_deref()
        .map(Tokenizer::from_dir)
        .transpose()?
        .flatten();
    let generation = match &dir {
        Some(dir) => GenerationConfig::load(dir)?,
        None => GenerationConfig::default(),
    };
    if !args.stop.is_empty() && tokenizer.is_none() {
        bail!(
            "--stop needs a tokenizer to see text; {} has none",
            args.model
        );
    }
    let mut eos = generation.eos_token_ids.clone();
    eos.extend(
        tokenizer
            .as_ref()
            .and_then(Tokenizer::eos_token_id)
            .filter(|id| !eos.contains(id)),
    );
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
    let (config, loaded) = (source.load(args.seed, args.precision.weight_dtype()))
        .with_context(|| format!("loading model {}", args.model))?;
    if let Some(warning) = loaded.warning() {
        eprintln!("warning: {}: {warning}", args.model);
    }
    // The last generated token is never decoded: the cache holds one row less.
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let needed = (longest + args.max_new_tokens).saturating_sub(1);
    let positions = config.max_position_embeddings;
    if args.max_seq.is_none() && needed > positions {
        bail!(
            "{longest} prompt tokens and --max-new-tokens {} need {needed} positions; the model \
             has {positions} (max_position_embeddings)",
            args.max_new_tokens
        );
    }
    let started = Instant::now();
    let mut generator = ReferenceGenerator::new(
        (&config, &loaded.weights),
        args.backend.clone(),
        (args.mode, args.precision),
        args.max_seq.unwrap_or(needed),
    )?;
    let compiled = started.elapsed();
    let progress = match streamed {
        true => indicatif::ProgressBar::hidden(),
        false => indicatif::ProgressBar::new(prompts.len() as u64),
    };
    let mut records = Vec::with_capacity(prompts.len());
    for (index, prompt) in prompts.iter().enumerate() {
        let sampling = SamplingParams {
            seed: args.sampling.seed.wrapping_add(index as u64),
            ..args.sampling.clone()
        };
        let record = run_one(
            &mut generator,
            (prompt, index),
            &model,
            &args,
            sampling,
            streamed,
            started,
        )
        .with_context(|| format!("prompt {index}"))?;
        records.push(record);
        progress.inc(1);
    }
    progress.finish_and_clear();
    let report = Report::new(records, started.elapsed().as_secs_f64() * 1e3);
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
    Ok(())
}

/// Generates for one prompt; with `streamed`, prints its text (or ids) as it comes.
fn run_one(
    generator: &mut ReferenceGenerator,
    (prompt, index): (&[u32], usize),
    model: &Model,
    args: &GenerateArgs,
    sampling: SamplingParams,
    streamed: bool,
    submitted: Instant,
) -> Result<RequestRecord> {
    let mut stop = StopChecker::new(StopCriteria {
        eos_token_ids: model.eos.clone(),
        stop_strings: args.stop.clone(),
        max_new_tokens: args.max_new_tokens,
    })?;
    let mut sampler = Sampler::new(sampling)?;
    let tokenizer = model.tokenizer.as_ref();
    let mut out = std::io::stdout().lock();
    // With stop strings the text is printed once it is done, cut before the stop string
    // (OpenAI's semantics: the stop string is not returned); otherwise as it comes.
    let print_now = streamed && args.stop.is_empty();
    let (mut text, mut first_token) = (String::new(), None);
    let generated = generator.generate(
        prompt,
        (&mut sampler, &mut stop),
        tokenizer,
        |token, piece| {
            first_token.get_or_insert_with(|| submitted.elapsed());
            text.push_str(piece.unwrap_or_default());
            let written = match (print_now, tokenizer, piece) {
                (true, Some(_), Some(piece)) => write!(out, "{piece}"),
                (true, None, _) => write!(out, "{token} "),
                _ => Ok(()),
            };
            written
                .and_then(|()| out.flush())
                .map_err(|e| kiln_engine::Error::Generate {
                    reason: format!("cannot write to standard output: {e}"),
                })
        },
    )?;
    let returned = generated.cause.returned_text(&text).to_string();
    if streamed {
        match (print_now, tokenizer) {
            (false, Some(_)) => writeln!(out, "{returned}")?,
            (false, None) => writeln!(out, "{}", ids_text(&generated.tokens))?,
            (true, _) => writeln!(out)?,
        }
    }
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    Ok(RequestRecord {
        index,
        tokens: generated.tokens,
        text: tokenizer.map(|_| returned),
        finish_reason: generated.cause.finish_reason(),
        first_token_ms: ms(first_token.unwrap_or_default()),
        total_ms: ms(submitted.elapsed()),
    })
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
