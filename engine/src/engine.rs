//! One compiled model serving many sequences: prefill programs for prompt-length buckets and
//! batch buckets, decode programs for batch buckets, all compiled once into ONE executable
//! group — one activation arena of the largest plan's bytes, the weights once, and ONE
//! persistent KV pool of `slots` sequences of `max_seq` positions (`cache.{k,v}.{layer}`, each
//! `[slots, Hkv, max_seq, D]`).
//!
//! A program of `B` rows runs any number of sequences up to `B`: each row names its slot in
//! the pool (`cache_rows`), and the rows beyond the sequences are padding
//! ([`kiln_ir::PADDING_SLOT`]), which read and write no slot. So a slot is touched only by the
//! rows that name it, and a slot's rows past its sequence's position are never read (attention
//! sees positions `0..=position`): slots are reused without clearing.
//!
//! Prompts are padded to their bucket's length; the padding tokens' keys land past the prompt,
//! where the sequence's next decode steps overwrite them before any query reads them, and the
//! logits come from each prompt's own last token (`logit_rows`).
//!
//! Tensor parallelism ([`EngineOptions::tensor_parallel`]): each rank of a group compiles the
//! same buckets as its shard of the model (its heads and MLP columns, its part of the KV pool)
//! and joins the group's communicator ([`Engine::join`]); every rank computes the same logits
//! bit for bit, so ranks fed the same requests sample the same tokens and step in lockstep.

use std::collections::BTreeMap;

use kiln_frontend::model::{ModelConfig, Precision};
use kiln_ir::PADDING_SLOT;
use kiln_runtime::{Executable, GroupMemory, RunMode, Tensor};

use crate::error::{Error, Result};

/// The shapes an [`Engine`] is compiled for.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    /// Sequences the KV pool holds at once.
    pub slots: usize,
    /// Positions of each slot: a sequence's prompt and generated tokens together.
    pub max_seq: usize,
    /// Prompt-length buckets of the prefill programs, ascending; the last is the longest
    /// prompt the engine takes.
    pub prefill_lengths: Vec<usize>,
    /// Batch buckets of the prefill programs, ascending.
    pub prefill_batches: Vec<usize>,
    /// Batch buckets of the decode programs, ascending.
    pub decode_batches: Vec<usize>,
    pub precision: Precision,
    pub mode: RunMode,
    /// This engine is rank `.0` of `.1` tensor-parallel ranks; `None`: the whole model.
    pub tensor_parallel: Option<(usize, usize)>,
}

impl EngineOptions {
    /// Buckets for `slots` sequences of `max_seq` positions: prompt lengths 16, 32, 64, …
    /// up to `max_seq` (and `max_seq` itself), prefill batches 1, 2, 4, 8 and decode batches
    /// 1, 2, 4, … up to `slots` (and `slots` itself).
    ///
    /// A padding row costs little: it skips attention and the cache, and only rides along in
    /// the GEMMs. Decode midpoints (12, 24, …) were measured and rejected (BENCHMARKS.md,
    /// "Serving": 17 requests on the H200 stepped 1% faster in 24 rows than in 32).
    pub fn new(slots: usize, max_seq: usize, precision: Precision, mode: RunMode) -> Self {
        EngineOptions {
            slots,
            max_seq,
            prefill_lengths: doublings(16, max_seq),
            prefill_batches: doublings(1, slots.min(8)),
            decode_batches: doublings(1, slots),
            precision,
            mode,
            tensor_parallel: None,
        }
    }

    /// The longest prompt a prefill program takes.
    pub fn max_prompt(&self) -> usize {
        self.prefill_lengths.last().copied().unwrap_or(0)
    }
}

/// `first, 2·first, 4·first, …` below `last`, then `last` (nothing when `last` is 0).
fn doublings(first: usize, last: usize) -> Vec<usize> {
    let mut out: Vec<usize> = std::iter::successors(Some(first), |&n| n.checked_mul(2))
        .take_while(|&n| n < last)
        .collect();
    if last > 0 {
        out.push(last);
    }
    out
}

/// What an engine holds on its device, in bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineMemory {
    /// The group's arena (the largest plan's) and what one arena per program would take.
    pub group: GroupMemory,
    /// The KV pool by its formula: layers × 2 × slots × Hkv × max_seq × D × element bytes.
    pub pool_bytes: u64,
    /// Programs compiled.
    pub programs: usize,
}

/// What a step brings back from the device besides each row's greedy token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// Only the greedy tokens (`B` ids): enough when every row decodes greedily.
    Tokens,
    /// Also the logits (`B·V` floats), for sampling on the host.
    Logits,
}

/// What one step gave each of its rows, in row order.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// Each row's greedy token: the argmax of its logits (ties to the lowest id), -1 where the
    /// logits hold a NaN or are all -inf.
    pub tokens: Vec<i64>,
    /// `[rows, vocab]`, with [`Fetch::Logits`].
    logits: Option<Vec<f32>>,
    vocab: usize,
}

impl Step {
    fn new(rows: usize, vocab: usize, fetch: Fetch) -> Self {
        Step {
            tokens: vec![-1; rows],
            logits: (fetch == Fetch::Logits).then(|| vec![0.0; rows * vocab]),
            vocab,
        }
    }

    /// Row `index`'s logits, when they were fetched.
    pub fn logits(&self, index: usize) -> Option<&[f32]> {
        let all = self.logits.as_ref()?;
        all.get(index * self.vocab..(index + 1) * self.vocab)
    }

    /// Copies the first `rows.len()` rows of `exe`'s outputs to rows `rows`.
    fn fetch(&mut self, exe: &dyn Executable, rows: &[usize], fetch: Fetch) -> Result<()> {
        let tokens = exe.get("next_tokens")?.to_vec::<i64>()?;
        for (&to, token) in rows.iter().zip(tokens) {
            self.tokens[to] = token;
        }
        let (Fetch::Logits, Some(all)) = (fetch, self.logits.as_mut()) else {
            return Ok(());
        };
        let vocab = self.vocab;
        exe.get("logits")?.read_with(|view| -> Result<()> {
            let values = (view.slice::<f32>("logits", "logits")).map_err(|e| Error::Generate {
                reason: format!("the program's logits: {e}"),
            })?;
            for (from, &to) in rows.iter().enumerate() {
                let source = &values[from * vocab..(from + 1) * vocab];
                all[to * vocab..(to + 1) * vocab].copy_from_slice(source);
            }
            Ok(())
        })?
    }
}

/// One sequence of a prefill: its slot and its prompt.
#[derive(Clone, Copy, Debug)]
pub struct PrefillRow<'a> {
    pub slot: usize,
    pub prompt: &'a [u32],
}

/// One sequence of a decode step: its slot, the token to feed and its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeRow {
    pub slot: usize,
    pub token: u32,
    pub position: usize,
}

/// The compiled model (see the module doc).
pub struct Engine {
    config: ModelConfig,
    options: EngineOptions,
    executables: Vec<Box<dyn Executable>>,
    /// (batch, length) → executable.
    prefill: BTreeMap<(usize, usize), usize>,
    /// batch → executable.
    decode: BTreeMap<usize, usize>,
    memory: EngineMemory,
}

/// Checks that every rank of a tensor-parallel group got the same events from its step (request, token, finish): a checksum
/// of them summed over the ranks is the world size times this rank's.
pub fn agree(
    communicator: &dyn kiln_runtime::collective::Communicator,
    events: &[crate::scheduler::Event],
) -> Result<()> {
    const MODULUS: u64 = 65_521;
    let checksum = events.iter().fold(0u64, |sum, event| {
        let token = event.token.map_or(0, |t| u64::from(t) + 1);
        let finished = u64::from(event.finished.is_some());
        (sum * 31 + event.id.0 as u64 * 7 + token * 3 + finished) % MODULUS
    });
    // Exact in f32: at most 64 ranks of values below 2^16.
    let mine = kiln_runtime::Tensor::from_vec(vec![checksum as f32], [1])?;
    let sum = communicator.all_reduce(&[mine])?[0].to_vec::<f32>()?[0];
    let ranks = communicator.world_size() as f32;
    if sum != checksum as f32 * ranks {
        return Err(Error::Generate {
            reason: format!(
                "tensor-parallel rank {}'s step gave other tokens than the other ranks' \
                 (checksums {checksum} summed to {sum}); the ranks are out of step",
                communicator.rank()
            ),
        });
    }
    Ok(())
}

impl Engine {
    /// Makes the engine's all-reduces sum over `communicator`'s ranks (a tensor-parallel
    /// engine's group; see the module doc).
    pub fn join(
        &mut self,
        communicator: &std::sync::Arc<dyn kiln_runtime::collective::Communicator>,
    ) -> Result<()> {
        Ok(kiln_runtime::join_all(&mut self.executables, communicator)?)
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn memory(&self) -> &EngineMemory {
        &self.memory
    }

    /// Writes each row's prompt into its slot from position 0 and returns what follows each
    /// prompt's last token (its greedy token, and per `fetch` its logits), in row order. Rows take distinct slots; prompts hold 1 to
    /// [`EngineOptions::max_prompt`] ids of the vocabulary.
    pub fn prefill(&mut self, rows: &[PrefillRow<'_>], fetch: Fetch) -> Result<Step> {
        self.check_slots(rows.iter().map(|r| r.slot))?;
        let mut by_length: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (index, row) in rows.iter().enumerate() {
            self.check_prompt(row.prompt)?;
            let length = (self.options.prefill_lengths.iter())
                .find(|&&l| l >= row.prompt.len())
                .copied()
                .unwrap_or_default();
            by_length.entry(length).or_default().push(index);
        }
        let mut out = Step::new(rows.len(), self.config.vocab_size, fetch);
        for (length, indices) in by_length {
            for chunk in chunks(&indices, &self.options.prefill_batches) {
                let batch = bucket(chunk.len(), &self.options.prefill_batches);
                let mut tokens = vec![0i64; batch * length];
                let mut slots = vec![PADDING_SLOT; batch];
                let mut last: Vec<i64> = (0..batch).map(|b| (b * length) as i64).collect();
                for (b, &index) in chunk.iter().enumerate() {
                    let row = &rows[index];
                    for (t, &id) in row.prompt.iter().enumerate() {
                        tokens[b * length + t] = i64::from(id);
                    }
                    slots[b] = row.slot as i64;
                    last[b] = (b * length + row.prompt.len() - 1) as i64;
                }
                let positions = (0..batch * length).map(|i| (i % length) as i64).collect();
                let exe = &mut self.executables[self.prefill[&(batch, length)]];
                exe.set("tokens", &Tensor::from_vec(tokens, [batch, length])?)?;
                exe.set("positions", &Tensor::from_vec(positions, [batch, length])?)?;
                exe.set(
                    "cache_positions",
                    &Tensor::from_vec(vec![0i64; batch], [batch])?,
                )?;
                exe.set("cache_rows", &Tensor::from_vec(slots, [batch])?)?;
                exe.set("logit_rows", &Tensor::from_vec(last, [batch])?)?;
                exe.run(self.options.mode)?;
                out.fetch(exe.as_ref(), chunk, fetch)?;
            }
        }
        Ok(out)
    }

    /// Feeds each row's token at its position of its slot and returns what follows (each row's
    /// greedy token, and per `fetch` its logits), in row order. Rows take distinct slots; positions lie below `max_seq`.
    pub fn decode(&mut self, rows: &[DecodeRow], fetch: Fetch) -> Result<Step> {
        self.check_slots(rows.iter().map(|r| r.slot))?;
        for row in rows {
            self.check_token(row.token)?;
            if row.position >= self.options.max_seq {
                return Err(Error::Request {
                    reason: format!(
                        "position {} of slot {} is past the {} positions of a slot",
                        row.position, row.slot, self.options.max_seq
                    ),
                });
            }
        }
        let mut out = Step::new(rows.len(), self.config.vocab_size, fetch);
        let all: Vec<usize> = (0..rows.len()).collect();
        for chunk in chunks(&all, &self.options.decode_batches) {
            let batch = bucket(chunk.len(), &self.options.decode_batches);
            let (mut tokens, mut positions) = (vec![0i64; batch], vec![0i64; batch]);
            let mut slots = vec![PADDING_SLOT; batch];
            for (b, &index) in chunk.iter().enumerate() {
                let row = rows[index];
                tokens[b] = i64::from(row.token);
                positions[b] = row.position as i64;
                slots[b] = row.slot as i64;
            }
            let exe = &mut self.executables[self.decode[&batch]];
            exe.set("tokens", &Tensor::from_vec(tokens, [batch, 1])?)?;
            exe.set("positions", &Tensor::from_vec(positions, [batch])?)?;
            exe.set("cache_rows", &Tensor::from_vec(slots, [batch])?)?;
            exe.run(self.options.mode)?;
            out.fetch(exe.as_ref(), chunk, fetch)?;
        }
        Ok(out)
    }

    /// Refuses a slot outside the pool and a slot two rows take.
    fn check_slots(&self, slots: impl Iterator<Item = usize>) -> Result<()> {
        let mut seen = vec![false; self.options.slots];
        for slot in slots {
            let Some(taken) = seen.get_mut(slot) else {
                return Err(Error::Request {
                    reason: format!("slot {slot} is outside the pool of {}", self.options.slots),
                });
            };
            if std::mem::replace(taken, true) {
                return Err(Error::Request {
                    reason: format!("two rows of one step name slot {slot}"),
                });
            }
        }
        Ok(())
    }

    fn check_prompt(&self, prompt: &[u32]) -> Result<()> {
        let longest = self.options.max_prompt();
        if prompt.is_empty() || prompt.len() > longest {
            return Err(Error::Request {
                reason: format!(
                    "a prompt of {} tokens: the engine takes 1 to {longest}",
                    prompt.len()
                ),
            });
        }
        prompt.iter().try_for_each(|&id| self.check_token(id))
    }

    fn check_token(&self, id: u32) -> Result<()> {
        let vocab = self.config.vocab_size;
        if id as usize >= vocab {
            return Err(Error::Request {
                reason: format!("token {id} is outside the vocabulary of {vocab}"),
            });
        }
        Ok(())
    }
}

/// The smallest bucket that holds `n` rows (the largest when none does).
fn bucket(n: usize, buckets: &[usize]) -> usize {
    let largest = buckets.last().copied().unwrap_or(1);
    buckets.iter().copied().find(|&b| b >= n).unwrap_or(largest)
}

/// `indices` in runs of at most the largest bucket.
fn chunks<'i>(indices: &'i [usize], buckets: &[usize]) -> std::slice::Chunks<'i, usize> {
    indices.chunks(buckets.last().copied().unwrap_or(1).max(1))
}

mod build;
pub use build::pool_bytes;

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
