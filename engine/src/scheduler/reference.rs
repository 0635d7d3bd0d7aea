//! The serial reference scheduler: one request at a time on the [`ReferenceGenerator`]'s B=1
//! programs, each request with its own cache (the generator's, reused — released when the
//! request completes), sampler and lifecycle. The oracle of the batching schedulers.

use std::collections::VecDeque;

use super::{
    ask_cancel, cancelling, Event, Outcome, Phase, Request, RequestId, Scheduler, Sequence,
};
use crate::error::Result;
use crate::generate::ReferenceGenerator;
use crate::tokenizer::Tokenizer;

/// The serial scheduler (see the module doc): each step prefills the next queued request or
/// decodes one token of the running one.
pub struct ReferenceScheduler<'t> {
    generator: ReferenceGenerator,
    tokenizer: Option<&'t Tokenizer>,
    sequences: Vec<Sequence<'t>>,
    queue: VecDeque<RequestId>,
    running: Option<RequestId>,
}

impl<'t> ReferenceScheduler<'t> {
    pub fn new(generator: ReferenceGenerator, tokenizer: Option<&'t Tokenizer>) -> Self {
        ReferenceScheduler {
            generator,
            tokenizer,
            sequences: Vec::new(),
            queue: VecDeque::new(),
            running: None,
        }
    }

    /// Samples request `id`'s next token from `logits` (a request whose token cannot be chosen
    /// finishes alone); a finished request releases the cache.
    fn take(&mut self, id: RequestId, logits: &[f32]) -> Event {
        let sequence = &mut self.sequences[id.0];
        let event = (sequence.accept(logits)).unwrap_or_else(|error| sequence.failed(&error));
        if event.finished.is_some() {
            self.running = None;
        }
        event
    }
}

impl Scheduler for ReferenceScheduler<'_> {
    fn submit(&mut self, request: Request) -> Result<RequestId> {
        let id = RequestId(self.sequences.len());
        let sequence = Sequence::new(id, request, self.tokenizer)?;
        let request = &sequence.request;
        self.generator
            .check(&request.prompt, request.stop.max_new_tokens)?;
        self.sequences.push(sequence);
        self.queue.push_back(id);
        Ok(id)
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        ask_cancel(&mut self.sequences, id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        for id in cancelling(&self.sequences) {
            self.queue.retain(|&queued| queued != id);
            if self.running == Some(id) {
                self.running = None;
            }
            events.push(self.sequences[id.0].cancelled());
        }
        match self.running {
            Some(id) => {
                let sequence = &self.sequences[id.0];
                let (token, position) = (sequence.last_token(), sequence.position());
                let logits = self.generator.decode_token(token, position)?;
                events.push(self.take(id, &logits));
            }
            None => {
                if let Some(id) = self.queue.pop_front() {
                    self.running = Some(id);
                    self.sequences[id.0].phase = Phase::Prefilling;
                    let prompt = self.sequences[id.0].request.prompt.clone();
                    let logits = self.generator.prefill_prompt(&prompt)?;
                    events.push(self.take(id, &logits));
                }
            }
        }
        events.sort_by_key(|event| event.id);
        Ok(events)
    }

    fn is_idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_none()
    }

    fn phase(&self, id: RequestId) -> Option<Phase> {
        self.sequences.get(id.0).map(|s| s.phase)
    }

    fn outcome(&self, id: RequestId) -> Option<Outcome> {
        self.sequences.get(id.0).map(Sequence::outcome)
    }
}
