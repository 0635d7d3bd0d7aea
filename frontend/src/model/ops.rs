//! The ops a model is written against. The same model code runs on the eager oracle today and
//! will drive the IR tracer: one Transformer, never two hand-kept copies.

use kiln_ir::DType;

use crate::error::Result;

/// Numerics of a model run: the dtype of its weights and caches and of its GEMM inputs.
/// Activations, reductions and GEMM accumulation are f32 in every precision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// Every GEMM in the activations' dtype (f32 for models, f64 in gradient checks).
    #[default]
    F32,
    /// Mixed precision: GEMM inputs rounded to bf16, f32 accumulation, f32 master weights.
    Bf16Gemm,
    /// Mixed precision as `Bf16Gemm`, with the MLP's gate and up products rounded to bf16 as
    /// they are written (as autocast keeps a GEMM's result): SwiGLU and its backward read them
    /// widened, and the train step saves half the bytes for them.
    Bf16Swiglu,
    /// Inference in bf16: weights and KV caches stored in bf16 as a bf16 checkpoint holds them
    /// (no f32 copy), activations rounded to bf16 where they enter a GEMM, prefill's attention
    /// under the FlashAttention contract rounding to f16, everything else computed in f32
    /// (norms, RoPE, decode's attention, logits). Not for training.
    Bf16,
}

impl Precision {
    /// The dtype GEMM inputs are rounded to, if any.
    pub fn gemm_dtype(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16Gemm | Precision::Bf16Swiglu | Precision::Bf16 => Some(DType::BF16),
        }
    }

    /// Mixed precision: f32 master weights, bf16 GEMM inputs (`Bf16Gemm`, `Bf16Swiglu`).
    pub fn mixed(self) -> bool {
        matches!(self, Precision::Bf16Gemm | Precision::Bf16Swiglu)
    }

    /// The dtype SwiGLU's gate and up are rounded to before it reads them, if any.
    pub fn swiglu_dtype(self) -> Option<DType> {
        (self == Precision::Bf16Swiglu).then_some(DType::BF16)
    }

    /// The dtype attention over a call's own keys with heads of `head_dim` rounds to under
    /// the FlashAttention contract (q, k, v and the probabilities rounded inside, the
    /// log-sum-exp kept instead of the probabilities), if it runs under it: bf16 in mixed
    /// precision, whose GEMM inputs are bf16 roundings anyway; f16 in bf16 inference (its
    /// prefill), whose bf16 scores failed the golden bound and f16's keep it (tests/golden.rs,
    /// BENCHMARKS.md); for heads the device kernels take. Attention over a KV
    /// cache, f32 runs and wider heads keep f32 attention.
    pub fn flash_attention(self, head_dim: usize) -> Option<DType> {
        let rounding = match self {
            Precision::Bf16Gemm | Precision::Bf16Swiglu => DType::BF16,
            Precision::Bf16 => DType::F16,
            Precision::F32 => return None,
        };
        (head_dim <= kiln_kernels::attention::flash::MAX_HEAD_DIM).then_some(rounding)
    }

    /// Whether the causal-LM loss takes the LM head with it in one op over vocabulary chunks
    /// (`linear_cross_entropy`), so the logits `[B·T,V]` and their gradient never exist
    /// whole: mixed precision, where they are the largest activations of a train step.
    pub fn chunked_loss(self) -> bool {
        self.mixed()
    }

    /// The dtype parameters and KV caches are stored in.
    pub fn weight_dtype(self) -> DType {
        match self {
            Precision::F32 | Precision::Bf16Gemm | Precision::Bf16Swiglu => DType::F32,
            Precision::Bf16 => DType::BF16,
        }
    }

    /// Every precision, in `--precision`'s order.
    pub const ALL: [Precision; 4] = [
        Precision::F32,
        Precision::Bf16Gemm,
        Precision::Bf16Swiglu,
        Precision::Bf16,
    ];

    /// The name of `--precision`'s value.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16Gemm => "bf16-gemm",
            Precision::Bf16Swiglu => "bf16-swiglu",
            Precision::Bf16 => "bf16",
        }
    }
}

/// Operations a decoder-only Transformer needs, over some value type (an eager `Var`, or a
/// traced IR value). Integer inputs (token ids, positions, targets) are values too.
pub trait Ops {
    type Value: Clone;

    /// Dimensions of a value.
    fn dims(&self, x: &Self::Value) -> Vec<usize>;
    /// Rows of `weight [V,H]` picked by `ids [...]` → `[..., H]`.
    fn embedding(&self, weight: &Self::Value, ids: &Self::Value) -> Result<Self::Value>;
    /// `x · weightᵀ (+ bias)` with `weight [out, in]` as Hugging Face stores it.
    fn linear(
        &self,
        x: &Self::Value,
        weight: &Self::Value,
        bias: Option<&Self::Value>,
    ) -> Result<Self::Value>;
    /// RMSNorm over the last dim.
    fn rmsnorm(&self, x: &Self::Value, weight: &Self::Value, eps: f64) -> Result<Self::Value>;
    /// `(x + residual, rmsnorm(x + residual))`.
    fn add_rmsnorm(
        &self,
        x: &Self::Value,
        residual: &Self::Value,
        weight: &Self::Value,
        eps: f64,
    ) -> Result<(Self::Value, Self::Value)>;
    /// Rotary embedding of `x [B,T,H,D]` (+ bias) at `positions [B,T]` → `[B,H,T,D]`.
    fn rope(
        &self,
        x: &Self::Value,
        positions: &Self::Value,
        bias: Option<&Self::Value>,
        theta: f64,
    ) -> Result<Self::Value>;
    /// `[B,T,H,D]` → `[B,H,T,D]`, materialized.
    fn heads_first(&self, x: &Self::Value) -> Result<Self::Value>;
    /// Causal GQA attention of decoder layer `layer`: `q [B,Hq,T,D]`, `k`, `v [B,Hkv,T,D]` →
    /// `[B,T,Hq,D]`. An implementation may keep `k`/`v` in a per-layer KV cache and attend
    /// over it (prefill and decode programs); the model code is the same.
    fn attention(
        &self,
        layer: usize,
        q: &Self::Value,
        k: &Self::Value,
        v: &Self::Value,
        scale: f64,
    ) -> Result<Self::Value>;
    /// `silu(gate) · up`.
    fn swiglu(&self, gate: &Self::Value, up: &Self::Value) -> Result<Self::Value>;
    /// `x [B,T,...]` → `[B,1,...]`: the last position, materialized.
    fn last_position(&self, x: &Self::Value) -> Result<Self::Value>;
    /// Zero-copy reshape.
    fn reshape(&self, x: &Self::Value, dims: &[usize]) -> Result<Self::Value>;
    /// Mean cross-entropy of `logits [N,V]` against `targets [N]`, skipping `ignore_index`.
    fn cross_entropy(
        &self,
        logits: &Self::Value,
        targets: &Self::Value,
        ignore_index: i64,
    ) -> Result<Self::Value>;
    /// The mean cross-entropy of the logits `hidden [..., H] · headᵀ` against `targets`, the
    /// head and the loss in one op over vocabulary chunks, where the precision asks for it
    /// ([`Precision::chunked_loss`]); `None` where the caller takes `cross_entropy` of the
    /// logits.
    fn chunked_loss(
        &self,
        _hidden: &Self::Value,
        _head: &Self::Value,
        _targets: &Self::Value,
        _ignore_index: i64,
    ) -> Result<Option<Self::Value>> {
        Ok(None)
    }
    /// `x` summed over the ranks of a tensor-parallel group: the partial outputs of a
    /// row-parallel projection (o_proj, down_proj) made whole ([`ModelConfig::shard`]
    /// (crate::model::ModelConfig::shard)). The identity where the model runs whole: the
    /// default, and the eager oracle's.
    fn reduce_partial(&self, x: &Self::Value) -> Result<Self::Value> {
        Ok(x.clone())
    }
    /// Marks `x` as the value called `name` (`layers.0.attn.out`): a point a user may trace.
    /// Computes nothing; the tracer records the name in the graph, the eager engine ignores it
    /// unless it is probed (`crate::value_trace`).
    fn name_value(&self, _name: &str, _x: &Self::Value) -> Result<()> {
        Ok(())
    }
}
