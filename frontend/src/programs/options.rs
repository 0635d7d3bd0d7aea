//! The options every program is built with, the one default for its cache and the checks
//! that refuse, before anything is built, what no program of the model can be built with.

use kiln_ir::{AdamWConfig, DType, TensorType};

use super::ProgramKind;
use crate::error::{Error, Result};
use crate::model::{ModelConfig, Precision};

/// Shapes and options of a program. `batch`, `seq` and `max_seq` are the `--batch`, `--seq`
/// and `--max-seq` of every kiln command, and errors about them name those flags.
#[derive(Clone, Debug, PartialEq)]
pub struct ProgramOptions {
    pub batch: usize,
    /// Tokens per row (prefill, train, eval); decode always takes one and ignores it.
    pub seq: usize,
    /// Rows of the KV cache (prefill, decode); `None` takes the default of
    /// [`ProgramOptions::cache_rows`].
    pub max_seq: Option<usize>,
    /// Prefill and decode over a KV pool of this many slots (a serving engine's programs):
    /// each cache is `[pool,Hkv,rows,D]`, shared by every program of the engine, and the
    /// program takes `cache_rows [B]`, the slot of each batch row (distinct). `None`: each
    /// batch row owns its cache row (`[B,Hkv,rows,D]`).
    pub pool: Option<usize>,
    /// Prefixed to the cache states' names (`{prefix}cache.k.{layer}`): programs of several
    /// pools in one executable group keep their caches apart.
    pub cache_prefix: String,
    /// Eval: also output `grad.<name>` for every parameter.
    pub grads: bool,
    /// f32 GEMMs, or bf16 GEMM inputs with f32 accumulation (mixed precision).
    pub precision: Precision,
    /// Run the fusion pass (`kiln_ir::fuse`) on the traced program; off keeps the unfused
    /// program, the reference (`--fusion off`).
    pub fusion: bool,
    /// Train: AdamW's hyper-parameters (its learning rate is the program's `lr` input).
    pub adamw: AdamWConfig,
    /// Train: weight decay 0 for parameters of fewer than two dims (norm weights and biases),
    /// the usual recipe (nanoGPT's; what Hugging Face's Trainer exempts in these models).
    pub decay_exempt_vectors: bool,
    /// Train: clip the global gradient norm to this (`torch.nn.utils.clip_grad_norm_`) before
    /// the updates, and output it as `grad_norm`; every gradient then exists at once.
    pub clip_grad_norm: Option<f64>,
    /// Train: the program's part in a step of gradient accumulation (none: the whole step).
    pub accumulation: super::Accumulation,
    /// Train: the step of one rank of a data-parallel world: every gradient is summed over the
    /// ranks (`all_reduce` ops in buckets, on the communication stream) before the updates.
    /// Each rank runs it on its own part of the batch with the loss seed `1/ranks`, so the
    /// sum is the gradient of the combined batch's mean loss; the program is the same on every
    /// rank and for every world size.
    pub data_parallel: Option<DataParallel>,
    /// Prefill, decode, eval without grads: the program of one rank of a tensor-parallel group
    /// of this many ranks ([`ModelConfig::shard`]); its parameters and caches are the rank's
    /// shards ([`crate::model::shard_parameter`]).
    pub tensor_parallel: Option<usize>,
}

/// How a data-parallel train step groups its gradients for the all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataParallel {
    /// The most bytes of gradients one `all_reduce` sums (a bucket closes when the next
    /// gradient would pass it; a larger gradient gets a bucket of its own), in the order the
    /// backward makes them. PyTorch DDP's default, 25 MiB, by default.
    pub bucket_bytes: u64,
}

impl Default for DataParallel {
    fn default() -> Self {
        DataParallel {
            bucket_bytes: 25 << 20,
        }
    }
}

impl Default for ProgramOptions {
    fn default() -> Self {
        ProgramOptions {
            batch: 1,
            seq: 16,
            max_seq: None,
            pool: None,
            cache_prefix: String::new(),
            grads: false,
            precision: Precision::F32,
            fusion: true,
            adamw: AdamWConfig {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 1e-2,
            },
            decay_exempt_vectors: false,
            clip_grad_norm: None,
            accumulation: super::Accumulation::None,
            data_parallel: None,
            tensor_parallel: None,
        }
    }
}

/// Cache rows of a decode program without `--max-seq`: room for a long context, without sizing
/// every cache by the model's whole position range (32768 rows for Qwen2.5).
pub const DECODE_CACHE_ROWS: usize = 1024;

impl ProgramOptions {
    /// Rows of `kind`'s KV cache, `None` for the programs without one. `max_seq` when given;
    /// else prefill holds its prompt (`seq` rows) and decode [`DECODE_CACHE_ROWS`], or the
    /// model's positions when it has fewer.
    pub fn cache_rows(&self, kind: ProgramKind, config: &ModelConfig) -> Option<usize> {
        let default = match kind {
            ProgramKind::Prefill => self.seq,
            ProgramKind::Decode => DECODE_CACHE_ROWS.min(config.max_position_embeddings),
            ProgramKind::Train | ProgramKind::Eval => return None,
        };
        Some(self.max_seq.unwrap_or(default))
    }

    /// Tokens each row of `kind` takes per run.
    fn tokens_per_row(&self, kind: ProgramKind) -> usize {
        match kind {
            ProgramKind::Decode => 1,
            _ => self.seq,
        }
    }

    /// Checks that `kind` can be built for `config` with these options: every count at least 1,
    /// every position (`0..seq`, every cache row) one of the model's `max_position_embeddings`,
    /// prefill's prompt inside its cache, and the program's largest tensors addressable. Options
    /// a program does not use (decode's `seq`, train's `max_seq`) are not checked.
    pub fn validate(&self, kind: ProgramKind, config: &ModelConfig) -> Result<()> {
        let refuse = |flag, value, reason: String| {
            Err(Error::ProgramOption {
                flag,
                value,
                reason,
            })
        };
        let trains = kind == ProgramKind::Train || (kind == ProgramKind::Eval && self.grads);
        if self.precision == Precision::Bf16 && trains {
            return Err(Error::ProgramPrecision {
                precision: self.precision.name(),
                program: if kind == ProgramKind::Train {
                    "train"
                } else {
                    "eval --grads"
                },
                reason: "bf16 weights are for inference; training keeps f32 master weights \
                         (--precision bf16-gemm gives bf16 GEMM inputs)",
            });
        }
        if let Some(ranks) = self.tensor_parallel {
            if trains {
                let reason = "tensor parallelism is for prefill, decode and eval without \
                              --grads; train data-parallel"
                    .to_string();
                return refuse("--tensor-parallel", ranks, reason);
            }
            if let Err(reason) = config.shard(ranks) {
                return refuse("--tensor-parallel", ranks, reason);
            }
        }
        if let Some(DataParallel { bucket_bytes }) = self.data_parallel {
            let value = usize::try_from(bucket_bytes).unwrap_or(usize::MAX);
            if kind != ProgramKind::Train {
                let reason = "data parallelism is for train steps; prefill and decode split \
                              over ranks with --tensor-parallel"
                    .to_string();
                return refuse("--data-parallel", value, reason);
            }
            if bucket_bytes == 0 {
                return refuse(
                    "--data-parallel",
                    0,
                    "buckets must hold at least 1 byte".into(),
                );
            }
        }
        let positions = config.max_position_embeddings;
        if self.batch == 0 {
            return refuse("--batch", 0, "must be at least 1".into());
        }
        if kind != ProgramKind::Decode {
            if self.seq == 0 {
                return refuse("--seq", 0, "must be at least 1".into());
            }
            if self.seq > positions {
                return refuse("--seq", self.seq, beyond(config));
            }
        }
        let rows = self.cache_rows(kind, config);
        if let (Some(pool), Some(_)) = (self.pool, rows) {
            if pool < self.batch {
                let reason = format!(
                    "a pool of {pool} slots cannot hold the {} rows of a batch (each row takes \
                     its own slot)",
                    self.batch
                );
                return refuse("--slots", pool, reason);
            }
        }
        if let Some(rows) = rows {
            if rows == 0 {
                return refuse("--max-seq", 0, "must be at least 1".into());
            }
            if rows > positions {
                return refuse("--max-seq", rows, beyond(config));
            }
            if kind == ProgramKind::Prefill && self.seq > rows {
                let reason = format!(
                    "does not fit a cache of --max-seq {rows} rows; pass --max-seq {} or more, or \
                     leave --max-seq out (prefill's cache then holds --seq rows)",
                    self.seq
                );
                return refuse("--seq", self.seq, reason);
            }
        }
        self.check_sizes(kind, config, rows)
    }

    /// The program's largest tensors fit `TensorType`'s limits (checked again, with the dims,
    /// as the graph is built; here the error names the flags).
    fn check_sizes(
        &self,
        kind: ProgramKind,
        config: &ModelConfig,
        rows: Option<usize>,
    ) -> Result<()> {
        let (batch, tokens) = (self.batch, self.tokens_per_row(kind));
        let widest = [
            config.vocab_size,
            config.intermediate_size,
            config.hidden_size,
            config.num_attention_heads.saturating_mul(config.head_dim),
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        let keys = rows.unwrap_or(tokens);
        let (heads, kv_heads) = (config.num_attention_heads, config.num_key_value_heads);
        let mut tensors = vec![
            ("token ids", DType::I64, vec![batch, tokens]),
            ("widest activation", DType::F32, vec![batch, tokens, widest]),
            (
                "attention scores",
                DType::F32,
                vec![batch, heads, tokens, keys],
            ),
        ];
        if let Some(rows) = rows {
            let sequences = self.pool.unwrap_or(batch);
            let cache = vec![sequences, kv_heads, rows, config.head_dim];
            tensors.push(("KV cache of a layer", DType::F32, cache));
        }
        for (what, dtype, dims) in tensors {
            if let Err(error) = TensorType::new(dtype, dims) {
                let flags = match (kind, rows) {
                    (ProgramKind::Decode, Some(rows)) => format!("--max-seq {rows}"),
                    (_, Some(rows)) => format!("--seq {} and --max-seq {rows}", self.seq),
                    (_, None) => format!("--seq {}", self.seq),
                };
                let (flag, value) = match (what, self.pool) {
                    ("KV cache of a layer", Some(pool)) => ("--slots", pool),
                    _ => ("--batch", batch),
                };
                return Err(Error::ProgramOption {
                    flag,
                    value,
                    reason: format!("with {flags}, the program's {what} cannot be built: {error}"),
                });
            }
        }
        Ok(())
    }

    /// Checks that a decode step at `position` (tokens already in the cache) fits the cache.
    pub fn check_position(&self, config: &ModelConfig, position: usize) -> Result<()> {
        let rows = self.cache_rows(ProgramKind::Decode, config).unwrap_or(0);
        let reason = if position >= config.max_position_embeddings {
            beyond(config)
        } else if position >= rows {
            let given = match self.max_seq {
                Some(_) => "",
                None => " (the decode default)",
            };
            format!(
                "does not fit a cache of {rows} rows{given}; pass --max-seq {} or more",
                position + 1
            )
        } else {
            return Ok(());
        };
        Err(Error::ProgramOption {
            flag: "--context",
            value: position,
            reason,
        })
    }
}

/// Why a position is refused: every position must be one of the model's.
fn beyond(config: &ModelConfig) -> String {
    let positions = config.max_position_embeddings;
    format!("beyond the model's {positions} positions (max_position_embeddings)")
}
