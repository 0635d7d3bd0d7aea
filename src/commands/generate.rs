//! `kiln generate`: continue a prompt, streaming the text as it comes (the serial reference
//! generator on compiled, replayed programs).

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use kiln_engine::chat::Message;
use kiln_engine::generate::ReferenceGenerator;
use kiln_engine::generation_config::GenerationConfig;
use kiln_engine::sampler::Sampler;
use kiln_engine::sampling::SamplingParams;
use kiln_engine::stop::{StopChecker, StopCriteria};
use kiln_engine::tokenizer::Tokenizer;
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::Precision;
use kiln_runtime::{Backend, RunMode};

/// What to generate and how.
pub struct GenerateArgs {
    pub model: String,
    pub seed: u64,
    /// Text (through the tokenizer, or the chat template with `chat`), or token ids.
    pub prompt: Prompt,
    pub chat: bool,
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub backend: Backend,
    pub mode: RunMode,
    pub precision: Precision,
    pub max_seq: Option<usize>,
}

/// A prompt as text or as token ids.
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// Runs one generation, printing the text (or, without a tokenizer, the ids) to standard
/// output as it is generated and a summary to standard error.
pub fn generate(args: GenerateArgs) -> Result<()> {
    let source = ModelSource::resolve(&args.model)?;
    let dir = match &source {
        ModelSource::Dir(dir) => Some(dir.clone()),
        ModelSource::Preset(_) => None,
    };
    let tokenizer = match &dir {
        Some(dir) => Tokenizer::from_dir(dir)?,
        None => None,
    };
    let generation = match &dir {
        Some(dir) => GenerationConfig::load(dir)?,
        None => GenerationConfig::default(),
    };
    let prompt = match (&args.prompt, &tokenizer) {
        (Prompt::Ids(ids), _) => ids.clone(),
        (Prompt::Text(text), Some(tokenizer)) => {
            let text = match args.chat {
                true => tokenizer.apply_chat_template(&[Message::new("user", text)], true)?,
                false => text.clone(),
            };
            tokenizer.encode(&text, !args.chat)?
        }
        (Prompt::Text(_), None) => bail!(
            "{} has no tokenizer.json: give the prompt as token ids (--prompt-ids 1,2,3)",
            args.model
        ),
    };
    let mut eos = generation.eos_token_ids.clone();
    if let Some(id) = tokenizer.as_ref().and_then(Tokenizer::eos_token_id) {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    let mut stop = StopChecker::new(StopCriteria {
        eos_token_ids: eos,
        stop_strings: args.stop.clone(),
        max_new_tokens: args.max_new_tokens,
    })?;
    if !args.stop.is_empty() && tokenizer.is_none() {
        bail!(
            "--stop needs a tokenizer to see text; {} has none",
            args.model
        );
    }
    let mut sampler = Sampler::new(args.sampling.clone())?;
    let (config, loaded) = source
        .load(args.seed)
        .with_context(|| format!("loading model {}", args.model))?;
    if let Some(warning) = loaded.warning() {
        eprintln!("warning: {}: {warning}", args.model);
    }
    // The last generated token is never decoded: the cache holds one row less.
    let needed = (prompt.len() + args.max_new_tokens).saturating_sub(1);
    let positions = config.max_position_embeddings;
    if args.max_seq.is_none() && needed > positions {
        bail!(
            "{} prompt tokens and --max-new-tokens {} need {needed} positions; the model has \
             {positions} (max_position_embeddings)",
            prompt.len(),
            args.max_new_tokens
        );
    }
    let max_seq = args.max_seq.unwrap_or(needed);
    let started = Instant::now();
    let mut generator = ReferenceGenerator::new(
        (&config, &loaded.weights),
        args.backend,
        (args.mode, args.precision),
        max_seq,
    )?;
    let compiled = started.elapsed();
    let mut out = std::io::stdout().lock();
    let mut first_token = None;
    // With stop strings the text is printed once it is done, cut before the stop string
    // (OpenAI's semantics: the stop string is not returned); otherwise as it comes.
    let streaming = args.stop.is_empty();
    let mut text = String::new();
    let generated = generator.generate(
        &prompt,
        (&mut sampler, &mut stop),
        tokenizer.as_ref(),
        |token, piece| {
            first_token.get_or_insert_with(|| started.elapsed());
            let written = match (&tokenizer, piece) {
                (Some(_), Some(piece)) => {
                    text.push_str(piece);
                    match streaming {
                        true => write!(out, "{piece}"),
                        false => Ok(()),
                    }
                }
                (Some(_), None) => Ok(()),
                (None, _) => write!(out, "{token} "),
            };
            written
                .and_then(|()| out.flush())
                .map_err(|e| kiln_engine::Error::Generate {
                    reason: format!("cannot write to standard output: {e}"),
                })
        },
    )?;
    if !streaming {
        write!(out, "{}", generated.cause.returned_text(&text))?;
    }
    writeln!(out)?;
    let total = started.elapsed();
    let decode = total.saturating_sub(first_token.unwrap_or(total));
    let per_second = (generated.tokens.len().saturating_sub(1)) as f64 / decode.as_secs_f64();
    eprintln!(
        "kiln generate: {} prompt tokens, {} generated (finish reason: {}); compile {:.0} ms, \
         first token {:.0} ms, then {per_second:.1} tokens/s",
        prompt.len(),
        generated.tokens.len(),
        serde_json::to_value(generated.cause.finish_reason())?
            .as_str()
            .unwrap_or_default(),
        compiled.as_secs_f64() * 1e3,
        first_token.unwrap_or(total).as_secs_f64() * 1e3,
    );
    Ok(())
}
