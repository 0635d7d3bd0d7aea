//! Generation for the bindings: one prompt continued by kiln-engine's serial reference
//! generator on compiled prefill and decode programs, with the model directory's tokenizer
//! and end-of-sequence ids, as `kiln generate --scheduler reference` does.

use kiln_engine::generate::ReferenceGenerator;
use kiln_engine::generation_config::GenerationConfig;
use kiln_engine::sampler::Sampler;
use kiln_engine::sampling::SamplingParams;
use kiln_engine::stop::{StopChecker, StopCriteria};
use kiln_engine::tokenizer::Tokenizer;
use kiln_frontend::hf::source::ModelSource;
use kiln_runtime::RunMode;

use crate::error::{Error, Result};
use crate::session::Model;

/// A prompt: text (through the tokenizer) or token ids.
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// How to continue a prompt.
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: SamplingParams,
    /// Strings that end the generation (need a tokenizer).
    pub stop: Vec<String>,
    pub mode: RunMode,
}

/// What one generation produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The prompt's ids (as the tokenizer made them from text).
    pub prompt: Vec<u32>,
    /// The generated ids, the end-of-sequence token that stopped it included.
    pub tokens: Vec<u32>,
    /// The decoded text, up to a stop string; `None` without a tokenizer.
    pub text: Option<String>,
    /// `"stop"` or `"length"` (OpenAI's names).
    pub finish_reason: &'static str,
}

/// The tokenizer of a model directory that has one, and the ids generation stops on (the
/// generation config's `eos_token_id`, then the tokenizer's eos token).
fn text_side(source: &ModelSource) -> Result<(Option<Tokenizer>, Vec<u32>)> {
    let ModelSource::Dir(dir) = source else {
        return Ok((None, Vec::new()));
    };
    let tokenizer = Tokenizer::from_dir(dir)?;
    let mut eos = GenerationConfig::load(dir)?.eos_token_ids;
    if let Some(id) = tokenizer.as_ref().and_then(Tokenizer::eos_token_id) {
        if !eos.contains(&id) {
            eos.push(id);
        }
    }
    Ok((tokenizer, eos))
}

impl Model {
    /// Continues `prompt` (see the module doc).
    pub fn generate(&self, prompt: Prompt, options: GenerateOptions) -> Result<Generation> {
        let (tokenizer, eos) = text_side(self.source())?;
        let ids = match (prompt, &tokenizer) {
            (Prompt::Ids(ids), _) => ids,
            (Prompt::Text(text), Some(tokenizer)) => tokenizer.encode(&text, true)?,
            (Prompt::Text(_), None) => {
                return Err(Error::argument(
                    "prompt",
                    format!(
                        "{} has no tokenizer.json: give the prompt as a list of token ids",
                        self.name()
                    ),
                ))
            }
        };
        if !options.stop.is_empty() && tokenizer.is_none() {
            return Err(Error::argument(
                "stop",
                format!(
                    "stop strings need a tokenizer to see text; {} has none",
                    self.name()
                ),
            ));
        }
        // The last generated token is never decoded: the cache holds one row less.
        let rows = (ids.len().saturating_add(options.max_new_tokens)).saturating_sub(1);
        let positions = self.config().max_position_embeddings;
        if rows > positions {
            return Err(Error::argument(
                "max_new_tokens",
                format!(
                    "{} prompt tokens and {} new ones need {rows} positions; the model has \
                     {positions}",
                    ids.len(),
                    options.max_new_tokens
                ),
            ));
        }
        let weights = self.leaves()?;
        let mut generator = ReferenceGenerator::new(
            (self.config(), &weights),
            self.backend().clone(),
            (options.mode, self.precision()),
            rows.max(1),
        )?;
        let mut sampler = Sampler::new(options.sampling)?;
        let mut stop = StopChecker::new(StopCriteria {
            eos_token_ids: eos,
            stop_strings: options.stop,
            max_new_tokens: options.max_new_tokens,
        })?;
        let mut text = String::new();
        let generated = generator.generate(
            &ids,
            (&mut sampler, &mut stop),
            tokenizer.as_ref(),
            |_, piece| {
                text.push_str(piece.unwrap_or_default());
                Ok(())
            },
        )?;
        Ok(Generation {
            prompt: ids,
            text: tokenizer
                .as_ref()
                .map(|_| generated.cause.returned_text(&text).to_string()),
            finish_reason: generated.cause.finish_reason().as_str(),
            tokens: generated.tokens,
        })
    }
}
