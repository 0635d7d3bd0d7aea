//! AdamW (decoupled weight decay, bias-corrected moments), step for step as
//! `torch.optim.AdamW(foreach=False)` computes it.
//!
//! One call is one optimizer step for one parameter tensor. With `step` counted from 1 and
//! `g = grad` (or `grad · grad_scale`, rounded, when clipping gives a scale), every element is updated in torch's order:
//!
//! ```text
//! param  *= 1 − lr·weight_decay                     (decoupled decay, before the moments)
//! m       = lerp(m, g, 1 − β1)                       (torch's lerp, see below)
//! v       = v·β2 + ((1 − β2)·g)·g                    (torch's mul_ then addcmul_)
//! bc1     = 1 − β1^step,   bc2 = 1 − β2^step
//! denom   = sqrt(v) / sqrt(bc2) + eps
//! param  −= (lr / bc1) · m / denom
//! ```
//!
//! As in torch, the scalars (`1 − lr·wd`, `1 − β1`, `β2`, `1 − β2`, `lr / bc1`, `sqrt(bc2)`,
//! `eps`) are computed in f64, as Python computes them, and then rounded to the tensors' dtype,
//! as torch's kernels round a Python scalar. torch's `lerp(start, end, w)` is
//! `start + w·(end − start)` when `|w| < 0.5` (the usual case, β1 > 0.5) and
//! `end − (end − start)·(1 − w)` otherwise; both are kept so that small β1 match too.
//!
//! Layouts and invariants: `param`, `grad`, `m` (first moment, `exp_avg`) and `v` (second
//! moment, `exp_avg_sq`) are contiguous, of one shape and one dtype (f32 or f64); `m` and `v`
//! start as zeros at step 1 and are owned by the caller between steps. `step >= 1`; `eps` and
//! `weight_decay` are finite and >= 0; `beta1`, `beta2` lie in `[0, 1)`. The rate is data (a
//! device input of the train program): a NaN or infinite rate gives non-finite parameters, on
//! the CPU as on the GPU, and callers check theirs (`kiln train --lr`).

use half::bf16;
use kiln_ir::EmbeddingRows;

use crate::dispatch_real;
use crate::element::{Element, Real};
use crate::error::{expect_shape, Error, Result};
use crate::indices::Indices;
use crate::view::{TensorView, TensorViewMut};

/// Hyperparameters of AdamW; `Default` is torch's defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

impl Default for AdamW {
    /// `lr = 1e-3`, `betas = (0.9, 0.999)`, `eps = 1e-8`, `weight_decay = 1e-2`, as torch.
    fn default() -> Self {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 1e-2,
        }
    }
}

fn invalid(op: &'static str, argument: &'static str, reason: String) -> Error {
    Error::Argument {
        op,
        argument,
        reason,
    }
}

impl AdamW {
    /// Rejects hyperparameters torch rejects, and non-finite ones.
    fn validate(&self, op: &'static str) -> Result<()> {
        let non_negative = [("eps", self.eps), ("weight_decay", self.weight_decay)];
        for (argument, value) in non_negative {
            if !(value.is_finite() && value >= 0.0) {
                let reason = format!("must be finite and >= 0, got {value}");
                return Err(invalid(op, argument, reason));
            }
        }
        for (argument, value) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&value) {
                return Err(invalid(
                    op,
                    argument,
                    format!("must be in [0, 1), got {value}"),
                ));
            }
        }
        Ok(())
    }

    /// [`validate`](Self::validate), and a step counted from 1.
    fn validate_step(&self, op: &'static str, step: u64) -> Result<()> {
        self.validate(op)?;
        match step {
            0 => Err(invalid(
                op,
                "step",
                "steps are counted from 1, got 0".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// torch's `lerp` for a scalar weight: the formula depends on the weight's size, which decides
/// the rounding.
fn torch_lerp<T: Real>(start: T, end: T, weight: T) -> T {
    if weight.abs() < T::of(0.5) {
        start + weight * (end - start)
    } else {
        end - (end - start) * (T::one() - weight)
    }
}

/// One step's scalars: computed in f64 as Python computes them, then rounded to the tensors'
/// dtype, as torch's kernels round a Python scalar.
struct Step<T> {
    decay: T,
    m_weight: T,
    beta2: T,
    v_weight: T,
    step_size: T,
    bias_correction2_sqrt: T,
    eps: T,
}

impl<T: Real> Step<T> {
    fn new(step: u64, config: &AdamW) -> Self {
        let step = step as f64;
        let bias_correction1 = 1.0 - config.beta1.powf(step);
        let bias_correction2 = 1.0 - config.beta2.powf(step);
        Step {
            decay: T::of(1.0 - config.lr * config.weight_decay),
            m_weight: T::of(1.0 - config.beta1),
            beta2: T::of(config.beta2),
            v_weight: T::of(1.0 - config.beta2),
            step_size: T::of(config.lr / bias_correction1),
            bias_correction2_sqrt: T::of(bias_correction2.sqrt()),
            eps: T::of(config.eps),
        }
    }

    /// Elements `param`, `m`, `v` updated from their gradient elements `grad`.
    fn update(&self, param: &mut [T], grad: impl Iterator<Item = T>, m: &mut [T], v: &mut [T]) {
        for (((p, g), m), v) in param
            .iter_mut()
            .zip(grad)
            .zip(m.iter_mut())
            .zip(v.iter_mut())
        {
            *p *= self.decay;
            *m = torch_lerp(*m, g, self.m_weight);
            *v = *v * self.beta2 + self.v_weight * g * g;
            let denom = v.sqrt() / self.bias_correction2_sqrt + self.eps;
            *p -= self.step_size * *m / denom;
        }
    }
}

fn adamw_typed<T: Real>(
    param: &mut TensorViewMut<'_>,
    grad: &TensorView<'_>,
    m: &mut TensorViewMut<'_>,
    v: &mut TensorViewMut<'_>,
    (step, grad_scale): (u64, Option<f32>),
    config: &AdamW,
) -> Result<()> {
    const OP: &str = "adamw";
    let grad = grad.slice::<T>(OP, "grad")?;
    let param = param.slice_mut::<T>(OP, "param")?;
    let m = m.slice_mut::<T>(OP, "m")?;
    let v = v.slice_mut::<T>(OP, "v")?;
    let step = Step::new(step, config);
    let scale = grad_scale.map(|s| T::of(f64::from(s)));
    let grad = grad.iter().map(|&g| scale.map_or(g, |s| g * s));
    step.update(param, grad, m, v);
    Ok(())
}

/// One AdamW step (`step` counted from 1) for `param`, updating the moments `m` and `v` in
/// place; `param`, `grad`, `m`, `v` share one shape and one dtype. `grad_scale` multiplies
/// every gradient element first (the factor of [`clip_grad_norm`]).
pub fn adamw(
    param: &mut TensorViewMut<'_>,
    grad: &TensorView<'_>,
    m: &mut TensorViewMut<'_>,
    v: &mut TensorViewMut<'_>,
    (step, grad_scale): (u64, Option<f32>),
    config: &AdamW,
) -> Result<()> {
    const OP: &str = "adamw";
    config.validate_step(OP, step)?;
    let dims = param.shape().dims();
    expect_shape(OP, "grad", grad.shape(), dims)?;
    expect_shape(OP, "m", m.shape(), dims)?;
    expect_shape(OP, "v", v.shape(), dims)?;
    dispatch_real!(
        OP,
        param.dtype(),
        adamw_typed(param, grad, m, v, (step, grad_scale), config)
    )
}

/// The state an embedding update changes row by row: the table `param` `[V, H]`, its moments
/// `m` and `v` (one real dtype), and, in mixed precision, its bf16 `copy`, whose updated rows
/// become the rounding of their new `param` rows. Rows the update does not take stay as they
/// are in all four.
pub struct TableState<'s, 'a> {
    pub param: &'s mut TensorViewMut<'a>,
    pub m: &'s mut TensorViewMut<'a>,
    pub v: &'s mut TensorViewMut<'a>,
    pub copy: Option<&'s mut TensorViewMut<'a>>,
}

/// The scatter an embedding update takes its gradient from, as
/// [`embedding_backward`](crate::embedding::embedding_backward) takes it: `ids`, `grad_out`
/// `[ids..., H]` (the named rows' update alone reads it) and the `base` `[V, H]` it goes onto.
pub struct Scatter<'s, 'a> {
    pub ids: &'s TensorView<'a>,
    pub grad_out: Option<&'s TensorView<'a>>,
    pub base: Option<&'s TensorView<'a>>,
}

/// One AdamW step of the `rows` of an embedding table from the gradient
/// [`embedding_backward`](crate::embedding::embedding_backward) gives it for the scatter, with
/// the same bits, without that `[V, H]` gradient: each row's gradient is made in `row` (`[H]`,
/// param's dtype) as the scatter makes it — the unnamed rows' `0 + base` (or 0), each named
/// row once, its tokens' gradient rows added in token order onto zero, then its base row — and
/// the row updated from it. `named` (scratch, at
/// least `V / 8` rounded up bytes) holds a bit for each row some id names. The unnamed rows'
/// update and then the named rows' is the whole table's.
pub fn embedding_adamw(
    state: TableState<'_, '_>,
    rows: EmbeddingRows,
    scatter: Scatter<'_, '_>,
    (row, named): (&mut TensorViewMut<'_>, &mut [u8]),
    step: u64,
    config: &AdamW,
) -> Result<()> {
    const OP: &str = "embedding_adamw";
    config.validate_step(OP, step)?;
    let dims = state.param.shape().dims().to_vec();
    let &[vocab, hidden] = dims.as_slice() else {
        let reason = format!("must be a table [V, H], got {}", state.param.shape());
        return Err(invalid(OP, "param", reason));
    };
    expect_shape(OP, "m", state.m.shape(), &dims)?;
    expect_shape(OP, "v", state.v.shape(), &dims)?;
    if let Some(copy) = &state.copy {
        expect_shape(OP, "copy", copy.shape(), &dims)?;
    }
    expect_shape(OP, "row", row.shape(), &[hidden])?;
    if let Some(base) = scatter.base {
        expect_shape(OP, "base", base.shape(), &dims)?;
    }
    match (rows, scatter.grad_out) {
        (EmbeddingRows::Named, Some(grad_out)) => {
            let mut want = scatter.ids.shape().dims().to_vec();
            want.push(hidden);
            expect_shape(OP, "grad_out", grad_out.shape(), &want)?;
        }
        (EmbeddingRows::Named, None) => {
            return Err(invalid(
                OP,
                "grad_out",
                "is needed for the named rows".into(),
            ))
        }
        (EmbeddingRows::Unnamed, _) => {}
    }
    if named.len() < vocab.div_ceil(8) {
        let reason = format!("holds {} bytes, {} needed", named.len(), vocab.div_ceil(8));
        return Err(invalid(OP, "named", reason));
    }
    let ids = Indices::of(OP, "ids", scatter.ids)?;
    ids.check_below(OP, "ids", vocab, None)?;
    let scatter = (ids, scatter.grad_out, scatter.base);
    dispatch_real!(
        OP,
        state.param.dtype(),
        embedding_adamw_typed(state, rows, scatter, (row, named), step, config)
    )
}

fn embedding_adamw_typed<T: Real>(
    state: TableState<'_, '_>,
    rows: EmbeddingRows,
    (ids, grad_out, base): (
        Indices<'_>,
        Option<&TensorView<'_>>,
        Option<&TensorView<'_>>,
    ),
    (row, named): (&mut TensorViewMut<'_>, &mut [u8]),
    step: u64,
    config: &AdamW,
) -> Result<()> {
    const OP: &str = "embedding_adamw";
    let param = state.param.slice_mut::<T>(OP, "param")?;
    let m = state.m.slice_mut::<T>(OP, "m")?;
    let v = state.v.slice_mut::<T>(OP, "v")?;
    let mut copy = (state.copy)
        .map(|c| c.slice_mut::<bf16>(OP, "copy"))
        .transpose()?;
    let row = row.slice_mut::<T>(OP, "row")?;
    let grad_out = grad_out.map(|g| g.slice::<T>(OP, "grad_out")).transpose()?;
    let base = base.map(|b| b.slice::<T>(OP, "base")).transpose()?;
    let hidden = row.len();
    let vocab = param.len().checked_div(hidden).unwrap_or(0);
    let step = Step::new(step, config);
    let mut update = |r: usize, row: &mut [T]| {
        if let Some(base) = base {
            for (g, &b) in row.iter_mut().zip(&base[r * hidden..(r + 1) * hidden]) {
                *g += b;
            }
        }
        let at = r * hidden..(r + 1) * hidden;
        let grad = row.iter().copied();
        step.update(
            &mut param[at.clone()],
            grad,
            &mut m[at.clone()],
            &mut v[at.clone()],
        );
        if let Some(copy) = copy.as_deref_mut() {
            for (c, &p) in copy[at.clone()].iter_mut().zip(&param[at]) {
                *c = <bf16 as Element>::from_f64(Element::to_f64(p));
            }
        }
    };
    let id = |n: usize| ids.get(n) as usize;
    named.fill(0);
    for n in 0..ids.len() {
        named[id(n) / 8] |= 1 << (id(n) % 8);
    }
    let is_named = |named: &[u8], r: usize| named[r / 8] >> (r % 8) & 1 == 1;
    // The named rows' update has its gradient (checked); otherwise the unnamed rows'.
    let (EmbeddingRows::Named, Some(grad_out)) = (rows, grad_out) else {
        for r in (0..vocab).filter(|&r| !is_named(named, r)) {
            row.fill(T::zero());
            update(r, row);
        }
        return Ok(());
    };
    // Each named row once, at its first token: its tokens' gradients in token order.
    for n in 0..ids.len() {
        let r = id(n);
        if !is_named(named, r) {
            continue;
        }
        named[r / 8] &= !(1 << (r % 8));
        row.fill(T::zero());
        for k in (n..ids.len()).filter(|&k| id(k) == r) {
            for (g, &s) in row.iter_mut().zip(&grad_out[k * hidden..(k + 1) * hidden]) {
                *g += s;
            }
        }
        update(r, row);
    }
    Ok(())
}

/// `torch.nn.utils.clip_grad_norm_`'s two numbers for f32 gradients: their global 2-norm and
/// the factor `min(1, max_norm / (norm + 1e-6))` that scales them to at most `max_norm`
/// (NaN when the norm is). Squares are summed in f64, each tensor in element order and the
/// tensors in the order given; the GPU sums them in f64 in another fixed order, so the two can
/// differ in the last bits of the f32 results (torch computes in f32, a norm of per-tensor
/// norms: kiln agrees with it to rounding).
pub fn clip_grad_norm(grads: &[TensorView<'_>], max_norm: f64) -> Result<(f32, f32)> {
    const OP: &str = "clip_grad_norm";
    if !(max_norm.is_finite() && max_norm > 0.0) {
        return Err(invalid(
            OP,
            "max_norm",
            format!("must be finite and > 0, got {max_norm}"),
        ));
    }
    let mut squares = 0f64;
    for grad in grads {
        let values = grad.slice::<f32>(OP, "grad")?;
        squares += values
            .iter()
            .map(|&g| f64::from(g) * f64::from(g))
            .sum::<f64>();
    }
    let norm = squares.sqrt();
    Ok((norm as f32, clip_scale(norm, max_norm) as f32))
}

/// `min(1, max_norm / (norm + 1e-6))`, NaN for a NaN norm (`f64::min` would drop it).
pub fn clip_scale(norm: f64, max_norm: f64) -> f64 {
    let coefficient = max_norm / (norm + 1e-6);
    if coefficient >= 1.0 {
        1.0
    } else {
        coefficient
    }
}

#[cfg(test)]
#[path = "optim_tests.rs"]
mod tests;
