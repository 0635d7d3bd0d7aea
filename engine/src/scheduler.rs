//! Schedulers: what runs at each step of generation for many requests.
//!
//! A request moves queued → prefilling → decoding → finished (length | stop | cancelled).
//! Every scheduler takes requests at any time ([`Scheduler::submit`]), acts only at step
//! boundaries ([`Scheduler::step`]: cancellations, admissions, one token for each running
//! request) and reports each token as an [`Event`]. A request whose next token cannot be chosen
//! (NaN logits, say) finishes with [`FinishReason::Error`] alone, and so do the requests of a
//! program run that fails (the device, say), with the engine's message; the others go on.
//! Each request carries its own sampler (its
//! seed decides its draws whatever else runs) and stop checker, so the tokens a request gets
//! do not depend on the scheduler — the [`ReferenceScheduler`](reference::ReferenceScheduler)
//! (serial, one request at a time) is the oracle of the
//! [`ContinuousBatchScheduler`](continuous::ContinuousBatchScheduler) and the
//! [`LengthBucketedBatchScheduler`](bucketed::LengthBucketedBatchScheduler).

pub mod bucketed;
pub mod continuous;
pub mod metrics;
pub mod reference;

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::error::Result;
use crate::sampler::Sampler;
use crate::sampling::SamplingParams;
use crate::stop::{FinishReason, StopCause, StopChecker, StopCriteria};
use crate::tokenizer::{TextStream, Tokenizer};

/// One request to generate.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopCriteria,
}

/// A request's handle, in submission order from 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub usize);

/// Where a request is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Queued,
    /// Admitted, waiting for (or in) its prefill.
    Prefilling,
    Decoding,
    Finished(FinishReason),
}

/// What one step did to one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    pub id: RequestId,
    /// The token it generated, if any (a cancellation generates none).
    pub token: Option<u32>,
    /// The text the token completes, when there is a tokenizer (see [`Tokenizer::stream`]).
    pub text: Option<String>,
    /// Set on the request's last event.
    pub finished: Option<FinishReason>,
}

/// A request's record: its tokens, why it finished and its wall-clock latencies.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub tokens: Vec<u32>,
    /// The generated text up to any stop string, when there is a tokenizer.
    pub text: Option<String>,
    pub finish_reason: Option<FinishReason>,
    /// Submission → first token and submission → finish, seconds.
    pub first_token_s: Option<f64>,
    pub total_s: Option<f64>,
    /// For each token, its logits' largest minus second largest value (how far a greedy choice
    /// was from a tie; infinite with a single finite logit) when the token was chosen on the
    /// host, `None` when the device chose it.
    pub margins: Vec<Option<f32>>,
    /// Why the request failed, when it finished with [`FinishReason::Error`].
    pub error: Option<String>,
}

/// The contract every scheduler keeps (see the module doc).
pub trait Scheduler {
    /// Queues `request`, or refuses it (bad prompt, a request that cannot fit) with an error
    /// naming the numbers; a refused request changes nothing.
    fn submit(&mut self, request: Request) -> Result<RequestId>;
    /// Cancels request `id` at the next step boundary; false when it is unknown or finished.
    fn cancel(&mut self, id: RequestId) -> bool;
    /// Runs one step and returns what happened, in request order.
    fn step(&mut self) -> Result<Vec<Event>>;
    /// Whether no request is queued or running.
    fn is_idle(&self) -> bool;
    fn phase(&self, id: RequestId) -> Option<Phase>;
    /// What request `id` got so far.
    fn outcome(&self, id: RequestId) -> Option<Outcome>;
    /// The outcome of finished request `id`, after which the scheduler keeps nothing of it
    /// (a server forgets each request it has answered); `None` while it runs.
    fn forget(&mut self, id: RequestId) -> Option<Outcome>;
}

/// One request's state while it runs: its sampler, stop checker, context and text.
pub(crate) struct Sequence<'t> {
    pub id: RequestId,
    pub request: Request,
    pub phase: Phase,
    /// Asked to be cancelled at the next step boundary.
    pub cancel: bool,
    sampler: Sampler,
    stop: StopChecker,
    context: Vec<u32>,
    tokens: Vec<u32>,
    margins: Vec<Option<f32>>,
    stream: Option<TextStream<'t>>,
    text: Option<String>,
    cause: Option<StopCause>,
    error: Option<String>,
    submitted: Instant,
    first_token: Option<Instant>,
    finished: Option<Instant>,
}

impl<'t> Sequence<'t> {
    /// Refuses invalid sampling parameters, stop criteria and an empty prompt.
    pub fn new(id: RequestId, request: Request, tokenizer: Option<&'t Tokenizer>) -> Result<Self> {
        if request.prompt.is_empty() {
            return Err(crate::Error::Request {
                reason: "the prompt is empty: it needs at least one token".to_string(),
            });
        }
        Ok(Sequence {
            id,
            sampler: Sampler::new(request.sampling.clone())?,
            stop: StopChecker::new(request.stop.clone())?,
            context: request.prompt.clone(),
            tokens: Vec::new(),
            margins: Vec::new(),
            stream: tokenizer.map(|t| t.stream(true)),
            text: tokenizer.map(|_| String::new()),
            cause: None,
            error: None,
            request,
            phase: Phase::Queued,
            cancel: false,
            submitted: Instant::now(),
            first_token: None,
            finished: None,
        })
    }

    /// The position of the next token to decode: the last token generated.
    pub fn position(&self) -> usize {
        self.context.len() - 1
    }

    /// The last token of the context (the one a decode step feeds).
    pub fn last_token(&self) -> u32 {
        self.context[self.context.len() - 1]
    }

    /// Whether the device's greedy token is this request's next token: greedy sampling with
    /// no repetition penalty (the argmax of the logits, ties to the lowest id).
    pub fn greedy_on_device(&self) -> bool {
        let params = self.sampler.params();
        params.is_greedy() && params.repetition_penalty == 1.0
    }

    /// Samples the next token from `logits` and takes it (see [`take`](Self::take)).
    pub fn accept(&mut self, logits: &[f32]) -> Result<Event> {
        let token = self.sampler.sample(logits, &self.context)?;
        self.margins.push(Some(top_two_margin(logits)));
        self.take(token)
    }

    /// Takes the device's greedy `token` (when [`greedy_on_device`](Self::greedy_on_device));
    /// -1 means the logits held a NaN.
    pub fn accept_greedy(&mut self, token: i64) -> Result<Event> {
        let token = u32::try_from(token).map_err(|_| crate::Error::Generate {
            reason: format!(
                "request {}: the logits hold NaN or are all -inf, so no greedy token follows",
                self.id.0
            ),
        })?;
        self.margins.push(None);
        self.take(token)
    }

    /// Appends `token`, checks the stop criteria and moves to decoding or finished; returns
    /// the event.
    fn take(&mut self, token: u32) -> Result<Event> {
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.tokens.push(token);
        self.context.push(token);
        let piece = match self.stream.as_mut() {
            Some(stream) => stream.step(token)?,
            None => None,
        };
        if let (Some(text), Some(piece)) = (self.text.as_mut(), &piece) {
            text.push_str(piece);
        }
        let cause = self.stop.check(token, self.text.as_deref());
        let finished = cause.as_ref().map(StopCause::finish_reason);
        self.cause = cause;
        self.phase = match finished {
            Some(reason) => self.finish(reason),
            None => Phase::Decoding,
        };
        Ok(Event {
            id: self.id,
            token: Some(token),
            text: piece,
            finished,
        })
    }

    /// Ends the request for `reason`; returns its final phase.
    pub fn finish(&mut self, reason: FinishReason) -> Phase {
        self.sampler.release();
        self.finished = Some(Instant::now());
        self.phase = Phase::Finished(reason);
        self.phase
    }

    /// Ends the request for `error`, its own failure (a choice that cannot be made from its
    /// logits, a token its text stream cannot take); returns the event.
    pub fn failed(&mut self, error: &crate::Error) -> Event {
        self.error = Some(error.to_string());
        self.finish(FinishReason::Error);
        Event {
            id: self.id,
            token: None,
            text: None,
            finished: Some(FinishReason::Error),
        }
    }

    /// The cancellation event, after [`finish`](Self::finish).
    pub fn cancelled(&mut self) -> Event {
        self.finish(FinishReason::Cancelled);
        Event {
            id: self.id,
            token: None,
            text: None,
            finished: Some(FinishReason::Cancelled),
        }
    }

    pub fn outcome(&self) -> Outcome {
        let seconds = |at: Option<Instant>| at.map(|at| (at - self.submitted).as_secs_f64());
        let text = match (&self.text, &self.cause) {
            (Some(text), Some(cause)) => Some(cause.returned_text(text).to_string()),
            (text, None) => text.clone(),
            (None, Some(_)) => None,
        };
        Outcome {
            tokens: self.tokens.clone(),
            text,
            finish_reason: match self.phase {
                Phase::Finished(reason) => Some(reason),
                _ => None,
            },
            first_token_s: seconds(self.first_token),
            total_s: seconds(self.finished),
            margins: self.margins.clone(),
            error: self.error.clone(),
        }
    }

    /// Cache positions the request may need: its prompt, then one per generated token but
    /// the last (which is never fed back).
    pub fn positions_needed(&self) -> usize {
        (self.request.prompt.len())
            .saturating_add(self.request.stop.max_new_tokens.saturating_sub(1))
    }
}

/// The requests a scheduler holds: every one by id until it is forgotten, the queue of those
/// not admitted yet, and the cancellations asked since the last step.
pub(crate) struct Book<'t> {
    tokenizer: Option<&'t Tokenizer>,
    sequences: BTreeMap<RequestId, Sequence<'t>>,
    next: usize,
    pub queue: VecDeque<RequestId>,
    asked: Vec<RequestId>,
}

impl<'t> Book<'t> {
    pub fn new(tokenizer: Option<&'t Tokenizer>) -> Self {
        Book {
            tokenizer,
            sequences: BTreeMap::new(),
            next: 0,
            queue: VecDeque::new(),
            asked: Vec::new(),
        }
    }

    /// The next request's state, refused as [`Sequence::new`] refuses; not queued yet.
    pub fn draft(&self, request: Request) -> Result<Sequence<'t>> {
        Sequence::new(RequestId(self.next), request, self.tokenizer)
    }

    /// Queues a [`draft`](Self::draft); returns its id.
    pub fn enqueue(&mut self, sequence: Sequence<'t>) -> RequestId {
        let id = sequence.id;
        self.next = id.0 + 1;
        self.sequences.insert(id, sequence);
        self.queue.push_back(id);
        id
    }

    /// Asks request `id` to be cancelled at the next step boundary; false when it is unknown,
    /// finished or forgotten.
    pub fn cancel(&mut self, id: RequestId) -> bool {
        match self.sequences.get_mut(&id) {
            Some(sequence) if !matches!(sequence.phase, Phase::Finished(_)) => {
                if !std::mem::replace(&mut sequence.cancel, true) {
                    self.asked.push(id);
                }
                true
            }
            _ => false,
        }
    }

    /// Ends every request asked to be cancelled (dropping it from the queue) and returns their
    /// events, in request order; `release` frees what a running one holds.
    pub fn cancellations(&mut self, mut release: impl FnMut(RequestId)) -> Vec<Event> {
        let mut asked = std::mem::take(&mut self.asked);
        asked.sort();
        let mut events = Vec::new();
        for id in asked {
            let Some(sequence) = self.sequences.get_mut(&id) else {
                continue;
            };
            if matches!(sequence.phase, Phase::Finished(_)) {
                continue;
            }
            self.queue.retain(|&queued| queued != id);
            release(id);
            events.push(sequence.cancelled());
        }
        events
    }

    pub fn phase(&self, id: RequestId) -> Option<Phase> {
        self.sequences.get(&id).map(|s| s.phase)
    }

    pub fn outcome(&self, id: RequestId) -> Option<Outcome> {
        self.sequences.get(&id).map(Sequence::outcome)
    }

    /// The outcome of finished request `id`, which is forgotten; `None` (and nothing
    /// forgotten) while it runs or when it is unknown.
    pub fn forget(&mut self, id: RequestId) -> Option<Outcome> {
        match self.sequences.get(&id)?.phase {
            Phase::Finished(_) => self.sequences.remove(&id).map(|s| s.outcome()),
            _ => None,
        }
    }
}

impl<'t> std::ops::Index<RequestId> for Book<'t> {
    type Output = Sequence<'t>;
    fn index(&self, id: RequestId) -> &Sequence<'t> {
        &self.sequences[&id]
    }
}

impl std::ops::IndexMut<RequestId> for Book<'_> {
    fn index_mut(&mut self, id: RequestId) -> &mut Self::Output {
        self.sequences
            .get_mut(&id)
            .expect("a request the book holds")
    }
}

/// The largest value of `logits` minus the second largest (infinite when the second is -inf,
/// 0 for fewer than two values).
fn top_two_margin(logits: &[f32]) -> f32 {
    let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &value in logits {
        if value > first {
            (first, second) = (value, first);
        } else if value > second {
            second = value;
        }
    }
    match (logits.len(), second == f32::NEG_INFINITY) {
        (0 | 1, _) => 0.0,
        (_, true) => f32::INFINITY,
        _ => first - second,
    }
}
