//! Token embedding lookup.

use kiln_ir::DType;
use kiln_kernels::embedding as k;
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::Result;
use crate::launch::{empty, launch};

/// Rows of `weight` [V,H] picked by integer `ids` [...] → [..., H] (f32 rows from a bf16
/// table). Ids outside 0..V are an error naming the offending element.
pub fn embedding(weight: &Var, ids: &Tensor) -> Result<Var> {
    let hidden = weight.dims().get(1).copied().unwrap_or(0);
    let mut dims = ids.dims().to_vec();
    dims.push(hidden);
    let rows_dtype = match weight.dtype() {
        DType::BF16 => DType::F32,
        dtype => dtype,
    };
    let out = empty(dims, rows_dtype);
    launch(&[weight.value(), ids], &[&out], |i, o| {
        k::embedding(&i[0], &i[1], &mut o[0])
    })?;
    let (ids, weight_shape, dtype) = (ids.clone(), weight.shape().clone(), weight.dtype());
    Ok(Var::record_one("embedding", &[weight], out, move |g| {
        let grad = empty(weight_shape.clone(), dtype);
        launch(&[&ids, g], &[&grad], |i, o| {
            k::embedding_backward(&i[0], &i[1], None, &mut o[0])
        })?;
        Ok(vec![Some(grad)])
    }))
}
