//! A model directory's optional `generation_config.json` (Hugging Face
//! `transformers.GenerationConfig`): the end-of-sequence ids generation stops on and the
//! sampling defaults the model ships with.
//!
//! Read: `eos_token_id` (an integer or a list of integers) and `do_sample`, `temperature`,
//! `top_k`, `top_p`, `min_p`, `repetition_penalty`. Every other field is ignored (HF defines
//! dozens), and `null` counts as absent, as in HF. No file means no defaults beyond
//! [`SamplingParams::default`]. A file that is not a JSON object, a field of the wrong type or a
//! sampling default out of its range is an error naming the file and the field. The file is
//! opened only if it is a regular file of at most [`GENERATION_CONFIG_LIMIT`] bytes.
//!
//! `do_sample: false` makes the defaults greedy (temperature 0), as HF's greedy search. HF also
//! decodes greedily when `do_sample` is absent; kiln then samples with the file's values, as
//! OpenAI-style servers do, since a request states its own temperature anyway.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::regular_file::read_optional_text;
use crate::sampling::SamplingParams;

/// The file name inside a model directory.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// The largest `generation_config.json` read: real ones are well under a kilobyte.
pub const GENERATION_CONFIG_LIMIT: u64 = 1 << 20;

/// What kiln takes from `generation_config.json`; each `None` is a field the file leaves out.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GenerationConfig {
    /// `eos_token_id`, as a list whichever form the file uses; empty if absent.
    pub eos_token_ids: Vec<u32>,
    pub do_sample: Option<bool>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl GenerationConfig {
    /// Reads `model_dir/generation_config.json`, or the defaults if there is no such file.
    pub fn load(model_dir: &Path) -> Result<Self> {
        let path = model_dir.join(GENERATION_CONFIG_FILE);
        match read_optional_text(&path, GENERATION_CONFIG_LIMIT)? {
            Some(text) => Self::parse(&text, &path),
            None => Ok(Self::default()),
        }
    }

    /// Parses the text of a generation config; `path` names it in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self> {
        let path_name = path.display().to_string();
        let object = match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(object)) => object,
            Ok(other) => {
                return Err(Error::GenerationConfigSyntax {
                    path: path_name,
                    reason: format!("expected a JSON object, found {}", describe(&other)),
                })
            }
            Err(e) => {
                return Err(Error::GenerationConfigSyntax {
                    path: path_name,
                    reason: format!("not valid JSON: {e}"),
                })
            }
        };
        let fields = Fields {
            object: &object,
            path: &path_name,
        };
        let config = Self {
            eos_token_ids: fields.token_ids("eos_token_id")?,
            do_sample: fields.get("do_sample", "a boolean", Value::as_bool)?,
            temperature: fields.number("temperature")?,
            top_k: fields.get("top_k", "a non-negative integer", |v| {
                v.as_u64().and_then(|k| usize::try_from(k).ok())
            })?,
            top_p: fields.number("top_p")?,
            min_p: fields.number("min_p")?,
            repetition_penalty: fields.number("repetition_penalty")?,
        };
        config
            .stated_sampling_values()
            .validate()
            .map_err(|e| match e {
                Error::SamplingParameter { parameter, .. } => Error::GenerationConfigField {
                    path: path_name.clone(),
                    field: parameter,
                    reason: e.to_string(),
                },
                other => other,
            })?;
        Ok(config)
    }

    /// The sampling parameters of a request that states none of its own: the file's values
    /// over [`SamplingParams::default`], greedy if `do_sample` is `false`.
    pub fn sampling_params(&self, seed: u64) -> SamplingParams {
        let mut params = self.stated_sampling_values();
        params.seed = seed;
        if self.do_sample == Some(false) {
            params.temperature = 0.0;
        }
        params
    }

    fn stated_sampling_values(&self) -> SamplingParams {
        let defaults = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_k: self.top_k.unwrap_or(defaults.top_k),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            seed: defaults.seed,
        }
    }
}

/// The fields of one parsed file, read with errors naming the file and the field.
struct Fields<'a> {
    object: &'a Map<String, Value>,
    path: &'a str,
}

impl Fields<'_> {
    fn wrong_type(&self, field: &'static str, expected: &str, found: &Value) -> Error {
        Error::GenerationConfigField {
            path: self.path.to_string(),
            field,
            reason: format!("expected {expected}, found {}", describe(found)),
        }
    }

    /// The field converted by `convert`, `None` if absent or `null`.
    fn get<T>(
        &self,
        field: &'static str,
        expected: &str,
        convert: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.object.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => convert(value)
                .map(Some)
                .ok_or_else(|| self.wrong_type(field, expected, value)),
        }
    }

    fn number(&self, field: &'static str) -> Result<Option<f32>> {
        self.get(field, "a number", |v| v.as_f64().map(|x| x as f32))
    }

    /// A token id or a list of them, as a list.
    fn token_ids(&self, field: &'static str) -> Result<Vec<u32>> {
        let expected = "a token id (a non-negative integer below 2^32) or a list of them";
        let token_id = |v: &Value| v.as_u64().and_then(|id| u32::try_from(id).ok());
        match self.object.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| token_id(item).ok_or_else(|| self.wrong_type(field, expected, item)))
                .collect(),
            Some(value) => token_id(value)
                .map(|id| vec![id])
                .ok_or_else(|| self.wrong_type(field, expected, value)),
        }
    }
}

/// A short description of a JSON value for an error message.
fn describe(value: &Value) -> String {
    const SHOWN_CHARS: usize = 40;
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    };
    let text = value.to_string();
    let shown: String = text.chars().take(SHOWN_CHARS).collect();
    let ellipsis = if shown.len() < text.len() { "…" } else { "" };
    format!("{kind} ({shown}{ellipsis})")
}

#[cfg(test)]
#[path = "generation_config_tests.rs"]
mod tests;
