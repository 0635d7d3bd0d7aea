//! Tensor-parallel serving: every rank of the group runs the same continuous scheduler over its
//! shard of the engine, and the ranks' all-reduces need every rank to step alike. Rank 0 (the
//! leader) serves HTTP and journals each call that changes its scheduler — a submission, a
//! cancellation, a forgotten outcome — and before each step broadcasts the journal and the
//! step over the group's communicator; the other ranks (followers, [`follow`]) make the same
//! calls in the same order, so their schedulers hold the same requests in the same slots and
//! their engines run the same programs. Every rank computes the same logits bit for bit, so
//! their sampling agrees. When the leader stops it broadcasts [`Call::Stop`].

use std::sync::Arc;

use kiln_engine::scheduler::continuous::ContinuousBatchScheduler;
use kiln_engine::scheduler::{Request, RequestId, Scheduler};
use kiln_runtime::collective::Communicator;
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
}

impl Leader {
    pub fn new(communicator: Arc<dyn Communicator>) -> Self {
        Leader {
            communicator,
            journal: Vec::new(),
        }
    }

    pub fn record(&mut self, call: Call) {
        self.journal.push(call);
    }

    /// Broadcasts the journal ending with `last` (a step, or the stop).
    pub fn publish(&mut self, last: Call) -> kiln_engine::Result<()> {
        self.journal.push(last);
        let message = serde_json::to_vec(&self.journal).map_err(|e| generate(e.to_string()))?;
        self.journal.clear();
        self.communicator.broadcast(&message)?;
        Ok(())
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
                Call::Step => drop(scheduler.step()?),
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
