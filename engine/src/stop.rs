//! When a request is done: an end-of-sequence token, a stop string in the decoded text, or
//! `max_new_tokens` generated — the `stop` and `length` finish reasons of the OpenAI API.
//!
//! The end-of-sequence ids come by default from `generation_config.json`'s `eos_token_id` (HF
//! `generate` stops on any of them). A stop string follows OpenAI semantics: the request
//! finishes as soon as the decoded text contains it, and the text returned ends where the stop
//! string begins (neither it nor anything after it is returned). Stop strings can only be seen
//! when the caller passes the decoded text; token ids and the length limit need none.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::generation_config::GenerationConfig;

/// Bytes before the end of the previously checked text that are searched again, beyond a stop
/// string's length: a streaming decoder may rewrite the last few bytes (an incomplete UTF-8
/// sequence shown as U+FFFD until its last byte arrives).
const REWRITTEN_TAIL_BYTES: usize = 16;

/// What ends one request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StopCriteria {
    /// Token ids that end the request when generated (the token itself is the last one).
    pub eos_token_ids: Vec<u32>,
    /// Strings that end the request when they appear in the decoded text; each must be
    /// non-empty.
    pub stop_strings: Vec<String>,
    /// The most tokens the request may generate; at least 1.
    pub max_new_tokens: usize,
}

impl StopCriteria {
    /// The model's end-of-sequence ids from its generation config, no stop strings, and
    /// `max_new_tokens`.
    pub fn from_generation_config(config: &GenerationConfig, max_new_tokens: usize) -> Self {
        Self {
            eos_token_ids: config.eos_token_ids.clone(),
            stop_strings: Vec::new(),
            max_new_tokens,
        }
    }

    /// Refuses criteria that stop before any token (`max_new_tokens` 0) or at once (an empty
    /// stop string, which every text contains).
    pub fn validate(&self) -> Result<()> {
        if self.max_new_tokens == 0 {
            return Err(Error::StopCriteria {
                field: "max_new_tokens",
                reason: "must be at least 1".to_string(),
            });
        }
        if let Some(index) = self.stop_strings.iter().position(String::is_empty) {
            return Err(Error::StopCriteria {
                field: "stop_strings",
                reason: format!("stop string {index} is empty; every text contains it"),
            });
        }
        Ok(())
    }
}

/// Why a request finished, as the OpenAI API names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// `max_new_tokens` were generated.
    Length,
    /// An end-of-sequence token or a stop string.
    Stop,
    /// The request was cancelled before it finished.
    Cancelled,
    /// The request failed on its own (its logits held NaN, say); the others went on.
    Error,
}

impl FinishReason {
    /// The OpenAI name (`"length"`, `"stop"`; kiln's `"cancelled"` and `"error"`), as it is
    /// serialized.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Length => "length",
            FinishReason::Stop => "stop",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

/// What exactly finished a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopCause {
    /// The last generated token is one of the end-of-sequence ids.
    EosToken { token: u32 },
    /// Stop string `index` of the criteria appears in the text, first at byte `text_end`: the
    /// text to return is `text[..text_end]`.
    StopString { index: usize, text_end: usize },
    /// `max_new_tokens` tokens were generated.
    MaxNewTokens,
}

impl StopCause {
    /// The OpenAI finish reason of this cause.
    pub fn finish_reason(&self) -> FinishReason {
        match self {
            Self::EosToken { .. } | Self::StopString { .. } => FinishReason::Stop,
            Self::MaxNewTokens => FinishReason::Length,
        }
    }

    /// The part of the decoded `text` to return: up to, not including, a stop string; all of
    /// it otherwise.
    pub fn returned_text<'t>(&self, text: &'t str) -> &'t str {
        match self {
            Self::StopString { text_end, .. } => text.get(..*text_end).unwrap_or(text),
            Self::EosToken { .. } | Self::MaxNewTokens => text,
        }
    }
}

/// Follows one request's generated tokens and says when and why it is done.
#[derive(Debug, Clone)]
pub struct StopChecker {
    criteria: StopCriteria,
    longest_stop_string: usize,
    generated: usize,
    checked_text_len: usize,
    finished: Option<StopCause>,
}

impl StopChecker {
    /// A checker for `criteria`, refused if they are invalid (see [`StopCriteria::validate`]).
    pub fn new(criteria: StopCriteria) -> Result<Self> {
        criteria.validate()?;
        let longest_stop_string = criteria.stop_strings.iter().map(String::len).max();
        Ok(Self {
            longest_stop_string: longest_stop_string.unwrap_or(0),
            criteria,
            generated: 0,
            checked_text_len: 0,
            finished: None,
        })
    }

    /// Takes the next generated `token` and, when a tokenizer is at hand, `text`: the whole
    /// text decoded from the generated tokens so far (it may differ from the previous call's
    /// only in its last few bytes and in what is appended). Returns why to finish, or `None` to
    /// go on. A stop string outranks an end-of-sequence token, which outranks the length limit.
    /// Once finished, further calls return the same cause and count nothing.
    pub fn check(&mut self, token: u32, text: Option<&str>) -> Option<StopCause> {
        if let Some(cause) = &self.finished {
            return Some(cause.clone());
        }
        self.generated += 1;
        let cause = text
            .and_then(|text| self.find_stop_string(text))
            .or_else(|| {
                self.criteria
                    .eos_token_ids
                    .contains(&token)
                    .then_some(StopCause::EosToken { token })
            })
            .or_else(|| {
                (self.generated >= self.criteria.max_new_tokens).then_some(StopCause::MaxNewTokens)
            });
        self.finished.clone_from(&cause);
        cause
    }

    /// How many tokens have been checked.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Why the request finished, if it has.
    pub fn finished(&self) -> Option<&StopCause> {
        self.finished.as_ref()
    }

    /// The criteria this checker follows.
    pub fn criteria(&self) -> &StopCriteria {
        &self.criteria
    }

    /// The earliest stop string in the part of `text` not yet ruled out (ties to the first
    /// listed).
    fn find_stop_string(&mut self, text: &str) -> Option<StopCause> {
        if self.criteria.stop_strings.is_empty() {
            return None;
        }
        let reach_back = self.longest_stop_string + REWRITTEN_TAIL_BYTES;
        let mut start = self
            .checked_text_len
            .min(text.len())
            .saturating_sub(reach_back);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        self.checked_text_len = text.len();
        let window = &text[start..];
        let (index, found_at) = (self.criteria.stop_strings.iter().enumerate())
            .filter_map(|(index, stop)| window.find(stop.as_str()).map(|at| (index, at)))
            .min_by_key(|&(index, at)| (at, index))?;
        Some(StopCause::StopString {
            index,
            text_end: start + found_at,
        })
    }
}

#[cfg(test)]
#[path = "stop_tests.rs"]
mod tests;
