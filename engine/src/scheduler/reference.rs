//! The serial reference scheduler: one request at a time on the [`ReferenceGenerator`]'s B=1
//! programs, each request with its own cache (the generator's, reused — released when the
//! request completes), sampler and lifecycle. The oracle of the batching schedulers.

use super::{Book, Event, Outcome, Phase, Request, RequestId, Scheduler};
use crate::error::Result;
use crate::generate::ReferenceGenerator;
use crate::tokenizer::Tokenizer;

/// The serial scheduler (see the module doc): each step prefills the next queued request or
/// decodes one token of the running one.
pub struct ReferenceScheduler<'t> {
    generator: ReferenceGenerator,
    book: Book<'t>,
    running: Option<RequestId>,
}

impl<'t> ReferenceScheduler<'t> {
    pub fn new(generator: ReferenceGenerator, tokenizer: Option<&'t Tokenizer>) -> Self {
        ReferenceScheduler {
            generator,
            book: Book::new(tokenizer),
            running: None,
        }
    }

    /// Samples request `id`'s next token from `logits`, the result of its program run (a
    /// request whose run failed or whose token cannot be chosen finishes alone); a finished
    /// request releases the cache.
    fn take(&mut self, id: RequestId, logits: Result<Vec<f32>>) -> Event {
        let sequence = &mut self.book[id];
        let logits = logits.map_err(|error| crate::Error::Generate {
            reason: format!("the engine's step failed: {error}"),
        });
        let taken = logits.and_then(|logits| sequence.accept(&logits));
        let event = taken.unwrap_or_else(|error| sequence.failed(&error));
        if event.finished.is_some() {
            self.running = None;
        }
        event
    }
}

impl Scheduler for ReferenceScheduler<'_> {
    fn submit(&mut self, request: Request) -> Result<RequestId> {
        let sequence = self.book.draft(request)?;
        let request = &sequence.request;
        self.generator
            .check(&request.prompt, request.stop.max_new_tokens)?;
        Ok(self.book.enqueue(sequence))
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        self.book.cancel(id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        let running = &mut self.running;
        let mut events = self.book.cancellations(|id| {
            if *running == Some(id) {
                *running = None;
            }
        });
        match self.running {
            Some(id) => {
                let sequence = &self.book[id];
                let (token, position) = (sequence.last_token(), sequence.position());
                let logits = self.generator.decode_token(token, position);
                events.push(self.take(id, logits));
            }
            None => {
                if let Some(id) = self.book.queue.pop_front() {
                    self.running = Some(id);
                    self.book[id].phase = Phase::Prefilling;
                    let prompt = self.book[id].request.prompt.clone();
                    let logits = self.generator.prefill_prompt(&prompt);
                    events.push(self.take(id, logits));
                }
            }
        }
        events.sort_by_key(|event| event.id);
        Ok(events)
    }

    fn is_idle(&self) -> bool {
        self.book.queue.is_empty() && self.running.is_none()
    }

    fn phase(&self, id: RequestId) -> Option<Phase> {
        self.book.phase(id)
    }

    fn outcome(&self, id: RequestId) -> Option<Outcome> {
        self.book.outcome(id)
    }

    fn forget(&mut self, id: RequestId) -> Option<Outcome> {
        self.book.forget(id)
    }
}
