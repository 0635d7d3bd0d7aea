//! The eager oracle as an [`Ops`] implementation: every op runs now and records its VJP.

use crate::autograd::Var;
use crate::error::Result;
use crate::model::ops::{Ops, Precision};
use crate::ops;

/// Runs models on the CPU reference kernels with tape autograd.
#[derive(Clone, Copy, Debug, Default)]
pub struct Eager {
    pub precision: Precision,
}

impl Eager {
    /// Every GEMM in f32.
    pub const F32: Eager = Eager {
        precision: Precision::F32,
    };
}

impl Ops for Eager {
    type Value = Var;

    fn dims(&self, x: &Var) -> Vec<usize> {
        x.dims().to_vec()
    }
    fn embedding(&self, weight: &Var, ids: &Var) -> Result<Var> {
        ops::embedding(weight, ids.value())
    }
    fn linear(&self, x: &Var, weight: &Var, bias: Option<&Var>) -> Result<Var> {
        ops::linear(x, weight, bias, self.precision.gemm_dtype())
    }
    // Stored weights and biases of another dtype (bf16 inference) are widened first, as the
    // IR's mixed-dtype ops read them.
    fn rmsnorm(&self, x: &Var, weight: &Var, eps: f64) -> Result<Var> {
        ops::rmsnorm(x, &ops::as_dtype(weight, x.dtype())?, eps)
    }
    fn add_rmsnorm(&self, x: &Var, residual: &Var, weight: &Var, eps: f64) -> Result<(Var, Var)> {
        ops::add_rmsnorm(x, residual, &ops::as_dtype(weight, x.dtype())?, eps)
    }
    fn rope(&self, x: &Var, positions: &Var, bias: Option<&Var>, theta: f64) -> Result<Var> {
        let bias = bias.map(|b| ops::as_dtype(b, x.dtype())).transpose()?;
        ops::rope(x, positions.value(), bias.as_ref(), theta)
    }
    fn heads_first(&self, x: &Var) -> Result<Var> {
        ops::contiguous(&ops::transpose(x, 1, 2)?)
    }
    fn attention(&self, _layer: usize, q: &Var, k: &Var, v: &Var, scale: f64) -> Result<Var> {
        let head_dim = q.dims().last().copied().unwrap_or(0);
        match self.precision.flash_attention(head_dim) {
            Some(rounding) => ops::flash_attention(q, k, v, (scale, rounding)),
            None => ops::attention(q, k, v, scale),
        }
    }
    fn swiglu(&self, gate: &Var, up: &Var) -> Result<Var> {
        // As the tracer: gate and up rounded where the precision keeps them so.
        let rounded = |x: &Var| match self.precision.swiglu_dtype() {
            Some(dtype) => ops::as_dtype(&ops::as_dtype(x, dtype)?, x.dtype()),
            None => Ok(x.clone()),
        };
        ops::swiglu(&rounded(gate)?, &rounded(up)?)
    }
    fn last_position(&self, x: &Var) -> Result<Var> {
        let seq = x.dims().get(1).copied().unwrap_or(0);
        ops::contiguous(&ops::slice(x, 1, seq.saturating_sub(1), seq)?)
    }
    fn reshape(&self, x: &Var, dims: &[usize]) -> Result<Var> {
        ops::reshape(x, dims)
    }
    fn cross_entropy(&self, logits: &Var, targets: &Var, ignore_index: i64) -> Result<Var> {
        ops::cross_entropy(logits, targets.value(), ignore_index)
    }
    fn chunked_loss(
        &self,
        hidden: &Var,
        head: &Var,
        targets: &Var,
        ignore_index: i64,
    ) -> Result<Option<Var>> {
        if !self.precision.chunked_loss() {
            return Ok(None);
        }
        let features = hidden.dims().last().copied().unwrap_or(0);
        let flat = ops::reshape(hidden, [hidden.shape().rows(), features])?;
        let (flat, head) = match self.precision.gemm_dtype() {
            Some(dtype) => (ops::as_dtype(&flat, dtype)?, ops::as_dtype(head, dtype)?),
            None => (flat, head.clone()),
        };
        ops::linear_cross_entropy(&flat, &head, targets.value(), ignore_index).map(Some)
    }
}
