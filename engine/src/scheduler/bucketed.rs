//! Length-bucketed batching: several fixed-capacity continuous schedulers over one compiled
//! model ([`Engine::group`]: the weights and the arena once), each with its own KV pool of
//! slots of its own length. Short requests do not take the long slots, so a pool of long
//! slots stays free for the requests that need them.
//!
//! Routing is decided once, at submission, and deterministically: a request goes to the
//! smallest bucket whose slots hold it (its prompt fits the bucket's prefill and its prompt
//! and new tokens fit a slot). With [`spill`](LengthBucketedBatchScheduler::new), a request
//! whose bucket has no free capacity (every slot taken or promised to a queued request) goes to
//! the first larger bucket that has some. A submitted request never migrates, and no request
//! lands in a bucket too small for it: one that fits no bucket is refused.

use super::continuous::ContinuousBatchScheduler;
use super::{Event, Outcome, Phase, Request, RequestId, Scheduler};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::tokenizer::Tokenizer;

/// The length-bucketed scheduler (see the module doc).
pub struct LengthBucketedBatchScheduler<'t> {
    /// Buckets by ascending slot length.
    buckets: Vec<ContinuousBatchScheduler<'t>>,
    /// Each request's bucket and its id there, by global id.
    routes: Vec<(usize, RequestId)>,
    /// Each bucket's requests' global ids, by their id there.
    globals: Vec<Vec<RequestId>>,
    spill: bool,
}

impl<'t> LengthBucketedBatchScheduler<'t> {
    /// Buckets over `engines` (one [`Engine::group`]), ordered by their slots' length; with
    /// `spill`, the opt-in rule of the module doc.
    pub fn new(mut engines: Vec<Engine>, tokenizer: Option<&'t Tokenizer>, spill: bool) -> Self {
        engines.sort_by_key(|engine| engine.options().max_seq);
        let buckets: Vec<ContinuousBatchScheduler<'t>> = (engines.into_iter())
            .map(|engine| ContinuousBatchScheduler::new(engine, tokenizer))
            .collect();
        let globals = buckets.iter().map(|_| Vec::new()).collect();
        LengthBucketedBatchScheduler {
            buckets,
            routes: Vec::new(),
            globals,
            spill,
        }
    }

    /// The bucket request `id` runs in.
    pub fn bucket_of(&self, id: RequestId) -> Option<usize> {
        self.routes.get(id.0).map(|&(bucket, _)| bucket)
    }

    /// Each bucket's slots and slot length, in bucket order.
    pub fn buckets(&self) -> Vec<(usize, usize)> {
        (self.buckets.iter())
            .map(|b| (b.engine().options().slots, b.engine().options().max_seq))
            .collect()
    }

    /// The buckets `request` fits, smallest first.
    fn fitting(&self, request: &Request) -> Vec<usize> {
        let needed =
            (request.prompt.len()).saturating_add(request.stop.max_new_tokens.saturating_sub(1));
        (0..self.buckets.len())
            .filter(|&b| {
                let options = self.buckets[b].engine().options();
                needed <= options.max_seq && request.prompt.len() <= options.max_prompt()
            })
            .collect()
    }

    /// Slots of bucket `b` neither running nor promised to a queued request.
    fn free(&self, b: usize) -> usize {
        let bucket = &self.buckets[b];
        let waiting = bucket.queued();
        let taken = bucket.running().len() + waiting;
        bucket.engine().options().slots.saturating_sub(taken)
    }
}

impl Scheduler for LengthBucketedBatchScheduler<'_> {
    fn submit(&mut self, request: Request) -> Result<RequestId> {
        let fitting = self.fitting(&request);
        let Some(&smallest) = fitting.first() else {
            let largest = self.buckets().last().copied().unwrap_or((0, 0));
            return Err(Error::Request {
                reason: format!(
                    "{} prompt tokens and up to {} new ones fit no bucket (the longest slots \
                     hold {} positions)",
                    request.prompt.len(),
                    request.stop.max_new_tokens,
                    largest.1
                ),
            });
        };
        let bucket = match self.spill && self.free(smallest) == 0 {
            true => (fitting.iter().copied())
                .find(|&b| self.free(b) > 0)
                .unwrap_or(smallest),
            false => smallest,
        };
        let local = self.buckets[bucket].submit(request)?;
        let global = RequestId(self.routes.len());
        self.routes.push((bucket, local));
        self.globals[bucket].push(global);
        Ok(global)
    }

    fn cancel(&mut self, id: RequestId) -> bool {
        match self.routes.get(id.0) {
            Some(&(bucket, local)) => self.buckets[bucket].cancel(local),
            None => false,
        }
    }

    fn step(&mut self) -> Result<Vec<Event>> {
        let mut events = Vec::new();
        for (bucket, scheduler) in self.buckets.iter_mut().enumerate() {
            for mut event in scheduler.step()? {
                event.id =
                    *(self.globals[bucket].get(event.id.0)).ok_or_else(|| Error::Generate {
                        reason: format!("bucket {bucket} reported an unknown request"),
                    })?;
                events.push(event);
            }
        }
        events.sort_by_key(|event| event.id);
        Ok(events)
    }

    fn is_idle(&self) -> bool {
        self.buckets.iter().all(Scheduler::is_idle)
    }

    fn phase(&self, id: RequestId) -> Option<Phase> {
        let &(bucket, local) = self.routes.get(id.0)?;
        self.buckets[bucket].phase(local)
    }

    fn outcome(&self, id: RequestId) -> Option<Outcome> {
        let &(bucket, local) = self.routes.get(id.0)?;
        self.buckets[bucket].outcome(local)
    }

    /// Forgets the request in its bucket (the route, two ids, stays).
    fn forget(&mut self, id: RequestId) -> Option<Outcome> {
        let &(bucket, local) = self.routes.get(id.0)?;
        self.buckets[bucket].forget(local)
    }
}

#[cfg(test)]
#[path = "bucketed_tests.rs"]
mod tests;
