//! The HTTP endpoints: completions and chat (whole or streamed as server-sent events), the
//! model list, health and metrics.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, Stream};
use kiln_engine::scheduler::{Outcome, RequestId};
use kiln_engine::stop::FinishReason;
use kiln_engine::tokenizer::Tokenizer;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::protocol::{self, Context, Endpoint, Generation};
use crate::worker::{Command, EngineInfo, Health, Refusal, Update};

/// What every handler shares.
pub struct App {
    pub model: String,
    pub tokenizer: Option<Arc<Tokenizer>>,
    pub eos: Vec<u32>,
    pub info: EngineInfo,
    pub commands: mpsc::UnboundedSender<Command>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// Set once a shutdown signal came: nothing new is admitted.
    pub draining: AtomicBool,
    /// Numbers response ids and seeds requests that give none.
    pub counter: AtomicU64,
    pub started: u64,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError::not_found("not_found", "no such endpoint: see /v1/completions, /v1/chat/completions, /v1/models, /health and /metrics")
        })
        .with_state(app)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn models(State(app): State<Arc<App>>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": app.model,
            "object": "model",
            "created": app.started,
            "owned_by": "kiln",
            "max_model_len": app.info.max_seq,
        }],
    }))
}

async fn health(State(app): State<Arc<App>>) -> Response {
    let fatal = app
        .health
        .fatal
        .lock()
        .map(|f| f.clone())
        .unwrap_or_default();
    match (fatal, app.draining.load(Ordering::SeqCst)) {
        (Some(error), _) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "error", "error": error})),
        )
            .into_response(),
        (None, true) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "draining"})),
        )
            .into_response(),
        (None, false) => Json(json!({"status": "ok"})).into_response(),
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], app.metrics.render()).into_response()
}

async fn completions(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(app, Endpoint::Completions, body).await
}

async fn chat(State(app): State<Arc<App>>, body: Result<Bytes, BytesRejection>) -> Response {
    answer(app, Endpoint::Chat, body).await
}

/// A body that cannot be read (too large, say) gets the OpenAI error body too.
async fn answer(
    app: Arc<App>,
    endpoint: Endpoint,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(body) => body,
        Err(rejection) => {
            app.metrics.refused("invalid");
            let error = ApiError {
                status: rejection.status(),
                ..ApiError::invalid(None, rejection.body_text())
            };
            return error.into_response();
        }
    };
    generate(app, endpoint, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Cancels its request when dropped before the request finished: a client that disconnects
/// drops its handler (or its stream), and the engine frees the slot at the next step.
struct CancelOnDrop {
    id: RequestId,
    commands: mpsc::UnboundedSender<Command>,
    finished: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.commands.send(Command::Cancel(self.id));
        }
    }
}

/// Reads, submits and answers one request.
async fn generate(app: Arc<App>, endpoint: Endpoint, body: Bytes) -> Result<Response, ApiError> {
    if app.draining.load(Ordering::SeqCst) {
        app.metrics.refused("shutting_down");
        return Err(shutting_down());
    }
    let number = app.counter.fetch_add(1, Ordering::SeqCst);
    // Tokenizing and rendering a chat template take time in proportion to the body: off the
    // threads that serve the other connections.
    let reader = app.clone();
    let parsed = tokio::task::spawn_blocking(move || {
        let context = Context {
            model: &reader.model,
            tokenizer: reader.tokenizer.as_deref(),
            eos: &reader.eos,
            max_seq: reader.info.max_seq,
            seed: (reader.started)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(number),
        };
        protocol::parse(endpoint, &body, &context)
    });
    let parsed =
        (parsed.await).map_err(|e| ApiError::internal(format!("reading the request: {e}")))?;
    let generation = parsed.inspect_err(|error| {
        app.metrics.refused(error.code.unwrap_or("invalid"));
    })?;
    let (updates, received) = mpsc::unbounded_channel();
    let (reply, answer) = oneshot::channel();
    let submit = Command::Submit {
        request: generation.request.clone(),
        updates,
        reply,
    };
    app.commands.send(submit).map_err(|_| engine_gone(&app))?;
    let id = match answer.await.map_err(|_| engine_gone(&app))? {
        Ok(id) => id,
        Err(Refusal::Invalid(message)) => return Err(ApiError::invalid(None, message)),
        Err(Refusal::QueueFull { waiting }) => {
            return Err(ApiError::unavailable(
                "queue_full",
                1,
                format!("the server is busy: {waiting} requests are waiting already; retry later"),
            ))
        }
        Err(Refusal::ShuttingDown) => return Err(shutting_down()),
    };
    let guard = CancelOnDrop {
        id,
        commands: app.commands.clone(),
        finished: false,
    };
    let answer = Answer {
        id: match endpoint {
            Endpoint::Completions => format!("cmpl-{:x}-{number}", app.started),
            Endpoint::Chat => format!("chatcmpl-{:x}-{number}", app.started),
        },
        created: unix_now(),
        model: app.model.clone(),
        prompt_tokens: generation.request.prompt.len(),
        generation,
    };
    match answer.generation.stream {
        true => Ok(stream(app, answer, received, guard).into_response()),
        false => whole(&app, answer, received, guard).await,
    }
}

fn shutting_down() -> ApiError {
    ApiError::unavailable("shutting_down", 5, "the server is shutting down")
}

/// The engine thread is gone: its error if it failed, else the shutdown that ended it.
fn engine_gone(app: &App) -> ApiError {
    let fatal = app.health.fatal.lock().ok().and_then(|f| f.clone());
    match (fatal, app.draining.load(Ordering::SeqCst)) {
        (Some(error), _) => ApiError::internal(error),
        (None, true) => shutting_down(),
        (None, false) => ApiError::internal("the engine has stopped"),
    }
}

/// How to shape the answer to one request.
struct Answer {
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
    generation: Generation,
}

impl Answer {
    fn usage(&self, completion_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
        })
    }

    /// One choice: `text` as a completion's text or a chat message's content (a chunk's
    /// delta when `chunk`).
    fn choice(&self, text: &str, ids: &[u32], finish: Option<&str>, chunk: bool) -> Value {
        let mut choice = match (self.generation.endpoint, chunk) {
            (Endpoint::Completions, _) => json!({"index": 0, "text": text, "logprobs": null}),
            (Endpoint::Chat, false) => json!({
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": null,
            }),
            (Endpoint::Chat, true) => {
                json!({"index": 0, "delta": {"content": text}, "logprobs": null})
            }
        };
        choice["finish_reason"] = json!(finish);
        if self.generation.return_token_ids {
            choice["token_ids"] = json!(ids);
        }
        choice
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.generation.endpoint, chunk) {
            (Endpoint::Completions, _) => "text_completion",
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
        }
    }

    fn body(&self, choices: Vec<Value>, usage: Option<Value>, chunk: bool) -> Value {
        let mut body = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        match usage {
            Some(usage) => body["usage"] = usage,
            // As OpenAI streams with `include_usage`: every chunk names it, null but the last.
            None if chunk && self.generation.include_usage => body["usage"] = Value::Null,
            None => {}
        }
        body
    }
}

/// The finish reason a client sees; a failed request is answered with an error instead, and
/// so is one cancelled by the shutdown's deadline (a client that left sees nothing).
fn finish_name(outcome: &Outcome) -> Result<&'static str, ApiError> {
    match outcome.finish_reason {
        Some(FinishReason::Error) => Err(ApiError::internal(
            outcome
                .error
                .clone()
                .unwrap_or_else(|| "the request failed".to_string()),
        )),
        Some(FinishReason::Cancelled) => Err(ApiError::unavailable(
            "shutting_down",
            5,
            "the server shut down before the request finished",
        )),
        Some(reason) => Ok(reason.as_str()),
        None => Err(ApiError::internal(
            "the request ended without a finish reason",
        )),
    }
}

/// A non-streamed answer, once the request finished.
async fn whole(
    app: &App,
    answer: Answer,
    mut received: mpsc::UnboundedReceiver<Update>,
    mut guard: CancelOnDrop,
) -> Result<Response, ApiError> {
    loop {
        match received.recv().await {
            Some(Update::Token { .. }) => {}
            Some(Update::Finished { outcome, .. }) => {
                guard.finished = true;
                let finish = finish_name(&outcome)?;
                let text = outcome.text.clone().unwrap_or_default();
                let choice = answer.choice(&text, &outcome.tokens, Some(finish), false);
                let usage = answer.usage(outcome.tokens.len());
                return Ok(Json(answer.body(vec![choice], Some(usage), false)).into_response());
            }
            None => return Err(engine_gone(app)),
        }
    }
}

/// A streamed answer's state: what is sent so far and what waits to be sent.
struct Streaming {
    app: Arc<App>,
    answer: Answer,
    received: mpsc::UnboundedReceiver<Update>,
    guard: CancelOnDrop,
    /// The text so far and how many of its bytes were sent: text that a stop string may
    /// still claim is held back, since a stop string is not returned.
    text: String,
    sent: usize,
    holdback: usize,
    pending: VecDeque<SseEvent>,
    done: bool,
}

fn data(value: &Value) -> SseEvent {
    SseEvent::default().data(value.to_string())
}

impl Streaming {
    /// A chunk of one choice.
    fn chunk(&self, text: &str, ids: &[u32], finish: Option<&str>) -> SseEvent {
        let choice = self.answer.choice(text, ids, finish, true);
        data(&self.answer.body(vec![choice], None, true))
    }

    /// The events of one update.
    fn take(&mut self, update: Option<Update>) {
        match update {
            Some(Update::Token { id, text }) => {
                self.text.push_str(text.as_deref().unwrap_or_default());
                let mut safe = self.text.len().saturating_sub(self.holdback).max(self.sent);
                while !self.text.is_char_boundary(safe) {
                    safe -= 1;
                }
                let delta = self.text[self.sent..safe].to_string();
                self.sent = safe;
                let event = self.chunk(&delta, &[id], None);
                self.pending.push_back(event);
            }
            Some(Update::Finished { token, outcome }) => {
                self.guard.finished = true;
                match finish_name(&outcome) {
                    Ok(finish) => {
                        let returned = outcome.text.clone().unwrap_or_default();
                        let rest = returned.get(self.sent..).unwrap_or_default();
                        let ids: Vec<u32> = token.into_iter().collect();
                        let event = self.chunk(rest, &ids, Some(finish));
                        self.pending.push_back(event);
                        if self.answer.generation.include_usage {
                            let usage = self.answer.usage(outcome.tokens.len());
                            let body = self.answer.body(Vec::new(), Some(usage), true);
                            self.pending.push_back(data(&body));
                        }
                    }
                    Err(error) => self.pending.push_back(data(&error.body())),
                }
                self.pending.push_back(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
            None => {
                let error = engine_gone(&self.app);
                self.pending.push_back(data(&error.body()));
                self.pending.push_back(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
        }
    }
}

/// Server-sent events: a first chunk (a chat's opens the assistant's turn), one chunk per
/// token, the last with the finish reason, usage when asked, then `[DONE]`.
fn stream(
    app: Arc<App>,
    answer: Answer,
    received: mpsc::UnboundedReceiver<Update>,
    guard: CancelOnDrop,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let holdback = (answer.generation.request.stop.stop_strings.iter())
        .map(|s| s.len().saturating_sub(1))
        .max()
        .unwrap_or(0);
    let mut state = Streaming {
        app,
        answer,
        received,
        guard,
        text: String::new(),
        sent: 0,
        holdback,
        pending: VecDeque::new(),
        done: false,
    };
    if state.answer.generation.endpoint == Endpoint::Chat {
        let mut choice = state.answer.choice("", &[], None, true);
        choice["delta"] = json!({"role": "assistant", "content": ""});
        let first = data(&state.answer.body(vec![choice], None, true));
        state.pending.push_back(first);
    }
    let events = stream::unfold(state, |mut state| async move {
        loop {
            if let Some(event) = state.pending.pop_front() {
                return Some((Ok(event), state));
            }
            if state.done {
                return None;
            }
            let update = state.received.recv().await;
            state.take(update);
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
