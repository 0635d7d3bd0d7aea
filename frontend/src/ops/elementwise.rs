//! Add, multiply, scale, sum and cast.

use kiln_ir::{DType, Shape};
use kiln_kernels::elementwise as k;
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::Result;
use crate::launch::{empty, launch};

/// `grad` summed down to `shape` (a suffix of its shape): the VJP of broadcasting.
fn sum_to(grad: &Tensor, shape: &Shape) -> Result<Tensor> {
    if grad.shape() == shape {
        return Ok(grad.clone());
    }
    let out = empty(shape.clone(), grad.dtype());
    launch(&[grad], &[&out], |i, o| k::sum_to_shape(&i[0], &mut o[0]))?;
    Ok(out)
}

fn binary(
    a: &Tensor,
    b: &Tensor,
    kernel: impl FnOnce(
        &kiln_kernels::TensorView<'_>,
        &kiln_kernels::TensorView<'_>,
        &mut kiln_kernels::TensorViewMut<'_>,
    ) -> kiln_kernels::Result<()>,
) -> Result<Tensor> {
    let out = empty(a.shape().clone(), a.dtype());
    launch(&[a, b], &[&out], |i, o| kernel(&i[0], &i[1], &mut o[0]))?;
    Ok(out)
}

/// `a + b`; `b`'s shape equals `a`'s or is a suffix of it (broadcast over leading dims).
pub fn add(a: &Var, b: &Var) -> Result<Var> {
    let out = binary(a.value(), b.value(), k::add)?;
    let b_shape = b.shape().clone();
    Ok(Var::record_one("add", &[a, b], out, move |g| {
        Ok(vec![Some(g.clone()), Some(sum_to(g, &b_shape)?)])
    }))
}

/// `a * b` elementwise; `b` broadcasts like in [`add`].
pub fn mul(a: &Var, b: &Var) -> Result<Var> {
    let out = binary(a.value(), b.value(), k::mul)?;
    let (a_value, b_value) = (a.value().clone(), b.value().clone());
    Ok(Var::record_one("mul", &[a, b], out, move |g| {
        let grad_a = binary(g, &b_value, k::mul)?;
        let grad_b = sum_to(&binary(g, &a_value, k::mul)?, b_value.shape())?;
        Ok(vec![Some(grad_a), Some(grad_b)])
    }))
}

fn scaled(x: &Tensor, alpha: f64) -> Result<Tensor> {
    let out = empty(x.shape().clone(), x.dtype());
    launch(&[x], &[&out], |i, o| k::scale(&i[0], alpha, &mut o[0]))?;
    Ok(out)
}

/// `alpha · x`.
pub fn scale(x: &Var, alpha: f64) -> Result<Var> {
    let out = scaled(x.value(), alpha)?;
    Ok(Var::record_one("scale", &[x], out, move |g| {
        Ok(vec![Some(scaled(g, alpha)?)])
    }))
}

/// The sum of all elements, as a scalar `{}`.
pub fn sum(x: &Var) -> Result<Var> {
    let out = sum_to(x.value(), &Shape::scalar())?;
    let (shape, dtype) = (x.shape().clone(), x.dtype());
    Ok(Var::record_one("sum", &[x], out, move |g| {
        // d sum / dx_i = 1: broadcast the scalar gradient back (b = g, a = zeros).
        let zeros = empty(shape.clone(), dtype);
        Ok(vec![Some(binary(&zeros, g, k::add)?)])
    }))
}

pub(crate) fn cast_tensor(x: &Tensor, dtype: DType) -> Result<Tensor> {
    let out = empty(x.shape().clone(), dtype);
    launch(&[x], &[&out], |i, o| {
        kiln_kernels::copy::cast(&i[0], &mut o[0])
    })?;
    Ok(out)
}

/// `x` converted to `dtype` (round to nearest even); the gradient converts back.
/// `x` as `dtype`: `x` itself when it has that dtype, else [`cast`]. Stored operands (a bf16
/// weight, bias or cache, `kiln_ir::stores`) are widened with it before an f32 kernel, which
/// is exactly what the IR's mixed-dtype ops compute.
pub fn as_dtype(x: &Var, dtype: DType) -> Result<Var> {
    if x.dtype() == dtype {
        Ok(x.clone())
    } else {
        cast(x, dtype)
    }
}

pub fn cast(x: &Var, dtype: DType) -> Result<Var> {
    let out = cast_tensor(x.value(), dtype)?;
    let from = x.dtype();
    Ok(Var::record_one("cast", &[x], out, move |g| {
        Ok(vec![Some(cast_tensor(g, from)?)])
    }))
}
