//! Kernel launches for the eager oracle: runtime's [`launch`] (borrow, view, run) and fresh
//! output tensors.

use kiln_ir::{DType, Shape};
use kiln_runtime::{Device, Tensor};

pub(crate) use kiln_runtime::launch;

/// A fresh contiguous CPU tensor for a kernel to overwrite.
pub(crate) fn empty(shape: impl Into<Shape>, dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, Device::Cpu)
}
