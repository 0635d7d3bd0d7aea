//! Explicit views and the one explicit copy.

use kiln_ir::Shape;

use crate::autograd::Var;
use crate::error::Result;

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
