//! Explicit views and the one explicit copy.

use kiln_ir::Shape;

use crate::autograd::Var;
use crate::error::{Error, Result};

/// The same elements under another shape (zero-copy; `x` must be contiguous).
pub fn reshape(x: &Var, shape: impl Into<Shape>) -> Result<Var> {
    let out = x.value().reshape(shape)?;
    let from = x.shape().clone();
    Ok(Var::record_one("reshape", &[x], out, move |g| {
        Ok(vec![Some(g.reshape(from.clone())?)])
    }))
}

/// Two dimensions swapped (zero-copy). Its gradient is materialized, so gradients reaching
/// kernels are always contiguous.
pub fn transpose(x: &Var, dim0: usize, dim1: usize) -> Result<Var> {
    let out = x.value().transpose(dim0, dim1)?;
    Ok(Var::record_one("transpose", &[x], out, move |g| {
        Ok(vec![Some(g.transpose(dim0, dim1)?.contiguous()?)])
    }))
}

/// Elements `start..end` along `axis` (zero-copy). Only inference programs slice (the last
/// position before the output head), so it has no gradient rule: a backward pass through it is
/// an error that says so, in the tape as in the IR autodiff.
pub fn slice(x: &Var, axis: usize, start: usize, end: usize) -> Result<Var> {
    let out = x.value().slice(axis, start, end, 1)?;
    Ok(Var::record_one("slice", &[x], out, |_| {
        Err(Error::Operand {
            op: "slice",
            reason: "no gradient rule: slices appear only in inference programs".into(),
        })
    }))
}

/// A row-major copy of a strided value (the value itself when already contiguous).
pub fn contiguous(x: &Var) -> Result<Var> {
    if x.value().is_contiguous() {
        return Ok(x.clone());
    }
    let out = x.value().contiguous()?;
    Ok(Var::record_one("contiguous", &[x], out, |g| {
        Ok(vec![Some(g.clone())])
    }))
}
