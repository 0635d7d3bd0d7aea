//! The request bodies of `/v1/completions` and `/v1/chat/completions`, read into a
//! [`Generation`]: the engine's [`Request`] and how to answer it.
//!
//! Field names, types and defaults follow the OpenAI API (`max_tokens` 16 for a completion;
//! a chat may run to the end of its slot), with the sampling parameters vLLM adds (`top_k`,
//! `min_p`, `repetition_penalty`, `ignore_eos`, `return_token_ids`). A field the API has but
//! kiln does not implement is accepted only at its neutral value (`n` 1, `echo` false, no
//! `logprobs`, zero penalties); any other field, a wrong type or a value out of range is
//! refused naming the field.

use kiln_engine::chat::Message;
use kiln_engine::sampling::SamplingParams;
use kiln_engine::scheduler::Request;
use kiln_engine::stop::StopCriteria;
use kiln_engine::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// A completion's `max_tokens` when the request gives none (OpenAI's default).
pub const DEFAULT_COMPLETION_TOKENS: usize = 16;

/// Which endpoint a request came to: it decides the prompt's form and the answer's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// What the server knows when it reads a request.
pub struct Context<'a> {
    pub model: &'a str,
    pub tokenizer: Option<&'a Tokenizer>,
    /// The model's end-of-sequence ids (generation config and tokenizer).
    pub eos: &'a [u32],
    /// Positions of one KV slot: a chat without `max_tokens` runs to its end.
    pub max_seq: usize,
    /// The seed of a request that gives none.
    pub seed: u64,
}

/// One request, read and checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub endpoint: Endpoint,
    pub request: Request,
    pub stream: bool,
    /// A streamed answer ends with a chunk of `usage`.
    pub include_usage: bool,
    /// Each choice (each chunk) carries its token ids.
    pub return_token_ids: bool,
}

/// The fields both endpoints share.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CommonFields {
    model: Option<String>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<Value>,
    #[serde(default, deserialize_with = "null_is_false")]
    stream: bool,
    stream_options: Option<StreamOptions>,
    #[serde(default, deserialize_with = "null_is_false")]
    ignore_eos: bool,
    #[serde(default, deserialize_with = "null_is_false")]
    return_token_ids: bool,
    n: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    logit_bias: Option<serde_json::Map<String, Value>>,
    /// OpenAI's end-user id: accepted, not used.
    #[serde(rename = "user")]
    _user: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    #[serde(default, deserialize_with = "null_is_false")]
    include_usage: bool,
}

#[derive(Deserialize)]
struct CompletionBody {
    prompt: Value,
    max_tokens: Option<i64>,
    #[serde(default, deserialize_with = "null_is_false")]
    echo: bool,
    logprobs: Option<Value>,
    best_of: Option<i64>,
    suffix: Option<String>,
    /// The other fields, read as [`CommonFields`] (serde's `flatten` cannot deny unknown
    /// fields itself; `CommonFields` refuses them).
    #[serde(flatten)]
    common: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<ChatMessage>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    /// The other fields, read as [`CommonFields`] (serde's `flatten` cannot deny unknown
    /// fields itself; `CommonFields` refuses them).
    #[serde(flatten)]
    common: serde_json::Map<String, Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChatMessage {
    role: String,
    /// A string, text parts, or null (an assistant turn without text): empty.
    #[serde(default)]
    content: Value,
    /// The participant's name: accepted, not used (templates take role and content).
    #[serde(rename = "name")]
    _name: Option<String>,
}

/// A flag that may also be given as `null` (as clients send an unset field): false.
fn null_is_false<'de, D: serde::Deserializer<'de>>(flag: D) -> Result<bool, D::Error> {
    Option::<bool>::deserialize(flag).map(Option::unwrap_or_default)
}

/// The prompt as the request gives it, read once the model is known to be this one.
enum PromptInput {
    Completion(Value),
    Chat(Vec<ChatMessage>),
}

/// Reads a request body for `endpoint`.
pub fn parse(
    endpoint: Endpoint,
    body: &[u8],
    context: &Context<'_>,
) -> Result<Generation, ApiError> {
    let json = |e: serde_json::Error| ApiError::invalid(None, format!("the request body: {e}"));
    let (input, max_tokens, common) = match endpoint {
        Endpoint::Completions => {
            let body: CompletionBody = serde_json::from_slice(body).map_err(json)?;
            neutral("echo", !body.echo, "only false is supported")?;
            neutral(
                "logprobs",
                body.logprobs.is_none_or(|v| v.is_null()),
                "not supported",
            )?;
            neutral(
                "best_of",
                body.best_of.is_none_or(|n| n == 1),
                "only 1 is supported",
            )?;
            neutral("suffix", body.suffix.is_none(), "not supported")?;
            let common = common(body.common)?;
            (
                PromptInput::Completion(body.prompt),
                body.max_tokens,
                common,
            )
        }
        Endpoint::Chat => {
            let body: ChatBody = serde_json::from_slice(body).map_err(json)?;
            neutral("logprobs", body.logprobs != Some(true), "not supported")?;
            neutral("top_logprobs", body.top_logprobs.is_none(), "not supported")?;
            let common = common(body.common)?;
            let max = body.max_completion_tokens.or(body.max_tokens);
            (PromptInput::Chat(body.messages), max, common)
        }
    };
    if let Some(model) = &common.model {
        if model != context.model {
            return Err(ApiError::not_found(
                "model_not_found",
                format!(
                    "the model `{model}` does not exist; this server serves `{}`",
                    context.model
                ),
            ));
        }
    }
    let prompt = match &input {
        PromptInput::Completion(prompt) => completion_prompt(prompt, context)?,
        PromptInput::Chat(messages) => chat_prompt(messages, context)?,
    };
    neutral("n", common.n.is_none_or(|n| n == 1), "only 1 is supported")?;
    for (field, value) in [
        ("presence_penalty", common.presence_penalty),
        ("frequency_penalty", common.frequency_penalty),
    ] {
        neutral(field, value.is_none_or(|v| v == 0.0), "only 0 is supported")?;
    }
    neutral(
        "logit_bias",
        common.logit_bias.as_ref().is_none_or(|m| m.is_empty()),
        "not supported",
    )?;
    let max_new_tokens = match (max_tokens, endpoint) {
        (Some(n), _) if n < 1 => {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                format!("max_tokens is {n}; it must be at least 1"),
            ))
        }
        (Some(n), _) => usize::try_from(n).unwrap_or(usize::MAX),
        (None, Endpoint::Completions) => DEFAULT_COMPLETION_TOKENS,
        // The rest of the slot: the prompt and `n` new tokens need `prompt + n - 1` positions.
        (None, Endpoint::Chat) => (context.max_seq + 1).saturating_sub(prompt.len()).max(1),
    };
    let sampling = sampling(&common, context.seed)?;
    let stop_strings = stop_strings(common.stop.as_ref())?;
    if !stop_strings.is_empty() && context.tokenizer.is_none() {
        return Err(ApiError::invalid(
            Some("stop"),
            "stop strings need the model's tokenizer, and this model has none",
        ));
    }
    let stop = StopCriteria {
        eos_token_ids: if common.ignore_eos {
            Vec::new()
        } else {
            context.eos.to_vec()
        },
        stop_strings,
        max_new_tokens,
    };
    stop.validate()
        .map_err(|e| ApiError::invalid(Some("stop"), e.to_string()))?;
    Ok(Generation {
        endpoint,
        request: Request {
            prompt,
            sampling,
            stop,
        },
        stream: common.stream,
        include_usage: common.stream_options.is_some_and(|o| o.include_usage),
        return_token_ids: common.return_token_ids,
    })
}

/// Reads the shared fields out of what the endpoint's struct left over.
fn common(rest: serde_json::Map<String, Value>) -> Result<CommonFields, ApiError> {
    serde_json::from_value(Value::Object(rest))
        .map_err(|e| ApiError::invalid(None, format!("the request body: {e}")))
}

/// Refuses `field` unless it is `neutral`.
fn neutral(field: &'static str, neutral: bool, what: &str) -> Result<(), ApiError> {
    match neutral {
        true => Ok(()),
        false => Err(ApiError::invalid(Some(field), format!("`{field}`: {what}"))),
    }
}

/// A completion's prompt: a string, an array of token ids, or an array of one of those.
fn completion_prompt(prompt: &Value, context: &Context<'_>) -> Result<Vec<u32>, ApiError> {
    let bad = |message: String| Err(ApiError::invalid(Some("prompt"), message));
    match prompt {
        Value::String(text) => encode(text, true, context),
        Value::Array(items) if items.iter().all(Value::is_number) => token_ids(items),
        Value::Array(items) => match items.as_slice() {
            [one] => completion_prompt(one, context),
            _ => bad(format!(
                "{} prompts in one request: kiln takes one prompt per request",
                items.len()
            )),
        },
        _ => bad("the prompt must be a string or an array of token ids".to_string()),
    }
}

fn token_ids(items: &[Value]) -> Result<Vec<u32>, ApiError> {
    (items.iter().enumerate())
        .map(|(i, item)| {
            (item.as_u64())
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| {
                    ApiError::invalid(
                        Some("prompt"),
                        format!("prompt token {i} is {item}, not a token id"),
                    )
                })
        })
        .collect()
}

/// The chat's messages through the model's chat template, with the assistant's turn opened.
fn chat_prompt(messages: &[ChatMessage], context: &Context<'_>) -> Result<Vec<u32>, ApiError> {
    let tokenizer = context.tokenizer.ok_or_else(|| {
        ApiError::invalid(
            Some("messages"),
            "chat needs the model's tokenizer and chat template; this model has no tokenizer \
             (use /v1/completions with token ids)",
        )
    })?;
    if messages.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "there are no messages"));
    }
    let messages = (messages.iter().enumerate())
        .map(|(i, message)| {
            let content = message_text(&message.content).ok_or_else(|| {
                ApiError::invalid(
                    Some("messages"),
                    format!("message {i}: content must be a string or an array of text parts"),
                )
            })?;
            Ok(Message::new(&message.role, &content))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text = (tokenizer.apply_chat_template(&messages, true))
        .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    encode(&text, false, context)
}

/// A message's text: a string, or the concatenated text of `[{"type": "text", "text": …}]`.
fn message_text(content: &Value) -> Option<String> {
    match content {
        Value::Null => Some(String::new()),
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(
                |part| match (part.get("type")?.as_str()?, part.get("text")?.as_str()) {
                    ("text", Some(text)) => Some(text),
                    _ => None,
                },
            )
            .collect(),
        _ => None,
    }
}

fn encode(text: &str, special: bool, context: &Context<'_>) -> Result<Vec<u32>, ApiError> {
    let tokenizer = context.tokenizer.ok_or_else(|| {
        ApiError::invalid(
            Some("prompt"),
            "a text prompt needs the model's tokenizer, and this model has none: give the \
             prompt as an array of token ids",
        )
    })?;
    (tokenizer.encode(text, special)).map_err(|e| ApiError::invalid(Some("prompt"), e.to_string()))
}

/// The sampling parameters, refused out of range by name.
fn sampling(common: &CommonFields, seed: u64) -> Result<SamplingParams, ApiError> {
    let top_k = match common.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                Some("top_k"),
                format!("top_k is {k}; it must be -1 or 0 (all tokens) or at least 1"),
            ))
        }
    };
    let params = SamplingParams {
        temperature: common.temperature.unwrap_or(1.0),
        top_k,
        top_p: common.top_p.unwrap_or(1.0),
        min_p: common.min_p.unwrap_or(0.0),
        repetition_penalty: common.repetition_penalty.unwrap_or(1.0),
        // A negative seed keeps its bits: any integer seeds a request.
        seed: common.seed.map_or(seed, |s| s as u64),
    };
    params.validate().map_err(|e| {
        let param = match &e {
            kiln_engine::Error::SamplingParameter { parameter, .. } => Some(*parameter),
            _ => None,
        };
        ApiError::invalid(param, e.to_string())
    })?;
    Ok(params)
}

/// Stop strings a request may give, and the bytes of each: they are searched at every token
/// on the engine's thread, and a stream holds back as much text as the longest.
pub const MAX_STOP_STRINGS: usize = 16;
pub const MAX_STOP_BYTES: usize = 256;

/// `stop`: absent, a string or an array of strings (at most [`MAX_STOP_STRINGS`] of at most
/// [`MAX_STOP_BYTES`] bytes).
fn stop_strings(stop: Option<&Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::invalid(Some("stop"), "stop must be a string or an array of strings");
    let strings: Vec<String> = match stop {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => (items.iter())
            .map(|item| item.as_str().map(str::to_string).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if strings.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            Some("stop"),
            format!("{} stop strings: at most {MAX_STOP_STRINGS}", strings.len()),
        ));
    }
    if let Some(long) = strings.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::invalid(
            Some("stop"),
            format!(
                "a stop string of {} bytes: at most {MAX_STOP_BYTES}",
                long.len()
            ),
        ));
    }
    Ok(strings)
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
