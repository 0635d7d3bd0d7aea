//! Running a CPU reference kernel over runtime tensors.

use kiln_ir::{DType, Shape};
use kiln_kernels::{TensorView, TensorViewMut};
use kiln_runtime::{Device, StorageRead, StorageWrite, Tensor};

use crate::error::Result;

/// Borrows `inputs` for reading and `outputs` for writing, and runs `kernel` on their views.
/// An output that shares storage with an input or another output is refused (`Busy`), so a
/// kernel never sees aliased operands.
pub(crate) fn launch(
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    kernel: impl FnOnce(&[TensorView<'_>], &mut [TensorViewMut<'_>]) -> kiln_kernels::Result<()>,
) -> Result<()> {
    let read_guards: Vec<StorageRead<'_>> = inputs
        .iter()
        .map(|t| t.storage().read())
        .collect::<Result<_, _>>()?;
    let mut write_guards: Vec<StorageWrite<'_>> = outputs
        .iter()
        .map(|t| t.storage().write())
        .collect::<Result<_, _>>()?;
    let views: Vec<TensorView<'_>> = inputs
        .iter()
        .zip(&read_guards)
        .map(|(t, guard)| t.view(guard))
        .collect::<Result<_, _>>()?;
    let mut views_mut: Vec<TensorViewMut<'_>> = outputs
        .iter()
        .zip(&mut write_guards)
        .map(|(t, guard)| t.view_mut(guard))
        .collect::<Result<_, _>>()?;
    kernel(&views, &mut views_mut)?;
    Ok(())
}

/// A fresh contiguous CPU tensor for a kernel to overwrite.
pub(crate) fn empty(shape: impl Into<Shape>, dtype: DType) -> Tensor {
    Tensor::zeros(shape, dtype, Device::Cpu)
}
