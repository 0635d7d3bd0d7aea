//! The engine thread: it owns the compiled engine and its continuous scheduler, takes
//! submissions and cancellations between steps, steps while any request is queued or running,
//! and sends each request's tokens to the HTTP task that waits for them. The HTTP side never
//! blocks it: commands and updates go through unbounded channels, and a request whose client
//! is gone (its update channel closed) is cancelled at the next step boundary.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kiln_engine::engine::Engine;
use kiln_engine::scheduler::continuous::ContinuousBatchScheduler;
use kiln_engine::scheduler::{Event, Outcome, Request, RequestId, Scheduler};
use kiln_engine::tokenizer::Tokenizer;
use tokio::sync::{mpsc, oneshot};

use crate::lockstep::{self, Call, Leader};
use crate::metrics::Metrics;

/// Builds the engine on the engine thread (an engine's programs stay on the thread that made
/// them).
pub type EngineBuilder = Box<dyn FnOnce() -> anyhow::Result<Engine> + Send>;

/// What the HTTP side asks of the engine thread.
pub enum Command {
    Submit {
        request: Request,
        updates: mpsc::UnboundedSender<Update>,
        reply: oneshot::Sender<Result<RequestId, Refusal>>,
    },
    Cancel(RequestId),
    /// Admit nothing more; cancel whatever still runs at `deadline`; stop when idle.
    Drain {
        deadline: Instant,
    },
}

/// What one request gets, in order: tokens, then its end.
#[derive(Debug)]
pub enum Update {
    Token {
        id: u32,
        text: Option<String>,
    },
    /// The last event: its token, if it generated one, and the request's outcome.
    Finished {
        token: Option<u32>,
        outcome: Outcome,
    },
}

/// Why a submission was not queued.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The request is wrong for this engine (the scheduler's message names the numbers).
    Invalid(String),
    QueueFull {
        waiting: usize,
    },
    ShuttingDown,
}

/// The engine's shape, reported once it is built.
#[derive(Debug, Clone)]
pub struct EngineInfo {
    pub slots: usize,
    pub max_seq: usize,
    pub programs: usize,
    pub arena_bytes: u64,
    pub pool_bytes: u64,
}

/// Set when the engine thread stops on an error of its own: every request fails after it.
#[derive(Default)]
pub struct Health {
    pub fatal: Mutex<Option<String>>,
}

/// Starts the engine thread and waits until its engine is built.
pub fn spawn(
    build: EngineBuilder,
    tokenizer: Option<Arc<Tokenizer>>,
    max_waiting: usize,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    group: Option<Arc<dyn kiln_runtime::collective::Communicator>>,
) -> anyhow::Result<(
    mpsc::UnboundedSender<Command>,
    EngineInfo,
    std::thread::JoinHandle<()>,
)> {
    let (commands, inbox) = mpsc::unbounded_channel();
    let (ready, built) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("engine".into())
        .spawn(move || {
            let engine = match build() {
                Ok(engine) => engine,
                Err(error) => {
                    let _ = ready.send(Err(error));
                    return;
                }
            };
            let options = engine.options();
            let memory = engine.memory();
            let info = EngineInfo {
                slots: options.slots,
                max_seq: options.max_seq,
                programs: memory.programs,
                arena_bytes: memory.group.arena_bytes,
                pool_bytes: memory.pool_bytes,
            };
            let _ = ready.send(Ok(info.clone()));
            // A panic on this thread still marks the engine as stopped (for /health).
            let _guard = FatalOnPanic(health.clone());
            let worker = Worker {
                scheduler: ContinuousBatchScheduler::new(engine, tokenizer.as_deref()),
                clients: HashMap::new(),
                max_waiting,
                slots: info.slots,
                metrics,
                draining: None,
                leader: group.map(Leader::new),
            };
            if let Err(error) = worker.run(inbox) {
                *health.fatal.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(format!("the engine stopped: {error}"));
            }
        })?;
    let info = built
        .recv()
        .map_err(|_| anyhow::anyhow!("the engine thread ended before its engine was built"))??;
    Ok((commands, info, thread))
}

/// Records a panic of the engine thread in [`Health`] as it unwinds.
struct FatalOnPanic(Arc<Health>);

impl Drop for FatalOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            *self.0.fatal.lock().unwrap_or_else(|e| e.into_inner()) =
                Some("the engine thread panicked".to_string());
        }
    }
}

/// A request's client: where its updates go, and its timings.
struct Client {
    updates: mpsc::UnboundedSender<Update>,
    submitted: Instant,
    last_token: Option<Instant>,
    /// Its client went away and a cancellation was asked.
    gone: bool,
}

struct Worker<'t> {
    scheduler: ContinuousBatchScheduler<'t>,
    clients: HashMap<RequestId, Client>,
    max_waiting: usize,
    slots: usize,
    metrics: Arc<Metrics>,
    draining: Option<Instant>,
    /// Rank 0 of a tensor-parallel group: what the other ranks must do alike.
    leader: Option<Leader>,
}

impl Worker<'_> {
    /// Steps until drained (or until every sender is gone and nothing runs); `Err` when the
    /// scheduler itself fails. A leader tells the other ranks to stop as it does.
    fn run(mut self, inbox: mpsc::UnboundedReceiver<Command>) -> kiln_engine::Result<()> {
        let result = self.steps(inbox);
        let stopped = match &mut self.leader {
            Some(leader) => leader.publish(Call::Stop),
            None => Ok(()),
        };
        result.and(stopped)
    }

    fn steps(&mut self, mut inbox: mpsc::UnboundedReceiver<Command>) -> kiln_engine::Result<()> {
        loop {
            if self.scheduler.is_idle() {
                if self.draining.is_some() {
                    return Ok(());
                }
                match inbox.blocking_recv() {
                    Some(command) => self.handle(command),
                    None => return Ok(()),
                }
            }
            while let Ok(command) = inbox.try_recv() {
                self.handle(command);
            }
            // A client gone before its first token (whatever the path it left by).
            for (&id, client) in &mut self.clients {
                if client.updates.is_closed() && !client.gone {
                    client.gone = lockstep::cancel(&mut self.scheduler, &mut self.leader, id);
                }
            }
            if self
                .draining
                .is_some_and(|deadline| Instant::now() >= deadline)
            {
                let ids: Vec<RequestId> = self.clients.keys().copied().collect();
                for id in ids {
                    lockstep::cancel(&mut self.scheduler, &mut self.leader, id);
                }
            }
            if !self.scheduler.is_idle() {
                if let Some(leader) = &mut self.leader {
                    leader.publish(Call::Step)?;
                }
                let stepped = self.scheduler.step();
                if let Some(leader) = &self.leader {
                    // Paired with every follower's check, even after a failed step (whose
                    // events then disagree with theirs, and every rank stops).
                    leader.agree(stepped.as_deref().unwrap_or_default())?;
                }
                self.route(stepped?);
            }
            let running = self.scheduler.running().len();
            self.metrics.load(running, self.scheduler.queued());
        }
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit {
                request,
                updates,
                reply,
            } => {
                let prompt = request.prompt.len();
                let answer = self.submit(request);
                match &answer {
                    Ok(id) => {
                        self.metrics.admitted(prompt);
                        self.clients.insert(
                            *id,
                            Client {
                                updates,
                                submitted: Instant::now(),
                                last_token: None,
                                gone: false,
                            },
                        );
                    }
                    Err(refusal) => self.metrics.refused(match refusal {
                        Refusal::Invalid(_) => "invalid",
                        Refusal::QueueFull { .. } => "queue_full",
                        Refusal::ShuttingDown => "shutting_down",
                    }),
                }
                if reply.send(answer.clone()).is_err() {
                    // The client left while waiting for the answer.
                    if let Ok(id) = answer {
                        lockstep::cancel(&mut self.scheduler, &mut self.leader, id);
                    }
                }
            }
            Command::Cancel(id) => {
                lockstep::cancel(&mut self.scheduler, &mut self.leader, id);
            }
            Command::Drain { deadline } => self.draining = Some(deadline),
        }
    }

    fn submit(&mut self, request: Request) -> Result<RequestId, Refusal> {
        if self.draining.is_some() {
            return Err(Refusal::ShuttingDown);
        }
        // Queued requests that the next step admits into free slots are not waiting: this one
        // would wait only behind the queue's others once the free slots are taken.
        let free = self.slots.saturating_sub(self.scheduler.running().len());
        let queued = self.scheduler.queued();
        if (queued + 1).saturating_sub(free) > self.max_waiting {
            let waiting = queued.saturating_sub(free);
            return Err(Refusal::QueueFull { waiting });
        }
        (lockstep::submit(&mut self.scheduler, &mut self.leader, request))
            .map_err(|e| Refusal::Invalid(e.to_string()))
    }

    /// Sends each event to its client; a client that is gone has its request cancelled.
    fn route(&mut self, events: Vec<Event>) {
        let now = Instant::now();
        for event in events {
            let Some(client) = self.clients.get_mut(&event.id) else {
                continue;
            };
            if event.token.is_some() {
                self.metrics.generated();
                match client.last_token {
                    None => self.metrics.first_token(now - client.submitted),
                    Some(last) => self.metrics.next_token(now - last),
                }
                client.last_token = Some(now);
            }
            let Some(reason) = event.finished else {
                let update = Update::Token {
                    id: event.token.unwrap_or_default(),
                    text: event.text,
                };
                if event.token.is_some() && client.updates.send(update).is_err() && !client.gone {
                    client.gone = lockstep::cancel(&mut self.scheduler, &mut self.leader, event.id);
                }
                continue;
            };
            self.metrics
                .finished(reason.as_str(), now - client.submitted);
            if let Some(leader) = &mut self.leader {
                leader.record(Call::Forget(event.id.0));
            }
            if let Some(outcome) = self.scheduler.forget(event.id) {
                let _ = client.updates.send(Update::Finished {
                    token: event.token,
                    outcome,
                });
            }
            self.clients.remove(&event.id);
        }
    }
}
