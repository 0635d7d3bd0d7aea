//! Tensor-parallel serving: every rank of the group runs the same continuous scheduler over its
//! shard of the engine, and the ranks' all-reduces need every rank to step alike. Rank 0 (the
//! leader) serves HTTP and journals each call that changes its scheduler — a submission, a
//! cancellation, a forgotten outcome — and before each step broadcasts the journal and the
//! step over the group's communicator; the other ranks (followers, [`follow`]) make the same
//! calls in the same order, so their schedulers hold the same requests in the same slots and
//! their engines run the same programs. Every rank computes the same logits bit for bit, so
//! their sampling agrees; after each step the ranks check that it did
//! ([`kiln_engine::engine::agree`]: a rank whose
//! tokens differ would go on to run other programs, and its collectives would never meet the
//! others'). When the leader stops it broadcasts [`Call::Stop`].

use std::sync::Arc;

use kiln_engine::engine::agree;
use kiln_engine::scheduler::continuous::ContinuousBatchScheduler;
use kiln_engine::scheduler::{Event, Request, RequestId, Scheduler};
use kiln_runtime::collective::{Communicator, MAX_BROADCAST};
use serde::{Deserialize, Serialize};

/// One call on the scheduler, as the leader made it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Call {
    Submit(Request),
    Cancel(usize),
    Forget(usize),
    Step,
    Stop,
}

/// The leader's side: the calls since the last broadcast.
pub struct Leader {
    communicator: Arc<dyn Communicator>,
    journal: Vec<Call>,
    /// The most bytes of one message: [`MAX_BROADCAST`].
    limit: usize,
}

impl Leader {
    pub fn new(communicator: Arc<dyn Communicator>) -> Self {
        Leader {
            communicator,
            journal: Vec::new(),
            limit: MAX_BROADCAST,
        }
    }

    pub fn record(&mut self, call: Call) {
        self.journal.push(call);
    }

    /// Broadcasts the journal ending with `last` (a step, or the stop), in as many messages
    /// as [`MAX_BROADCAST`] asks (a follower makes each message's calls in turn).
    pub fn publish(&mut self, last: Call) -> kiln_engine::Result<()> {
        self.journal.push(last);
        let encoded = (self.journal.iter())
            .map(|call| serde_json::to_vec(call).map_err(|e| generate(e.to_string())))
            .collect::<kiln_engine::Result<Vec<_>>>()?;
        // `[a,b,...]`: the calls, a message at a time.
        let mut message = Vec::new();
        for call in encoded {
            if call.len() + 2 > self.limit {
                return Err(generate(format!(
                    "a call of {} bytes to broadcast",
                    call.len()
                )));
            }
            if !message.is_empty() && message.len() + call.len() + 2 > self.limit {
                message.push(b']');
                self.communicator.broadcast(&message)?;
                message.clear();
            }
            message.push(if message.is_empty() { b'[' } else { b',' });
            message.extend_from_slice(&call);
        }
        message.push(b']');
        self.communicator.broadcast(&message)?;
        self.journal.clear();
        Ok(())
    }

    pub fn agree(&self, events: &[Event]) -> kiln_engine::Result<()> {
        agree(&*self.communicator, events)
    }
}

/// Submits `request` (journaled for the followers).
pub fn submit(
    scheduler: &mut ContinuousBatchScheduler<'_>,
    leader: &mut Option<Leader>,
    request: Request,
) -> kiln_engine::Result<RequestId> {
    if let Some(leader) = leader {
        leader.record(Call::Submit(request.clone()));
    }
    scheduler.submit(request)
}

/// Cancels `id` (journaled); whether it was running or queued.
pub fn cancel(
    scheduler: &mut ContinuousBatchScheduler<'_>,
    leader: &mut Option<Leader>,
    id: RequestId,
) -> bool {
    if let Some(leader) = leader {
        leader.record(Call::Cancel(id.0));
    }
    scheduler.cancel(id)
}

/// A follower: makes the leader's calls until it stops.
pub fn follow(
    scheduler: &mut ContinuousBatchScheduler<'_>,
    communicator: &dyn Communicator,
) -> kiln_engine::Result<()> {
    loop {
        let message = communicator.broadcast(&[])?;
        let calls: Vec<Call> =
            serde_json::from_slice(&message).map_err(|e| generate(format!("from rank 0: {e}")))?;
        for call in calls {
            match call {
                // A submission the leader's scheduler refused is refused here alike.
                Call::Submit(request) => drop(scheduler.submit(request)),
                Call::Cancel(id) => drop(scheduler.cancel(RequestId(id))),
                Call::Forget(id) => drop(scheduler.forget(RequestId(id))),
                Call::Step => {
                    // The check pairs with the leader's even when this step failed.
                    let stepped = scheduler.step();
                    agree(communicator, stepped.as_deref().unwrap_or_default())?;
                    stepped?;
                }
                Call::Stop => return Ok(()),
            }
        }
    }
}

fn generate(reason: String) -> kiln_engine::Error {
    kiln_engine::Error::Generate {
        reason: format!("tensor-parallel serving: {reason}"),
    }
}

#[cfg(test)]
#[path = "lockstep_tests.rs"]
mod tests;
