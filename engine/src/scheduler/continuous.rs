//! Continuous batching over one [`Engine`]'s KV pool: requests join and leave the running batch
//! at step boundaries.
//!
//! The scheduler owns the request → slot map. A step:
//! 1. ends every request asked to be cancelled (a running one frees its slot);
//! 2. admits queued requests, in submission order, into the lowest free slots;
//! 3. prefills the admitted prompts — equal lengths as one batch, different lengths as separate
//!    groups — and samples each one's first token;
//! 4. decodes one token for every request that was running before the step, each on its own
//!    slot id, and samples it.
//!
//! A request that finishes (length, stop or error) frees its slot at once; the slot is reused
//! by the next admission without being cleared (the engine never reads a slot past its sequence's
//! position). A request that could never fit a slot is refused at submission, naming both
//! numbers. When a program run fails (the device, say), the requests of that run finish with
//! [`FinishReason::Error`](crate::stop::FinishReason::Error) and the engine's message; the other
//! groups of the step and later steps go on.

use std::collections::BTreeMap;

use super::{Book, Event, Outcome, Phase, Request, RequestId, Scheduler};
use crate::engine::{DecodeRow, Engine, Fetch, PrefillRow, Step};
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// The continuous batching scheduler (see the module doc).
pub struct ContinuousBatchScheduler<'t> {
    engine: Engine,
    book: Book<'t>,
    /// Which request holds each slot.
    slots: Vec<Option<RequestId>>,
}

impl<'t> ContinuousBatchScheduler<'t> {
    /// A scheduler over `engine`'s pool; with a `tokenizer`, events carry text and stop
    /// strings apply.
    pub fn new(engine: Engine, tokenizer: Option<&'t Tokenizer>) -> Self {
        let slots = vec![None; engine.options().slots];
        ContinuousBatchScheduler {
            engine,
            book: Book::new(tokenizer),
            slots,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Requests submitted and not admitted yet.
    pub fn queued(&self) -> usize {
        self.book.queue.len()
    }

    /// The requests holding slots now, by slot.
    pub fn running(&self) -> Vec<(usize, RequestId)> {
        (self.slots.iter().enumerate())
            .filter_map(|(slot, id)| id.map(|id| (slot, id)))
            .collect()
    }

    fn slot_of(&self, id: RequestId) -> Option<usize> {
        self.slots.iter().position(|&held| held == Some(id))
    }

    /// Frees request `id`'s slot, if it holds one.
    fn release(&mut self, id: RequestId) {
        free_slot(&mut self.slots, id);
    }

    /// Step 1: cancellations.
    fn cancellations(&mut self, events: &mut Vec<Event>) {
        let slots = &mut self.slots;
        events.extend(self.book.cancellations(|id| free_slot(slots, id)));
    }

    /// Step 2: admissions into the lowest free slots.
    fn admit(&mut self) -> Vec<RequestId> {
        let mut admitted = Vec::new();
        while let Some(slot) = self.slots.iter().position(Option::is_none) {
            let Some(id) = self.book.queue.pop_front() else {
                break;
            };
            self.slots[slot] = Some(id);
            self.book[id].phase = Phase::Prefilling;
            admitted.push(id);
        }
        admitted
    }

    /// Step 3: the admitted prompts' prefills, grouped by length, and their first tokens.
    fn prefill(&mut self, admitted: &[RequestId], events: &mut Vec<Event>) -> Result<()> {
        let mut groups: BTreeMap<usize, Vec<RequestId>> = BTreeMap::new();
        for &id in admitted {
            let length = self.book[id].request.prompt.len();
            groups.entry(length).or_default().push(id);
        }
        for ids in groups.values() {
            let slots: Vec<usize> = ids
                .iter()
                .map(|&id| self.slot_of(id))
                .collect::<Option<_>>()
                .ok_or_else(|| lost("an admitted request holds no slot"))?;
            let rows: Vec<PrefillRow<'_>> = (ids.iter().zip(&slots))
                .map(|(&id, &slot)| PrefillRow {
                    slot,
                    prompt: &self.book[id].request.prompt,
                })
                .collect();
            let fetch = self.fetch(ids);
            match self.engine.prefill(&rows, fetch) {
                Ok(step) => (ids.iter().enumerate())
                    .for_each(|(row, &id)| self.take(id, (&step, row), events)),
                Err(error) => self.fail(ids, &error, events),
            }
        }
        Ok(())
    }

    /// Step 4: one decode step of the requests running before this step.
    fn decode(&mut self, admitted: &[RequestId], events: &mut Vec<Event>) {
        let running: Vec<(usize, RequestId)> = (self.running().into_iter())
            .filter(|(_, id)| !admitted.contains(id))
            .filter(|&(_, id)| self.book[id].phase == Phase::Decoding)
            .collect();
        if running.is_empty() {
            return;
        }
        let rows: Vec<DecodeRow> = (running.iter())
            .map(|&(slot, id)| {
                let sequence = &self.book[id];
                DecodeRow {
                    slot,
                    token: sequence.last_token(),
                    position: sequence.position(),
                }
            })
            .collect();
        let ids: Vec<RequestId> = running.iter().map(|&(_, id)| id).collect();
        match self.engine.decode(&rows, self.fetch(&ids)) {
            Ok(step) => {
                (ids.iter().enumerate()).for_each(|(row, &id)| self.take(id, (&step, row), events))
            }
            Err(error) => self.fail(&ids, &error, events),
        }
    }

    /// The logits only when some of `ids` samples on the host.
    fn fetch(&self, ids: &[RequestId]) -> Fetch {
        match ids.iter().all(|&id| self.book[id].greedy_on_device()) {
            true => Fetch::Tokens,
            false => Fetch::Logits,
        }
    }

    /// Request `id`'s next token from row `row` of `step`; a finished request frees its slot.
    fn take(&mut self, id: RequestId, (step, row): (&Step, usize), events: &mut Vec<Event>) {
        let sequence = &mut self.book[id];
        let taken = match step.logits(row) {
            Some(logits) => sequence.accept(logits),
            None => sequence.accept_greedy(step.tokens[row]),
        };
        let event = taken.unwrap_or_else(|error| sequence.failed(&error));
        if event.finished.is_some() {
            self.release(id);
        }
        events.push(event);
    }

    /// Ends requests `ids`, whose program run failed with `error`, and frees their slots.
    fn fail(&mut self, ids: &[RequestId], error: &Error, events: &mut Vec<Event>) {
        let error = Error::Generate {
            reason: format!("the engine's step failed: {error}"),
        };
        for &id in ids {
            events.push(self.book[id].failed(&error));
            self.release(id);
        }
    }
}

/// Frees the slot request `id` holds, if any.
fn free_slot(slots: &mut [Option<RequestId>], id: RequestId) {
    if let Some(slot) = slots.iter().position(|&held| held == Some(id)) {
        slots[slot] = None;
    }
}

fn lost(reason: &str) -> Error {
    Error::Generate {
        reason: format!("continuous scheduler: {reason}"),
    }
}

impl Scheduler for ContinuousBatchScheduler<'_> {
    fn submit(&mut self, request: Request) -> Result<RequestId> {
        let sequence = self.book.draft(request)?;
        let options = self.engine.options();
        let prompt = &sequence.request.prompt;
        let vocab = self.engine.config().vocab_size;
        let refuse = |reason: String| Err(Error::Request { reason });
        if let Some(at) = prompt.iter().position(|&t| t as usize >= vocab) {
            let token = prompt[at];
            return refuse(format!(
                "prompt token {at} is {token}, outside the vocabulary of {vocab}"
            ));
        }
        if prompt.len() > options.max_prompt() {
            return refuse(format!(
                "a prompt of {} tokens is longer than the {} the engine's prefill takes",
                prompt.len(),
                options.max_prompt()
            ));
        }
        let needed = sequence.positions_needed();
        if needed > options.max_seq {
            return refuse(format!(
                "{} prompt tokens and up to {} new ones need {needed} positions, more than the \
                 {} of a slot (max_sequence_length)",
                prompt.len(),
                sequence.request.stop.max_new_tokens,
                options.max_seq
            ));
        }
        Ok(self.book.enqueue(sequence))
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        self.book.cancel(id)
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        self.cancellations(&mut events);
        let admitted = self.admit();
        self.prefill(&admitted, &mut events)?;
        self.decode(&admitted, &mut events);
        events.sort_by_key(|event| event.id);
        Ok(events)
    }

    fn is_idle(&self) -> bool {
        self.book.queue.is_empty() && self.slots.iter().all(Option::is_none)
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
