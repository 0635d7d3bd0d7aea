//! The closed set of ops kiln programs are made of, each with a type rule (`op/typing.rs`) and
//! an alias rule (below).
//!
//! Layout conventions (the CPU reference kernels' and the GPU kernels'): activations are
//! row-major; attention takes `q [B,Hq,T,D]`, `k`/`v [B,Hkv,S,D]` and returns `[B,T,Hq,D]`;
//! RoPE turns `[B,T,H,D]` into `[B,H,T,D]`; caches are `[S,Hkv,Smax,D]`, one row per sequence (a pool of slots where the cache ops take `rows`).
//!
//! Stored operands: an op computing in f32 may take its weights, biases and caches in bf16
//! (RMSNorm weights, RoPE and Add biases, KV caches, the embedding table; [`stores`]), read
//! widened and written rounded, as bf16 inference keeps them; mixed precision's rounded
//! gradients are read so too (an added term, the gradients AdamW and SwiGLU's backward take,
//! the LM head's gradient a tied embedding's scatter goes onto: [`Op::stored_operands`]), and
//! an operand an op only reads rounded to bf16 may be given so ([`Op::rounded_on_entry`]).

mod index_range;
pub mod rope_kv;
mod typing;

pub use index_range::{IndexRange, PADDING_SLOT};
pub use typing::{stores, LINEAR_MAX_GROUPS, LINEAR_MAX_ROWS, UNROUNDED_LINEAR_MAX_ROWS};

use std::fmt;

use crate::{DType, Shape};

/// AdamW hyper-parameters (decoupled weight decay, bias correction; torch.optim.AdamW). The
/// learning rate is not one of them: it is a device input of every step (a schedule changes it
/// without rebuilding the program).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl AdamWConfig {
    /// The hyper-parameters as IR attributes.
    fn attributes(&self) -> Vec<(&'static str, String)> {
        let f = |x: f64| format!("{x:?}");
        vec![
            ("beta1", f(self.beta1)),
            ("beta2", f(self.beta2)),
            ("eps", f(self.eps)),
            ("weight_decay", f(self.weight_decay)),
        ]
    }
}

/// The rows of an embedding table an [`Op::EmbeddingAdamW`] updates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbeddingRows {
    /// The rows no id names.
    Unnamed,
    /// The rows some id names.
    Named,
}

impl fmt::Display for EmbeddingRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EmbeddingRows::Unnamed => "unnamed",
            EmbeddingRows::Named => "named",
        })
    }
}

/// An operation. Operands and results are listed per variant as `(operands) -> results`.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `(weight [V,H], ids [...] int) -> [..., H]`.
    Embedding,
    /// `(ids [...] int, grad [..., H][, base [vocab, H]]) -> [vocab, H]`: scatter-add (onto
    /// `base` when `onto`: `Add(EmbeddingBackward, base)` in one op, made by the fusion pass for
    /// a tied embedding, whose gradient is the LM head's plus this one; `base` is a stored
    /// operand).
    EmbeddingBackward { vocab: usize, onto: bool },
    /// `(a, b) -> op(a)·op(b)`; equal ranks >= 2, batched over leading dims; bf16 gives f32.
    MatMul {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// `op`, the f32 results it has a rounded form of ([`Op::rounded_results`]) rounded to
    /// bf16 as they are written: `Cast{bf16}` of those results in one op, made by the fusion
    /// pass (`crate::fuse`), never traced; the f32 ones never exist. Mixed precision makes
    /// these where such a result is read only as a bf16 GEMM input: each gradient of a bf16
    /// GEMM input (`MatMul` of bf16 operands), SwiGLU's result and its backward's gradients,
    /// RMSNorm's normed rows, prefill's attention output; and RoPE's q and k and v made
    /// head-major, which the bf16 FlashAttention reads rounded. bf16 inference makes them
    /// where a linear reads the result: the first norm, the attention's output, and a linear's
    /// SwiGLU result or normed rows (of more than [`UNROUNDED_LINEAR_MAX_ROWS`] rows).
    Rounded(Box<Op>),
    /// `op`, its results as they are, then a bf16 copy of each of those it has a rounded form
    /// of ([`Op::rounded_results`]), rounded as it is written: the op and `Cast{bf16}` of
    /// those results in one, made by the fusion pass, never traced. Mixed precision makes
    /// these where a result is read both as it is and rounded: the backward's gradients out of
    /// the norms and RoPE and v's made token-major, which the residual stream and the bias
    /// gradients read in f32 and the GEMMs rounded; the train step's attention output, which
    /// its backward reads in f32 and the o GEMM rounded.
    AlsoRounded(Box<Op>),
    /// `(a, b) -> a + b`; `b`'s shape is a suffix of `a`'s.
    Add,
    /// `(a, b) -> a ⊙ b`; `b`'s shape is a suffix of `a`'s.
    Mul,
    /// `(a) -> alpha·a`.
    Scale { alpha: f64 },
    /// `(a) -> a` summed over leading dims down to `shape` (a suffix of a's shape).
    SumToShape { shape: Shape },
    /// `(a) -> a` repeated over leading dims up to `shape` (a's shape is a suffix of it).
    BroadcastTo { shape: Shape },
    /// `(a) -> a` converted to `to` (round to nearest even).
    Cast { to: DType },
    /// `(x [...,H], weight [H]) -> [...,H]`.
    RmsNorm { eps: f64 },
    /// `(x, weight, grad) -> (grad_x, grad_weight)`.
    RmsNormBackward { eps: f64 },
    /// `(x, residual, weight) -> (sum, rmsnorm(sum))`.
    AddRmsNorm { eps: f64 },
    /// `(sum, weight, grad_out[, grad_sum]) -> (grad_input, grad_weight)`.
    AddRmsNormBackward { eps: f64 },
    /// `(x [B,T,H,D], positions [B,T] int[, bias [H·D]]) -> [B,H,T,D]`.
    Rope { theta: f64, bias: bool },
    /// `(grad [B,H,T,D], positions [B,T] int) -> [B,T,H,D]`.
    RopeBackward { theta: f64 },
    /// `(q [B,Hq,T,D], k [B,Hkv,S,D], v [B,Hkv,S,D]) -> (out [B,T,Hq,D], probs [B,Hq,T,S])`;
    /// causal, query `t` at absolute position `S−T+t`.
    Attention { scale: f64 },
    /// `(q, k, v, probs, grad_out) -> (grad_q, grad_k, grad_v)`.
    AttentionBackward { scale: f64 },
    /// `(into, a) -> a` cast to `into`'s type (same shape): `Cast` computed in `into`'s storage
    /// when the planner can (a derived copy's update, written in its own slot).
    CastInto,
    /// `(q [B,Hq,T,D], k [B,Hkv,S,D], v [B,Hkv,S,D]) -> (out [B,T,Hq,D], lse [B,Hq,T])` f32:
    /// `Attention`'s math with `q`, `k`, `v` and the probabilities entering their products
    /// as their roundings to `rounding` (f32 accumulation), and no probabilities kept: `lse`
    /// is each query row's log-sum-exp of its scaled scores, all the backward needs to
    /// rebuild them (the FlashAttention contract). `rounding` is bf16 in mixed precision
    /// (training and its prefill), where each of `q`, `k`, `v` is f32 or bf16 (already its
    /// rounding: [`Op::rounded_on_entry`]), and f16 in bf16 inference's prefill (three more
    /// mantissa bits: bf16 scores moved the logits of a tiny model past the golden bound), where
    /// each is f32 or f16 (the staged `RopeKvWrite`'s rows); only the bf16 contract has a
    /// backward.
    FlashAttention { scale: f64, rounding: DType },
    /// `(q, k, v, out, lse, grad_out) -> (grad_q, grad_k, grad_v)` (f32 gradients),
    /// `grad_out` entering its products as its bf16 rounding (f32, or bf16); the gradient of
    /// `FlashAttention` with each rounding taken as the identity (as `Cast`'s is).
    FlashAttentionBackward { scale: f64 },
    /// `(q [B,Hq,T,D], k_cache [S,Hkv,Smax,D], v_cache, positions [B] int[, rows [B] int]) ->
    /// [B,T,Hq,D]`: query `t` of batch row `b` sits at `positions[b] + t` and attends its
    /// cache row's positions up to it. Batch row `b`'s cache row is `b` (`S = B`), or
    /// `rows[b]` of a pool of `S` slots when `rows` is given; a row of slot [`PADDING_SLOT`]
    /// reads none (its output is 0).
    CachedAttention { scale: f64 },
    /// `(cache [S,H,Smax,D], new [B,H,T,D], positions [B] int[, rows [B] int]) -> cache` with
    /// positions `positions[b]..positions[b]+T` of batch row `b`'s cache row (as in
    /// `CachedAttention`) replaced by `new`; other cache rows are untouched. Pooled `rows`
    /// are distinct, but for [`PADDING_SLOT`] rows, which write nothing.
    KvCacheWrite,
    /// An attention's inputs made ready in one op, made by the fusion pass
    /// (`crate::fuse`), never traced: `(q [B,T,Hq,D], k [B,T,Hkv,D], v [B,Hkv,T,D], k_cache
    /// [S,Hkv,Smax,D], v_cache, rope_positions [B,T] int, positions [B] int[, rows [B] int][,
    /// q_bias [Hq·D], k_bias [Hkv·D]]) -> (q_rot [B,Hq,T,D], k_cache, v_cache)`: equal to its
    /// unfused ops `q_rot = Rope(q, rope_positions, q_bias)`, `Rope(k, rope_positions, k_bias)`
    /// written into `k_cache` and `v` into `v_cache` by `KvCacheWrite` at `positions` (and
    /// `rows`); the rotated keys never exist apart from the cache.
    ///
    /// With `staged` (f16: bf16 inference's prefill, ahead of the `FlashAttention` that rounds
    /// to f16), `v` is token-major `[B,T,Hkv,D]` like `k` and the op also gives that
    /// attention's operands: `-> (q_rot, k_cache, v_cache, k_rot, v_rows)`, `q_rot`, `k_rot
    /// [B,Hkv,T,D]` and `v_rows` (`v` made head-major) rounded to `staged` (a `Cast` of each);
    /// the caches get the f32 rotated keys and `v`, as unfused.
    RopeKvWrite {
        theta: f64,
        bias: bool,
        staged: Option<DType>,
    },
    /// `(gate, up) -> silu(gate)·up`.
    SwiGlu,
    /// `(gate, up, grad) -> (grad_gate, grad_up)`; `grad` is a stored operand ([`stores`]):
    /// bf16 where mixed precision rounded it.
    SwiGluBackward,
    /// `(x [...,N]) -> softmax over the last dim`.
    Softmax,
    /// `(y, grad) -> grad_x`.
    SoftmaxBackward,
    /// `(x [..., N] float) -> i64 [...]`: the index of each last-dim row's largest element,
    /// ties to the lowest index; -1 for a row with no largest element (a NaN, all -inf, or
    /// empty): greedy decoding's next token, on the device.
    Argmax,
    /// `(logits [N,V], targets [N] int) -> loss []`: mean over rows not equal to `ignore_index`.
    CrossEntropy { ignore_index: i64 },
    /// `(logits, targets, grad_loss []) -> grad_logits`.
    CrossEntropyBackward { ignore_index: i64 },
    /// `(x [N,H], weight [V,H], targets [N] int) -> (loss [], lse [N])` (f32 results): the LM
    /// head and `CrossEntropy` in one, `x` and `weight` both f32 or both bf16 (mixed
    /// precision: products of the bf16 values, accumulated in f32). The logits `x·weightᵀ`
    /// never exist whole: they are computed in vocabulary chunks
    /// (`kiln_kernels::loss::chunked`); `lse` is each row's log-sum-exp, all the backward
    /// needs to rebuild the probabilities.
    LinearCrossEntropy { ignore_index: i64 },
    /// `(x, weight, targets, lse, grad_loss []) -> (grad_x, grad_weight)` of `x`'s and
    /// `weight`'s types; the chunk's logit gradient enters its products rounded to their dtype.
    LinearCrossEntropyBackward { ignore_index: i64 },
    /// `(x, weight, targets, grad_loss []) -> (loss [], grad_x, grad_weight)`:
    /// `LinearCrossEntropy` and its backward in one, where `grad_loss` is known before the loss
    /// (the train step's seed): each row's gradient is made as soon as its logits are, so the
    /// logits are computed once, not twice, and `lse` never exists. Made by the fusion pass
    /// for bf16 `x` and `weight`. Its CPU reference runs the two ops' (the same bits); the GPU
    /// kernels go over chunks of whole rows, so their sums take another order.
    LinearCrossEntropyGrad { ignore_index: i64 },
    /// `(param, grad, m, v, step [] i64, lr [] f64[, grad_scale [] f32]) -> (param, m, v)`
    /// updated, from `grad · grad_scale` when the scale is given (gradient clipping). The
    /// gradient is a stored operand ([`stores`]): bf16 for an f32 param where the fusion pass
    /// folds mixed precision's `Cast{f32}` of a rounded gradient into the update.
    AdamW(AdamWConfig),
    /// `(param, grad, m, v, copy, step, lr[, grad_scale]) -> (param, m, v, copy)`: `AdamW`
    /// that also writes the updated param's bf16 rounding into `copy` (mixed precision's
    /// persistent bf16 weight, its `CastInto` folded in by the fusion pass; never traced): one
    /// pass over the param instead of two.
    AdamWCopy(AdamWConfig),
    /// `(param [V,H], m, v[, copy], step, lr, ids [...] int[, grad [..., H]][, base [V,H]]) ->
    /// (param, m, v[, copy])`: `AdamW` (or `AdamWCopy` with `copy`) of some `rows` of an
    /// embedding table from the gradient `EmbeddingBackward { onto }` of `ids` and `grad` (onto
    /// `base`, a stored operand), which never exists; the other rows pass through unchanged.
    /// The rows no id names take `0 + base` (or 0) and need no `grad`; each named row takes the
    /// scatter's sum plus its base row, in the scatter's order. Made by the fusion pass, the
    /// unnamed rows' update then the named rows' on its results, where the scatter is read by
    /// the update alone: the unnamed rows, most of the table, need only the base, which a tied
    /// table's LM head gives at the backward's start. Never traced.
    EmbeddingAdamW {
        config: AdamWConfig,
        onto: bool,
        copy: bool,
        rows: EmbeddingRows,
    },
    /// `(grad_0, …, grad_n) -> (norm [] f32, scale [] f32)`: the global 2-norm of every
    /// gradient, and `min(1, max_norm / (norm + 1e-6))`, the factor
    /// `torch.nn.utils.clip_grad_norm_` multiplies them by.
    ClipGradNorm { max_norm: f64 },
    /// `(x_0, …, x_{n-1}) f32 -> (y_0, …, y_{n-1})`, each `y_i` the sum of `x_i` over every
    /// rank of the communicator the program runs in (NCCL's `ncclAllReduce` with `ncclSum`),
    /// written where `x_i` is: the gradients of a data-parallel step (one op per bucket, as
    /// DDP buckets them), a tensor-parallel layer's partial outputs. Its own inverse has no
    /// meaning here: the op has no gradient rule. In a world of one rank it is the identity.
    AllReduce,
    /// `(a) -> a` viewed as `shape` (same element count, contiguous input).
    Reshape { shape: Shape },
    /// `(a) -> a` with two dims swapped (a strided view).
    Transpose { dim0: usize, dim1: usize },
    /// `(a) -> a[.., start..end, ..]` along `axis` (a strided view).
    Slice {
        axis: usize,
        start: usize,
        end: usize,
    },
    /// `(a) -> a` materialized row-major.
    Contiguous,
    /// A fused linear layer, made by the fusion pass (`crate::fuse`), never traced:
    /// `(x [M,K], w_0 [N_0,K], …, w_{G-1} [N_{G-1},K], then bias_g [N_g] for each g with
    /// biases[g]) -> y_g = bf16(x)·w_gᵀ (+ bias_g) [M,N_g] f32, one per group`, or with
    /// `swiglu` (G = 2, N_0 = N_1) the one result `silu(y_0)·y_1`. Weights are bf16; x is f32
    /// (rounded to bf16 first: the folded Cast) or bf16; biases are stored operands. Equal to
    /// its unfused ops: Cast, MatMul with transpose_b, Add, SwiGlu. With `add_rmsnorm:
    /// Some(eps)` (one group, no SwiGLU), two more operands `residual [..., N]` (`M` rows, f32)
    /// and `norm_weight [N]` (stored), and the results `(sum, rmsnorm(sum))` of residual's
    /// shape: `AddRmsNorm{eps}` of `y` viewed as residual's shape (the residual add and the
    /// next norm in the linear's epilogue). With `rope_kv: Some(theta)` (three groups q, k, v,
    /// no SwiGLU, no norm), operands `k_cache, v_cache, rope_positions [B,T], positions [B][,
    /// rows [B]]` follow the biases and the results are `RopeKvWrite{theta}`'s `(q_rot
    /// [B,Hq,T,D], k_cache, v_cache)` on `y_0, y_1` viewed as `[B,T,H,D]` and `y_2` as
    /// `[B,Hkv,T,D]` (`M = B·T` rows; D the caches' head size): the decode step's projection,
    /// RoPE and cache append in one op ([`rope_kv::LinearRopeKv`] names its ports). The weights
    /// are params the program does not write (the verifier checks it): the kernels read them
    /// early.
    Linear {
        biases: Vec<bool>,
        swiglu: bool,
        add_rmsnorm: Option<f64>,
        rope_kv: Option<f64>,
    },
}

/// How an op's result relates to its operands' storage (what the planner may do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alias {
    /// A new buffer.
    Fresh,
    /// A view of operand `i`: shares its buffer, writes nothing.
    ViewOf(usize),
    /// May be written into operand `i`'s buffer when that operand dies here.
    MayOverwrite(usize),
}

impl Op {
    /// The op's name in IR text.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embedding => "embedding",
            Op::EmbeddingBackward { .. } => "embedding_backward",
            Op::MatMul { .. } => "matmul",
            Op::Rounded(op) => match **op {
                Op::MatMul { .. } => "rounded_matmul",
                Op::SwiGlu => "rounded_swiglu",
                Op::SwiGluBackward => "rounded_swiglu_backward",
                Op::RmsNorm { .. } => "rounded_rmsnorm",
                Op::AddRmsNorm { .. } => "rounded_add_rmsnorm",
                Op::Rope { .. } => "rounded_rope",
                Op::Contiguous => "rounded_contiguous",
                Op::RopeBackward { .. } => "rounded_rope_backward",
                Op::RmsNormBackward { .. } => "rounded_rmsnorm_backward",
                Op::AddRmsNormBackward { .. } => "rounded_add_rmsnorm_backward",
                Op::FlashAttention { .. } => "rounded_flash_attention",
                Op::Linear { .. } => "rounded_linear",
                _ => "rounded",
            },
            Op::AlsoRounded(op) => match **op {
                Op::RmsNormBackward { .. } => "also_rounded_rmsnorm_backward",
                Op::AddRmsNormBackward { .. } => "also_rounded_add_rmsnorm_backward",
                Op::RopeBackward { .. } => "also_rounded_rope_backward",
                Op::Contiguous => "also_rounded_contiguous",
                Op::FlashAttention { .. } => "also_rounded_flash_attention",
                _ => "also_rounded",
            },
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale { .. } => "scale",
            Op::SumToShape { .. } => "sum_to_shape",
            Op::BroadcastTo { .. } => "broadcast_to",
            Op::Cast { .. } => "cast",
            Op::CastInto => "cast_into",
            Op::RmsNorm { .. } => "rmsnorm",
            Op::RmsNormBackward { .. } => "rmsnorm_backward",
            Op::AddRmsNorm { .. } => "add_rmsnorm",
            Op::AddRmsNormBackward { .. } => "add_rmsnorm_backward",
            Op::Rope { .. } => "rope",
            Op::RopeBackward { .. } => "rope_backward",
            Op::Attention { .. } => "attention",
            Op::AttentionBackward { .. } => "attention_backward",
            Op::FlashAttention { .. } => "flash_attention",
            Op::FlashAttentionBackward { .. } => "flash_attention_backward",
            Op::CachedAttention { .. } => "cached_attention",
            Op::KvCacheWrite => "kv_cache_write",
            Op::RopeKvWrite { .. } => "rope_kv_write",
            Op::SwiGlu => "swiglu",
            Op::SwiGluBackward => "swiglu_backward",
            Op::Softmax => "softmax",
            Op::SoftmaxBackward => "softmax_backward",
            Op::Argmax => "argmax",
            Op::CrossEntropy { .. } => "cross_entropy",
            Op::CrossEntropyBackward { .. } => "cross_entropy_backward",
            Op::LinearCrossEntropy { .. } => "linear_cross_entropy",
            Op::LinearCrossEntropyBackward { .. } => "linear_cross_entropy_backward",
            Op::LinearCrossEntropyGrad { .. } => "linear_cross_entropy_grad",
            Op::AdamW(_) => "adamw",
            Op::AdamWCopy(_) => "adamw_copy",
            Op::EmbeddingAdamW { .. } => "embedding_adamw",
            Op::ClipGradNorm { .. } => "clip_grad_norm",
            Op::AllReduce => "all_reduce",
            Op::Reshape { .. } => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Slice { .. } => "slice",
            Op::Contiguous => "contiguous",
            Op::Linear { .. } => "linear",
        }
    }

    /// Attributes as `key=value` pairs in a fixed order (IR text and hashing). Floats print in
    /// Rust's shortest round-trip form, so the text is exact and stable.
    pub fn attributes(&self) -> Vec<(&'static str, String)> {
        let f = |x: &f64| format!("{x:?}");
        match self {
            Op::EmbeddingBackward { vocab, onto } => {
                vec![("vocab", vocab.to_string()), ("onto", onto.to_string())]
            }
            // The name says which op is rounded (an op with no rounded form, which the type
            // rule rejects, is printed whole).
            Op::Rounded(op) if self.name() == "rounded" => vec![("op", op.to_string())],
            Op::AlsoRounded(op) if self.name() == "also_rounded" => {
                vec![("op", op.to_string())]
            }
            Op::Rounded(op) | Op::AlsoRounded(op) => op.attributes(),
            Op::MatMul {
                transpose_a,
                transpose_b,
            } => vec![
                ("transpose_a", transpose_a.to_string()),
                ("transpose_b", transpose_b.to_string()),
            ],
            Op::Scale { alpha } => vec![("alpha", f(alpha))],
            Op::SumToShape { shape } | Op::BroadcastTo { shape } | Op::Reshape { shape } => {
                vec![("shape", shape.to_string())]
            }
            Op::Cast { to } => vec![("to", to.to_string())],
            Op::RmsNorm { eps }
            | Op::RmsNormBackward { eps }
            | Op::AddRmsNorm { eps }
            | Op::AddRmsNormBackward { eps } => vec![("eps", f(eps))],
            Op::Rope { theta, bias } => vec![("theta", f(theta)), ("bias", bias.to_string())],
            Op::RopeKvWrite {
                theta,
                bias,
                staged,
            } => {
                let mut attributes = vec![("theta", f(theta)), ("bias", bias.to_string())];
                attributes.extend(staged.map(|dtype| ("staged", dtype.to_string())));
                attributes
            }
            Op::RopeBackward { theta } => vec![("theta", f(theta))],
            Op::FlashAttention { scale, rounding } => {
                vec![("scale", f(scale)), ("rounding", rounding.to_string())]
            }
            Op::Attention { scale }
            | Op::AttentionBackward { scale }
            | Op::FlashAttentionBackward { scale }
            | Op::CachedAttention { scale } => vec![("scale", f(scale))],
            Op::CrossEntropy { ignore_index }
            | Op::CrossEntropyBackward { ignore_index }
            | Op::LinearCrossEntropy { ignore_index }
            | Op::LinearCrossEntropyBackward { ignore_index }
            | Op::LinearCrossEntropyGrad { ignore_index } => {
                vec![("ignore_index", ignore_index.to_string())]
            }
            Op::ClipGradNorm { max_norm } => vec![("max_norm", f(max_norm))],
            Op::AdamW(c) | Op::AdamWCopy(c) => c.attributes(),
            Op::EmbeddingAdamW {
                config,
                onto,
                copy,
                rows,
            } => {
                let mut attributes = config.attributes();
                attributes.push(("onto", onto.to_string()));
                attributes.push(("copy", copy.to_string()));
                attributes.push(("rows", rows.to_string()));
                attributes
            }
            Op::Transpose { dim0, dim1 } => {
                vec![("dim0", dim0.to_string()), ("dim1", dim1.to_string())]
            }
            Op::Slice { axis, start, end } => vec![
                ("axis", axis.to_string()),
                ("start", start.to_string()),
                ("end", end.to_string()),
            ],
            Op::Linear {
                biases,
                swiglu,
                add_rmsnorm,
                rope_kv,
            } => {
                let biases: Vec<String> = biases.iter().map(bool::to_string).collect();
                let mut attributes = vec![
                    ("biases", format!("[{}]", biases.join(","))),
                    ("swiglu", swiglu.to_string()),
                ];
                // Printed only when fused, so plain linears read as before.
                attributes.extend(add_rmsnorm.map(|eps| ("add_rmsnorm_eps", f(&eps))));
                attributes.extend(rope_kv.map(|theta| ("rope_kv_theta", f(&theta))));
                attributes
            }
            Op::Embedding
            | Op::Add
            | Op::Mul
            | Op::KvCacheWrite
            | Op::CastInto
            | Op::SwiGlu
            | Op::SwiGluBackward
            | Op::Softmax
            | Op::SoftmaxBackward
            | Op::Argmax
            | Op::AllReduce
            | Op::Contiguous => vec![],
        }
    }

    /// The operands an op computing in f32 may take stored in bf16 ([`stores`]), widened
    /// exactly where read: weights, biases, caches, the terms of a sum, the gradients AdamW and
    /// SwiGLU's backward take, SwiGLU's gate and up (rounded products), the table an
    /// embedding's scatter goes onto, and the operands an op only reads rounded to bf16
    /// ([`Op::rounded_on_entry`]) but a linear's `x`, which its type rule takes in bf16 as it
    /// is (its GEMM's input).
    pub fn stored_operands(&self) -> &'static [usize] {
        match self {
            Op::Add => &[0, 1],
            Op::FlashAttention {
                rounding: DType::BF16,
                ..
            } => &[0, 1, 2],
            Op::FlashAttentionBackward { .. } => &[0, 1, 2, 5],
            Op::RmsNorm { .. } | Op::AdamW(_) | Op::AdamWCopy(_) => &[1],
            // The base, last.
            Op::EmbeddingAdamW { copy, rows, .. } => match (copy, rows) {
                (false, EmbeddingRows::Unnamed) => &[6],
                (true, EmbeddingRows::Unnamed) | (false, EmbeddingRows::Named) => &[7],
                (true, EmbeddingRows::Named) => &[8],
            },
            Op::SwiGlu => &[0, 1],
            Op::SwiGluBackward => &[0, 1, 2],
            Op::AddRmsNorm { .. } | Op::Rope { .. } | Op::EmbeddingBackward { .. } => &[2],
            Op::Rounded(op) | Op::AlsoRounded(op) => op.stored_operands(),
            Op::CachedAttention { .. } => &[1, 2],
            _ => &[],
        }
    }

    /// The operands an op reads only as their bf16 rounding (q, k, v of the bf16
    /// FlashAttention and its backward's `grad_out`, rounded where they enter the tensor
    /// cores; the f16 one rounds them otherwise; a linear's `x`, its GEMM's input): a bf16
    /// operand there is already that rounding, so a producer whose f32 result only such ports
    /// read may write it rounded (the fusion pass's `rounded` rule) and the op gives the same
    /// bits.
    pub fn rounded_on_entry(&self) -> &'static [usize] {
        match self {
            Op::FlashAttention {
                rounding: DType::BF16,
                ..
            } => &[0, 1, 2],
            Op::FlashAttentionBackward { .. } => &[0, 1, 2, 5],
            Op::Linear { .. } => &[0],
            Op::Rounded(op) | Op::AlsoRounded(op) => op.rounded_on_entry(),
            _ => &[],
        }
    }

    /// The operand whose dtype the op computes in ([`Op::compute_dtype`]: f32 where that
    /// operand is itself stored in bf16), the dtype its stored operands are widened to: the
    /// first; a scatter's (`EmbeddingBackward`) gradient.
    pub fn compute_operand(&self) -> usize {
        match self {
            Op::EmbeddingBackward { .. } => 1,
            Op::Rounded(op) | Op::AlsoRounded(op) => op.compute_operand(),
            _ => 0,
        }
    }

    /// The dtype the op computes in and its stored operands are widened to, for operands of
    /// `dtypes`: its compute operand's ([`Op::compute_operand`]), or f32 where that operand is
    /// itself a stored one held in bf16 (SwiGLU of rounded gate and up products computes in
    /// f32, as a product of bf16 operands gives f32). `None` without that operand.
    pub fn compute_dtype(&self, dtypes: &[DType]) -> Option<DType> {
        let port = self.compute_operand();
        let dtype = *dtypes.get(port)?;
        let widened = dtype == DType::BF16 && self.stored_operands().contains(&port);
        Some(if widened { DType::F32 } else { dtype })
    }

    /// The results `Op::Rounded` writes rounded to bf16 (f32 ones its kernels can write
    /// rounded; the others are written as the op writes them): a `MatMul`'s product (of bf16
    /// operands), SwiGLU's result and both gradients of its backward, RMSNorm's normed rows
    /// (not the sum an `AddRmsNorm` also gives, which the residual stream reads), RoPE's
    /// rotated rows and a `Contiguous` copy (read only where they are rounded on entry:
    /// FlashAttention's q, k and head-major v), the input gradients of the norms and RoPE
    /// (the GEMMs' gradient inputs), FlashAttention's output (the o GEMM's input), a linear's
    /// SwiGLU result and the normed rows of its add + RMSNorm (the next linear's input: of more
    /// than [`UNROUNDED_LINEAR_MAX_ROWS`] rows, the type rule's condition); none of any other
    /// op.
    pub fn rounded_results(&self) -> &'static [usize] {
        match self {
            Op::MatMul { .. }
            | Op::SwiGlu
            | Op::RmsNorm { .. }
            | Op::Rope { .. }
            | Op::Contiguous
            | Op::RmsNormBackward { .. }
            | Op::AddRmsNormBackward { .. }
            | Op::RopeBackward { .. }
            | Op::FlashAttention { .. }
            | Op::Linear { swiglu: true, .. } => &[0],
            Op::SwiGluBackward => &[0, 1],
            Op::AddRmsNorm { .. }
            | Op::Linear {
                add_rmsnorm: Some(_),
                ..
            } => &[1],
            _ => &[],
        }
    }

    /// Whether `Op::Rounded` and `Op::AlsoRounded` take this op: one with results it can
    /// write rounded.
    pub fn roundable(&self) -> bool {
        !self.rounded_results().is_empty()
    }

    /// Whether `Op::AlsoRounded` takes this op: its kernels write a rounded copy of its
    /// rounded results beside the f32 ones (the input gradients of the norms and RoPE, v's
    /// made token-major again, and FlashAttention's output, which its backward reads in f32).
    pub fn also_roundable(&self) -> bool {
        matches!(
            self,
            Op::RmsNormBackward { .. }
                | Op::AddRmsNormBackward { .. }
                | Op::RopeBackward { .. }
                | Op::Contiguous
                | Op::FlashAttention { .. }
        )
    }

    /// The op a `Rounded` or `AlsoRounded` op rounds; any other op itself.
    pub fn unrounded(&self) -> &Op {
        match self {
            Op::Rounded(op) | Op::AlsoRounded(op) => op,
            op => op,
        }
    }

    /// An update's hyper-parameters and the port of its `step` operand (`AdamW` 4, 5 where it
    /// writes a copy too; `EmbeddingAdamW` 3, or 4): `None` for every other op.
    pub fn adamw(&self) -> Option<(&AdamWConfig, usize)> {
        match self {
            Op::AdamW(c) => Some((c, 4)),
            Op::AdamWCopy(c) => Some((c, 5)),
            Op::EmbeddingAdamW { config, copy, .. } => Some((config, 3 + usize::from(*copy))),
            _ => None,
        }
    }

    /// `EmbeddingAdamW`'s ports of `ids`, `grad` (the named rows' update) and `base` (onto
    /// one), after its state, `step` and `lr`: `None` for every other op.
    pub fn embedding_update_ports(&self) -> Option<(usize, Option<usize>, Option<usize>)> {
        let &Op::EmbeddingAdamW {
            onto, copy, rows, ..
        } = self
        else {
            return None;
        };
        let ids = 5 + usize::from(copy);
        let grad = (rows == EmbeddingRows::Named).then_some(ids + 1);
        let base = onto.then_some(grad.unwrap_or(ids) + 1);
        Some((ids, grad, base))
    }

    /// The alias rule of result `output`.
    pub fn alias(&self, output: usize) -> Alias {
        match (self, output) {
            (Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. }, _) => Alias::ViewOf(0),
            // Elementwise results may take over their first operand's buffer.
            (Op::Add | Op::Mul | Op::Scale { .. } | Op::SwiGlu, _) => Alias::MayOverwrite(0),
            (Op::KvCacheWrite | Op::CastInto, _) => Alias::MayOverwrite(0),
            // Summed where each operand is (NCCL in place).
            (Op::AllReduce, i) => Alias::MayOverwrite(i),
            // param, m, v are updated where they are.
            (Op::AdamW(_) | Op::AdamWCopy(_), 0) => Alias::MayOverwrite(0),
            (Op::AdamW(_) | Op::AdamWCopy(_), 1) => Alias::MayOverwrite(2),
            (Op::AdamW(_) | Op::AdamWCopy(_), 2) => Alias::MayOverwrite(3),
            (Op::AdamWCopy(_), 3) => Alias::MayOverwrite(4),
            (Op::EmbeddingAdamW { .. }, i) => Alias::MayOverwrite(i),
            // The caches are written where they are.
            (Op::RopeKvWrite { .. }, 1) => Alias::MayOverwrite(3),
            (Op::RopeKvWrite { .. }, 2) => Alias::MayOverwrite(4),
            (
                Op::Linear {
                    biases,
                    rope_kv: Some(_),
                    ..
                },
                1 | 2,
            ) => Alias::MayOverwrite(rope_kv::LinearRopeKv::of(biases).k_cache + output - 1),
            _ => Alias::Fresh,
        }
    }
}

/// The op's name from its IR text ([`Op`]'s `Display`): what comes before its attributes.
pub fn name_of_text(text: &str) -> &str {
    text.split_once('{').map_or(text, |(name, _)| name)
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())?;
        let attributes = self.attributes();
        if !attributes.is_empty() {
            f.write_str("{")?;
            for (i, (key, value)) in attributes.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{key}={value}")?;
            }
            f.write_str("}")?;
        }
        Ok(())
    }
}
