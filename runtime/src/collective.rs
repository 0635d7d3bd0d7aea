//! Collectives on the CPU: what `Op::AllReduce` means to the reference interpreter.
//!
//! A program that runs on several ranks (data- or tensor-parallel) reaches the others only
//! through its `all_reduce` ops. On devices NCCL carries them; on the CPU a [`Communicator`]
//! does, so the interpreter can run N ranks of one program in N threads and the sharding
//! arithmetic — which slice each rank holds, what the all-reduce sums — is checked against the
//! single-rank program without a GPU ([`interpret_in`](crate::interpret_in)).
//!
//! [`World::ranks`]`(n)` makes the `n` ranks of one simulated world. Its all-reduce sums the
//! ranks' values in rank order (rank 0 first), in f32, so every rank gets the same bits and a
//! run is deterministic. A rank that fails before reaching a collective must say so
//! ([`Rank::abort`]) or the others would wait for it; they also give up after
//! [`World::ranks_with_deadline`]'s wait (60 s by default) with an error naming who was missing.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// The ranks a program's collectives reach.
pub trait Communicator: Send + Sync {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn world_size(&self) -> usize;
    /// Each of `tensors` (f32) summed over every rank, in a fixed order, as new tensors of the
    /// same shapes. Every rank must call it with tensors of the same shapes, in the same order
    /// of calls.
    fn all_reduce(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>>;

    /// Rank 0's `bytes` on every rank (the others' `bytes` are not read), at most
    /// [`MAX_BROADCAST`] of them: two all-reduces, rank 0 bringing the length and then each
    /// byte as an f32 and the other ranks zeros, so the sums are exact. For host messages
    /// (what a tensor-parallel server's ranks must all do next), not tensors.
    fn broadcast(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let root = self.rank() == 0;
        if root && bytes.len() > MAX_BROADCAST {
            return Err(Error::Collective {
                rank: 0,
                reason: format!("{} bytes to broadcast, past {MAX_BROADCAST}", bytes.len()),
            });
        }
        let length = if root { bytes.len() as u32 } else { 0 };
        let header = length.to_le_bytes().map(f32::from).to_vec();
        let header = self.all_reduce(&[Tensor::from_vec(header, [4])?])?;
        let sum = f32_values(&header[0])?;
        let length = u32::from_le_bytes([0, 1, 2, 3].map(|i| sum[i] as u8)) as usize;
        if length > MAX_BROADCAST {
            return Err(Error::Collective {
                rank: self.rank(),
                reason: format!("rank 0 announced {length} bytes, past {MAX_BROADCAST}"),
            });
        }
        if length == 0 {
            return Ok(Vec::new());
        }
        let body: Vec<f32> = match root {
            true => bytes.iter().map(|&b| f32::from(b)).collect(),
            false => vec![0.0; length],
        };
        let body = self.all_reduce(&[Tensor::from_vec(body, [length])?])?;
        Ok(f32_values(&body[0])?.iter().map(|&b| b as u8).collect())
    }
}

/// The most bytes [`Communicator::broadcast`] carries.
pub const MAX_BROADCAST: usize = 16 << 20;

/// A world of one rank: every collective is the identity (a copy).
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Communicator for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn all_reduce(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        tensors
            .iter()
            .map(|t| f32_values(t).and_then(|v| Tensor::from_vec(v, t.shape().clone())))
            .collect()
    }
}

/// The shared state of a simulated world.
pub struct World {
    size: usize,
    deadline: Duration,
    state: Mutex<Round>,
    turn: Condvar,
}

/// One collective call in progress: the values the ranks have brought so far.
#[derive(Default)]
struct Round {
    /// Calls completed so far; a rank waits for the count to pass its own call.
    completed: u64,
    /// Per rank, its operands of the current call (flattened f32 values per tensor).
    brought: Vec<Option<Vec<Vec<f32>>>>,
    /// The sums of the last completed call, and how many ranks have still to take them.
    sums: Arc<Vec<Vec<f32>>>,
    untaken: usize,
    /// Set by a rank that failed: every wait ends with an error naming it.
    aborted: Option<(usize, String)>,
}

impl World {
    /// The `size` ranks of a new world (`size >= 1`).
    pub fn ranks(size: usize) -> Result<Vec<Rank>> {
        World::ranks_with_deadline(size, Duration::from_secs(60))
    }

    /// [`World::ranks`] whose collectives give up after waiting `deadline` for the other ranks.
    pub fn ranks_with_deadline(size: usize, deadline: Duration) -> Result<Vec<Rank>> {
        if size == 0 {
            return Err(Error::Collective {
                rank: 0,
                reason: "a world needs at least one rank".to_string(),
            });
        }
        let world = Arc::new(World {
            size,
            deadline,
            state: Mutex::new(Round {
                brought: vec![None; size],
                ..Round::default()
            }),
            turn: Condvar::new(),
        });
        Ok((0..size)
            .map(|rank| Rank {
                world: Arc::clone(&world),
                rank,
                calls: Mutex::new(0),
            })
            .collect())
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        // A rank that panicked mid-call leaves the round as it was; the others see its abort
        // or time out, so the poison carries nothing to recover.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// One rank of a [`World`].
pub struct Rank {
    world: Arc<World>,
    rank: usize,
    /// Collective calls this rank has made.
    calls: Mutex<u64>,
}

impl Rank {
    /// Tells the other ranks this one has failed (`reason`): their waiting collectives return
    /// an error naming it, now and from then on.
    pub fn abort(&self, reason: &str) {
        let mut round = self.world.lock();
        round.aborted.get_or_insert((self.rank, reason.to_string()));
        self.world.turn.notify_all();
    }

    fn error(&self, reason: String) -> Error {
        Error::Collective {
            rank: self.rank,
            reason,
        }
    }

    /// Waits on the world's condition variable until `done`, an abort, or the deadline.
    fn wait_until<'a>(
        &self,
        mut round: MutexGuard<'a, Round>,
        what: &str,
        done: impl Fn(&Round) -> bool,
    ) -> Result<MutexGuard<'a, Round>> {
        let end = Instant::now() + self.world.deadline;
        loop {
            if let Some((rank, reason)) = &round.aborted {
                return Err(self.error(format!("rank {rank} failed: {reason}")));
            }
            if done(&round) {
                return Ok(round);
            }
            let now = Instant::now();
            if now >= end {
                let missing: Vec<String> = (round.brought.iter().enumerate())
                    .filter(|(_, b)| b.is_none())
                    .map(|(r, _)| r.to_string())
                    .collect();
                let reason = format!(
                    "gave up after {:?} waiting {what} (ranks not there yet: {})",
                    self.world.deadline,
                    missing.join(", ")
                );
                // This rank is out of step now: the others must not wait for it either.
                round.aborted.get_or_insert((self.rank, reason.clone()));
                self.world.turn.notify_all();
                return Err(self.error(reason));
            }
            round = (self.world.turn.wait_timeout(round, end - now))
                .unwrap_or_else(|poison| poison.into_inner())
                .0;
        }
    }
}

impl Communicator for Rank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world.size
    }

    fn all_reduce(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        let values = tensors.iter().map(f32_values).collect::<Result<Vec<_>>>()?;
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        let call = *calls;
        let world = &self.world;
        let mut round = world.lock();
        // The previous call's sums must all be taken before this call's values come in.
        round = self.wait_until(round, "for the last call's sums to be taken", |r| {
            r.completed == call && r.untaken == 0
        })?;
        round.brought[self.rank] = Some(values);
        if round.brought.iter().all(Option::is_some) {
            let brought: Vec<Vec<Vec<f32>>> = round
                .brought
                .iter_mut()
                .map(|b| b.take().unwrap_or_default())
                .collect();
            let sums = match sum_in_rank_order(&brought) {
                Ok(sums) => sums,
                Err(reason) => {
                    // The others must not wait for sums that will never come.
                    round.aborted.get_or_insert((self.rank, reason.clone()));
                    world.turn.notify_all();
                    return Err(self.error(reason));
                }
            };
            round.sums = Arc::new(sums);
            round.untaken = world.size;
            round.completed += 1;
            world.turn.notify_all();
        }
        round = self.wait_until(round, "for the other ranks' values", |r| r.completed > call)?;
        let sums = Arc::clone(&round.sums);
        round.untaken -= 1;
        if round.untaken == 0 {
            world.turn.notify_all();
        }
        drop(round);
        *calls += 1;
        (tensors.iter().zip(sums.iter()))
            .map(|(t, sum)| Tensor::from_vec(sum.clone(), t.shape().clone()))
            .collect()
    }
}

/// The sum over ranks of each tensor's values, rank 0 first; an error when the ranks brought
/// different tensor counts or sizes (a program that differs between ranks).
fn sum_in_rank_order(brought: &[Vec<Vec<f32>>]) -> std::result::Result<Vec<Vec<f32>>, String> {
    let first = &brought[0];
    for (rank, values) in brought.iter().enumerate() {
        let sizes = |v: &Vec<Vec<f32>>| v.iter().map(Vec::len).collect::<Vec<_>>();
        if sizes(values) != sizes(first) {
            return Err(format!(
                "rank {rank} brought tensors of {:?} elements to an all-reduce where rank 0 \
                 brought {:?}",
                sizes(values),
                sizes(first)
            ));
        }
    }
    Ok((0..first.len())
        .map(|t| {
            let mut sum = first[t].clone();
            for values in &brought[1..] {
                for (s, x) in sum.iter_mut().zip(&values[t]) {
                    *s += x;
                }
            }
            sum
        })
        .collect())
}

/// The f32 values of `tensor` in row-major order.
pub(crate) fn f32_values(tensor: &Tensor) -> Result<Vec<f32>> {
    if tensor.dtype() != kiln_ir::DType::F32 {
        return Err(Error::DType {
            op: "all_reduce",
            expected: kiln_ir::DType::F32,
            got: tensor.dtype(),
        });
    }
    tensor.to_vec::<f32>()
}

#[cfg(test)]
#[path = "collective_tests.rs"]
mod tests;
