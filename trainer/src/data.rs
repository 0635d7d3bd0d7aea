//! Tokenized training data: a flat little-endian file of u16 or u32 token ids (the format
//! nanoGPT's `prepare.py` writes) or a safetensors file with an integer `tokens` tensor,
//! memory-mapped, every id checked against the vocabulary before training starts; a
//! validation split at its end; and deterministic `[B, T+1]` windows of each step, drawn by
//! seed ([`Sampling::Random`]) or read in order ([`Sampling::Sequential`]).
//!
//! The windows of step `k` depend on the seed, the split and `k` alone (random windows take
//! their own ChaCha stream), so a resumed run reads exactly the windows an uninterrupted one
//! would: the data cursor of a checkpoint is its step.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// How token ids are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenDType {
    U16,
    U32,
    I32,
    I64,
}

impl TokenDType {
    pub fn size(self) -> usize {
        match self {
            TokenDType::U16 => 2,
            TokenDType::U32 | TokenDType::I32 => 4,
            TokenDType::I64 => 8,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            TokenDType::U16 => "u16",
            TokenDType::U32 => "u32",
            TokenDType::I32 => "i32",
            TokenDType::I64 => "i64",
        }
    }

    /// The dtype of a flat file for a vocabulary of `vocab` ids: u16 when every id fits.
    pub fn for_vocab(vocab: usize) -> TokenDType {
        if vocab <= 1 << 16 {
            TokenDType::U16
        } else {
            TokenDType::U32
        }
    }
}

/// A memory-mapped token file, every id checked to be below the vocabulary.
///
/// The map stays valid while the file is unchanged; like every trainer that memory-maps its
/// data (nanoGPT's `np.memmap`), kiln expects nobody to rewrite the file during a run.
pub struct TokenData {
    path: PathBuf,
    map: Mmap,
    /// Byte offset of the first id (a safetensors file's data section).
    offset: usize,
    len: usize,
    dtype: TokenDType,
}

impl TokenData {
    /// Opens `path`: a `.safetensors` file with an integer tensor `tokens` (any shape, read
    /// flat), or a flat file of `raw` ids (default: [`TokenDType::for_vocab`]). Refuses a file
    /// whose size is not a whole number of ids and any id outside `0..vocab`, naming where.
    pub fn open(path: &Path, raw: Option<TokenDType>, vocab: usize) -> Result<TokenData> {
        let io = |e: std::io::Error| Error::Data {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        let file = File::open(path).map_err(io)?;
        // SAFETY: read-only map of a file the run expects to stay unchanged (see the type).
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let safetensors = path.extension().is_some_and(|e| e == "safetensors");
        let (offset, bytes, dtype) = if safetensors {
            tokens_tensor(path, &map)?
        } else {
            let dtype = raw.unwrap_or(TokenDType::for_vocab(vocab));
            (0, map.len(), dtype)
        };
        if bytes % dtype.size() != 0 {
            return Err(Error::Data {
                path: path.to_path_buf(),
                reason: format!(
                    "{bytes} bytes is not a whole number of {} ids ({} bytes each); pass \
                     --data-dtype for a file of another id size",
                    dtype.name(),
                    dtype.size()
                ),
            });
        }
        let data = TokenData {
            path: path.to_path_buf(),
            map,
            offset,
            len: bytes / dtype.size(),
            dtype,
        };
        data.check_ids(vocab)?;
        Ok(data)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn dtype(&self) -> TokenDType {
        self.dtype
    }

    /// Id `i` (`i < len`).
    pub fn get(&self, i: usize) -> i64 {
        let size = self.dtype.size();
        let at = self.offset + i * size;
        let b = &self.map[at..at + size];
        match self.dtype {
            TokenDType::U16 => i64::from(u16::from_le_bytes([b[0], b[1]])),
            TokenDType::U32 => i64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            TokenDType::I32 => i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            TokenDType::I64 => i64::from_le_bytes(b.try_into().expect("8 bytes")),
        }
    }

    fn check_ids(&self, vocab: usize) -> Result<()> {
        let bad = (0..self.len).find(|&i| !(0..vocab as i64).contains(&self.get(i)));
        match bad {
            None => Ok(()),
            Some(i) => Err(Error::Data {
                path: self.path.clone(),
                reason: format!(
                    "token {i} is {}, outside the model's vocabulary of {vocab} ids (a file \
                     made with another tokenizer, or read as the wrong --data-dtype than {}?)",
                    self.get(i),
                    self.dtype.name()
                ),
            }),
        }
    }

    /// A fingerprint of the file (length and a hash of its ids at 4096 evenly spread places),
    /// kept in checkpoints so a resume on other data is refused.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update((self.len as u64).to_le_bytes());
        let samples = self.len.min(4096);
        for k in 0..samples {
            let i = k * self.len / samples;
            hash.update(self.get(i).to_le_bytes());
        }
        let digest = hash.finalize();
        digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
    }

    /// The training and validation ranges: the last `val_fraction` of the ids (rounded up)
    /// held out. Each holds at least one window of `seq + 1` ids, or the error says how many
    /// ids are missing.
    pub fn split(&self, seq: usize, val_fraction: f64) -> Result<Split> {
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(Error::Option {
                flag: "--val-fraction",
                reason: format!("must be in [0, 1), got {val_fraction}"),
            });
        }
        let val = (self.len as f64 * val_fraction).ceil() as usize;
        let split = Split {
            train: 0..self.len - val,
            val: self.len - val..self.len,
        };
        let window = seq.saturating_add(1);
        let short = |part: &str, have: usize| Error::Data {
            path: self.path.clone(),
            reason: format!(
                "its {part} split holds {have} of its {} ids, fewer than one window of \
                 --seq {seq} + 1 = {window}",
                self.len
            ),
        };
        if split.train.len() < window {
            return Err(short("training", split.train.len()));
        }
        if val > 0 && split.val.len() < window {
            return Err(short("validation", split.val.len()));
        }
        Ok(split)
    }

    /// The `[batch, seq + 1]` windows of `stream` in `range`, row-major ids (see
    /// [`Sampling`]). `range` holds at least one window ([`TokenData::split`]), and for
    /// sequential sampling `batch · seq + 1` ids ([`Sampling::check`]).
    pub fn windows(
        &self,
        range: &Range<usize>,
        (batch, seq): (usize, usize),
        (sampling, seed): (Sampling, u64),
        stream: Stream,
    ) -> Vec<i64> {
        let mut ids = Vec::with_capacity(batch * (seq + 1));
        match sampling {
            Sampling::Random => {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                rng.set_stream(stream.id());
                let last_start = range.end - (seq + 1);
                for _ in 0..batch {
                    let start = rng.random_range(range.start..=last_start);
                    ids.extend((start..start + seq + 1).map(|i| self.get(i)));
                }
            }
            Sampling::Sequential => {
                let per_batch = batch * seq;
                let batches = ((range.len() - 1) / per_batch) as u64;
                let start = range.start + (stream.index() % batches) as usize * per_batch;
                for row in 0..batch {
                    let first = start + row * seq;
                    ids.extend((first..first + seq + 1).map(|i| self.get(i)));
                }
            }
        }
        ids
    }
}

/// How the windows of a step are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sampling {
    /// Each row's start drawn uniformly from the split by a ChaCha8 generator of the seed, on
    /// a stream of its own per step (and per validation batch).
    Random,
    /// llm.c's loader: batch `k` (from 0) reads the `B·T + 1` ids from `k·B·T` on, row `b`
    /// the `T + 1` from `k·B·T + b·T`, wrapping to the split's start when the next batch would
    /// not fit (the seed plays no part).
    Sequential,
}

impl Sampling {
    pub fn name(self) -> &'static str {
        match self {
            Sampling::Random => "random",
            Sampling::Sequential => "sequential",
        }
    }

    /// Sequential batches need `batch · seq + 1` ids in each used split.
    pub fn check(
        self,
        data: &TokenData,
        split: &Split,
        (batch, ranks, seq): (usize, usize, usize),
    ) -> Result<()> {
        // A training step takes `ranks · batch` rows (data parallelism), a validation batch
        // `batch` (every rank validates alike).
        let rows = |ranks: usize| match ranks {
            1 => format!("--batch {batch}"),
            _ => format!("{ranks} ranks × --batch {batch}"),
        };
        let parts = [
            ("training", &split.train, ranks),
            ("validation", &split.val, 1),
        ];
        for (part, range, ranks) in parts {
            let need = batch * ranks * seq + 1;
            if self == Sampling::Sequential && !range.is_empty() && range.len() < need {
                return Err(Error::Data {
                    path: data.path.clone(),
                    reason: format!(
                        "its {part} split holds {} ids, fewer than one sequential batch of \
                         {} × --seq {seq} + 1 = {need}",
                        range.len(),
                        rows(ranks)
                    ),
                });
            }
        }
        Ok(())
    }
}

/// Which windows: training batch `k` (from 0: step `s` of `a` micro-batches reads batches
/// `(s−1)·a ..`), or validation batch `k` (the same at every evaluation, so validation losses
/// compare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Train { batch: u64 },
    Validation { batch: u64 },
}

impl Stream {
    fn id(self) -> u64 {
        match self {
            Stream::Train { batch } => (batch + 1) << 1,
            Stream::Validation { batch } => (batch << 1) | 1,
        }
    }

    fn index(self) -> u64 {
        match self {
            Stream::Train { batch } | Stream::Validation { batch } => batch,
        }
    }
}

/// The ids of the training and of the validation windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub train: Range<usize>,
    pub val: Range<usize>,
}

/// Offset, byte length and dtype of the `tokens` tensor of a safetensors file in `map`.
fn tokens_tensor(path: &Path, map: &[u8]) -> Result<(usize, usize, TokenDType)> {
    let refuse = |reason: String| Error::Data {
        path: path.to_path_buf(),
        reason,
    };
    let tensors = safetensors::SafeTensors::deserialize(map)
        .map_err(|e| refuse(format!("not a safetensors file: {e}")))?;
    let names = || {
        let mut names: Vec<String> = tensors.names().into_iter().map(str::to_string).collect();
        names.sort();
        names.join(", ")
    };
    let view = tensors
        .tensor("tokens")
        .map_err(|_| refuse(format!("has no tensor `tokens` (it holds: {})", names())))?;
    let dtype = match view.dtype() {
        safetensors::Dtype::U16 => TokenDType::U16,
        safetensors::Dtype::U32 => TokenDType::U32,
        safetensors::Dtype::I32 => TokenDType::I32,
        safetensors::Dtype::I64 => TokenDType::I64,
        other => {
            return Err(refuse(format!(
                "tensor `tokens` is {other:?}; token ids are U16, U32, I32 or I64"
            )))
        }
    };
    let data = view.data();
    let offset = data.as_ptr() as usize - map.as_ptr() as usize;
    Ok((offset, data.len(), dtype))
}

#[cfg(test)]
#[path = "data_tests.rs"]
mod tests;
