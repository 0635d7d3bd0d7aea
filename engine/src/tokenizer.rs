//! A model's tokenizer, as Hugging Face stores it: `tokenizer.json` (read by the `tokenizers`
//! crate, pure Rust) and the optional `tokenizer_config.json` beside it, whose
//! `chat_template`, `bos_token` and `eos_token` this module reads (see [`chat`](crate::chat)).
//!
//! A model directory without `tokenizer.json` has no tokenizer ([`Tokenizer::from_dir`] gives
//! `None`): kiln still generates from token ids.
//!
//! Streaming text: [`TextStream`] turns generated ids into text pieces as they come, through
//! the crate's own `DecodeStream`, which holds a piece back until it decodes to whole
//! characters, so a character split over several byte-level tokens is never printed in halves
//! (and never as U+FFFD).

use std::path::{Path, PathBuf};

use crate::chat::{ChatTemplate, Message};
use crate::error::{Error, Result};
use crate::regular_file::read_optional_text;

/// The tokenizer's file in a Hugging Face model directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// Its optional companion with the chat template and the special tokens' names.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// Size caps: `tokenizer.json` of large vocabularies is tens of MB; a config is small.
const TOKENIZER_LIMIT: u64 = 256 << 20;
const CONFIG_LIMIT: u64 = 16 << 20;

/// A loaded tokenizer with its special tokens and chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: Option<ChatTemplate>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size())
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// The tokenizer of model directory `dir`, or `None` when it has no `tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Option<Tokenizer>> {
        let file = dir.join(TOKENIZER_FILE);
        let Some(text) = read_optional_text(&file, TOKENIZER_LIMIT)? else {
            return Ok(None);
        };
        let config = dir.join(TOKENIZER_CONFIG_FILE);
        let config = read_optional_text(&config, CONFIG_LIMIT)?.map(|text| (config, text));
        Self::parse(&file, &text, config).map(Some)
    }

    /// The tokenizer of `tokenizer.json` at `file`, with `tokenizer_config.json` at `config`.
    pub fn from_files(file: &Path, config: Option<&Path>) -> Result<Tokenizer> {
        let missing = |path: &Path| Error::Io {
            path: path.display().to_string(),
            reason: "no such file".to_string(),
        };
        let text = read_optional_text(file, TOKENIZER_LIMIT)?.ok_or_else(|| missing(file))?;
        let config = match config {
            Some(path) => {
                let text = read_optional_text(path, CONFIG_LIMIT)?.ok_or_else(|| missing(path))?;
                Some((path.to_path_buf(), text))
            }
            None => None,
        };
        Self::parse(file, &text, config)
    }

    /// The tokenizer of the text of a `tokenizer.json` (read from `file`).
    fn parse(file: &Path, text: &str, config: Option<(PathBuf, String)>) -> Result<Tokenizer> {
        let inner: tokenizers::Tokenizer =
            text.parse()
                .map_err(|e: tokenizers::Error| Error::Tokenizer {
                    path: file.display().to_string(),
                    reason: format!("not a tokenizer.json the tokenizers crate reads: {e}"),
                })?;
        Self::new(inner, file.display().to_string(), config)
    }

    /// A tokenizer from a `tokenizers` one and, optionally, the text of its
    /// `tokenizer_config.json` (with the path errors name).
    pub fn new(
        inner: tokenizers::Tokenizer,
        source: String,
        config: Option<(PathBuf, String)>,
    ) -> Result<Tokenizer> {
        let mut tokenizer = Tokenizer {
            inner,
            source,
            bos_token: None,
            eos_token: None,
            chat_template: None,
        };
        if let Some((path, text)) = config {
            let path = path.display().to_string();
            let json: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| Error::Tokenizer {
                    path: path.clone(),
                    reason: format!("not valid JSON: {e}"),
                })?;
            tokenizer.bos_token = token_name(&path, &json, "bos_token")?;
            tokenizer.eos_token = token_name(&path, &json, "eos_token")?;
            tokenizer.chat_template = ChatTemplate::from_config(&path, &json)?;
        }
        Ok(tokenizer)
    }

    /// Entries of the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of `token` (a special token's text, such as `<|im_end|>`), if it has one.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The end-of-sequence token's id, as `tokenizer_config.json` names it.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.token_id(t))
    }

    /// Ids of `text`; special tokens written in the text (`<|im_start|>`) become their ids,
    /// and with `add_special_tokens` the post-processor adds its own (a BOS, say).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = (self.inner.encode(text, add_special_tokens))
            .map_err(|e| self.error(format!("cannot encode the text: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids` (each below [`vocab_size`](Self::vocab_size)); with
    /// `skip_special_tokens` special tokens leave no text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.check_ids(ids)?;
        (self.inner.decode(ids, skip_special_tokens))
            .map_err(|e| self.error(format!("cannot decode {} ids: {e}", ids.len())))
    }

    /// A stream that turns ids into text as they are generated (see the module doc).
    pub fn stream(&self, skip_special_tokens: bool) -> TextStream<'_> {
        TextStream {
            tokenizer: self,
            inner: self.inner.decode_stream(skip_special_tokens),
        }
    }

    /// `messages` through the model's chat template, as transformers'
    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)` renders them.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self.chat_template.as_ref().ok_or_else(|| {
            self.error(format!(
                "has no chat template ({TOKENIZER_CONFIG_FILE} has no `chat_template`)"
            ))
        })?;
        template.render(
            messages,
            add_generation_prompt,
            (self.bos_token.as_deref(), self.eos_token.as_deref()),
        )
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let vocab = self.vocab_size();
        match ids.iter().position(|&id| id as usize >= vocab) {
            Some(at) => Err(self.error(format!(
                "token id {} at position {at} is outside the vocabulary of {vocab}",
                ids[at]
            ))),
            None => Ok(()),
        }
    }

    fn error(&self, reason: String) -> Error {
        Error::Tokenizer {
            path: self.source.clone(),
            reason,
        }
    }
}

/// Generated ids to text, piece by piece (see the module doc).
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    inner: tokenizers::DecodeStream<
        't,
        tokenizers::ModelWrapper,
        tokenizers::NormalizerWrapper,
        tokenizers::PreTokenizerWrapper,
        tokenizers::PostProcessorWrapper,
        tokenizers::DecoderWrapper,
    >,
}

impl TextStream<'_> {
    /// The text that `id` completes: `None` while it ends inside a character (the bytes are
    /// kept for the next id).
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.tokenizer.check_ids(&[id])?;
        (self.inner.step(id))
            .map_err(|e| self.tokenizer.error(format!("cannot decode id {id}: {e}")))
    }
}

/// A special token's name in `tokenizer_config.json`: a string, or an object whose `content`
/// is one (transformers' `AddedToken` form); absent or null is `None`.
fn token_name(path: &str, json: &serde_json::Value, field: &str) -> Result<Option<String>> {
    let wrong = || Error::TokenizerConfig {
        path: path.to_string(),
        field: field.to_string(),
        reason: "must be a string or an object with a string `content`".to_string(),
    };
    match json.get(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(name)) => Ok(Some(name.clone())),
        Some(serde_json::Value::Object(token)) => match token.get("content") {
            Some(serde_json::Value::String(name)) => Ok(Some(name.clone())),
            _ => Err(wrong()),
        },
        Some(_) => Err(wrong()),
    }
}

#[cfg(test)]
#[path = "tokenizer_tests.rs"]
mod tests;
