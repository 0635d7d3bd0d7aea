//! Gradients of leaves: accumulation, bound buffers and gradient-ready hooks.
//!
//! Accumulation rule (DESIGN.md):
//! 1. Unbound leaf: the first contribution is assigned as is (no copy); every later one
//!    allocates `old + new`. A gradient tensor is never mutated, because the op that produced
//!    it may have handed the same tensor to other inputs too.
//! 2. Bound leaf (`bind_grad_buffer`): the buffer is the gradient; every contribution is added
//!    into it in place, and `zero_grad` zeroes it in place, so its address never changes.
//! 3. Hooks registered with `on_grad_ready` fire once per backward pass, after the leaf's last
//!    contribution of that pass (a leaf used twice is not ready after its first path).

use kiln_ir::DType;
use kiln_runtime::Tensor;

use super::var::{Origin, Var};
use crate::error::{Error, Result};
use crate::launch::{empty, launch};

/// Called with the leaf's gradient once it is complete.
pub type GradHook = Box<dyn FnMut(&Tensor)>;

#[derive(Default)]
pub(crate) struct LeafGrad {
    grad: Option<Tensor>,
    bound: bool,
    hooks: Vec<GradHook>,
}

/// `a + b` into a fresh tensor (the "later contributions allocate an add" rule).
pub(crate) fn add_fresh(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let out = empty(a.shape().clone(), a.dtype());
    launch(&[a, b], &[&out], |i, o| {
        kiln_kernels::elementwise::add(&i[0], &i[1], &mut o[0])
    })?;
    Ok(out)
}

impl Var {
    fn leaf_grad(&self, op: &'static str) -> Result<&std::cell::RefCell<LeafGrad>> {
        match &self.0.origin {
            Origin::Leaf(cell) => Ok(cell),
            _ => Err(Error::NotLeaf {
                op,
                producer: self.producer(),
            }),
        }
    }

    /// The accumulated gradient of a leaf, if any (shares storage; never mutated unless bound).
    pub fn grad(&self) -> Option<Tensor> {
        match &self.0.origin {
            Origin::Leaf(cell) => cell.borrow().grad.clone(),
            _ => None,
        }
    }

    /// Whether a gradient buffer is bound to this leaf.
    pub fn is_grad_bound(&self) -> bool {
        match &self.0.origin {
            Origin::Leaf(cell) => cell.borrow().bound,
            _ => false,
        }
    }

    /// Clears the gradient: drops it, or zeroes a bound buffer in place (keeping its address).
    pub fn zero_grad(&self) -> Result<()> {
        let cell = self.leaf_grad("zero_grad")?;
        let mut leaf = cell.borrow_mut();
        if leaf.bound {
            if let Some(buffer) = &leaf.grad {
                buffer.fill(0.0)?;
            }
        } else {
            leaf.grad = None;
        }
        Ok(())
    }

    /// Replaces an unbound gradient (e.g. after clipping). Refused for a bound buffer.
    pub fn set_grad(&self, grad: Tensor) -> Result<()> {
        let cell = self.leaf_grad("set_grad")?;
        let mut leaf = cell.borrow_mut();
        if leaf.bound {
            return Err(Error::ReplaceBound);
        }
        self.expect_gradient_like("set_grad", &grad)?;
        leaf.grad = Some(grad);
        Ok(())
    }

    /// Makes `buffer` this leaf's gradient: from now on contributions are added into it in
    /// place and `zero_grad` zeroes it in place, so its address is stable. The buffer must be
    /// f32, contiguous and of the leaf's exact shape; the leaf must be an f32 leaf with no
    /// gradient yet and no bound buffer. The buffer's current values are the gradient so far.
    pub fn bind_grad_buffer(&self, buffer: Tensor) -> Result<()> {
        let cell = self.leaf_grad("bind_grad_buffer")?;
        let mut leaf = cell.borrow_mut();
        if leaf.bound {
            return Err(Error::AlreadyBound);
        }
        if leaf.grad.is_some() {
            return Err(Error::GradientPresent);
        }
        let reason = if self.dtype() != DType::F32 {
            Some(format!(
                "the leaf is {}; only f32 leaves can bind a buffer",
                self.dtype()
            ))
        } else if buffer.dtype() != DType::F32 {
            Some(format!("the buffer is {}; it must be f32", buffer.dtype()))
        } else if buffer.shape() != self.shape() {
            Some(format!(
                "the buffer has shape {}, the leaf {}",
                buffer.shape(),
                self.shape()
            ))
        } else if !buffer.is_contiguous() {
            Some("the buffer is not contiguous".to_string())
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::GradBuffer {
                op: "bind_grad_buffer",
                reason,
            });
        }
        leaf.grad = Some(buffer);
        leaf.bound = true;
        Ok(())
    }

    /// Detaches the bound buffer and returns it; the leaf is left with no gradient.
    pub fn unbind_grad_buffer(&self) -> Result<Tensor> {
        let cell = self.leaf_grad("unbind_grad_buffer")?;
        let mut leaf = cell.borrow_mut();
        if !leaf.bound {
            return Err(Error::NotBound);
        }
        leaf.bound = false;
        leaf.grad.take().ok_or(Error::NotBound)
    }

    /// Registers `hook`, called with the complete gradient once per backward pass that reaches
    /// this leaf, after its last contribution.
    pub fn on_grad_ready(&self, hook: impl FnMut(&Tensor) + 'static) -> Result<()> {
        let cell = self.leaf_grad("on_grad_ready")?;
        cell.borrow_mut().hooks.push(Box::new(hook));
        Ok(())
    }

    /// Adds one contribution under the accumulation rule (module doc, rules 1–2).
    pub(crate) fn accumulate(&self, contribution: Tensor) -> Result<()> {
        let cell = self.leaf_grad("accumulate")?;
        let mut leaf = cell.borrow_mut();
        leaf.grad = Some(match leaf.grad.take() {
            None => contribution,
            Some(buffer) if leaf.bound => {
                launch(&[&contribution], &[&buffer], |i, o| {
                    kiln_kernels::elementwise::accumulate(&mut o[0], &i[0])
                })?;
                buffer
            }
            Some(previous) => add_fresh(&previous, &contribution)?,
        });
        Ok(())
    }

    /// Runs the ready hooks with the complete gradient (rule 3).
    pub(crate) fn fire_grad_ready(&self) -> Result<()> {
        let cell = self.leaf_grad("on_grad_ready")?;
        // Take the hooks out so a hook may read `grad()` without a double borrow.
        let (grad, mut hooks) = {
            let mut leaf = cell.borrow_mut();
            (leaf.grad.clone(), std::mem::take(&mut leaf.hooks))
        };
        if let Some(grad) = &grad {
            for hook in &mut hooks {
                hook(grad);
            }
        }
        let mut leaf = cell.borrow_mut();
        hooks.append(&mut leaf.hooks);
        leaf.hooks = hooks;
        Ok(())
    }

    pub(crate) fn expect_gradient_like(&self, op: &'static str, grad: &Tensor) -> Result<()> {
        if grad.shape() != self.shape() || grad.dtype() != self.dtype() {
            return Err(Error::GradBuffer {
                op,
                reason: format!(
                    "gradient is {} {}, the value is {} {}",
                    grad.dtype(),
                    grad.shape(),
                    self.dtype(),
                    self.shape()
                ),
            });
        }
        Ok(())
    }
}
