//! Running a CPU reference kernel over runtime tensors: borrow the inputs' storages for
//! reading and the outputs' for writing, build kernel views, run.
//!
//! Invariant: a kernel never sees aliased operands. An output that shares storage with an
//! input or with another output is refused with [`Error::Busy`](crate::Error::Busy) before
//! the kernel runs (the storage's run-time borrow check), so nothing is written then.

use kiln_kernels::{TensorView, TensorViewMut};

use crate::error::Result;
use crate::storage::{StorageRead, StorageWrite};
use crate::tensor::Tensor;

/// Borrows `inputs` for reading and `outputs` for writing, and runs `kernel` on their views
/// (in the same order). Kernel errors come back as [`Error::Kernel`](crate::Error::Kernel).
pub fn launch(
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    kernel: impl FnOnce(&[TensorView<'_>], &mut [TensorViewMut<'_>]) -> kiln_kernels::Result<()>,
) -> Result<()> {
    let read_guards: Vec<StorageRead<'_>> = inputs
        .iter()
        .map(|t| t.storage().read())
        .collect::<Result<_>>()?;
    let mut write_guards: Vec<StorageWrite<'_>> = outputs
        .iter()
        .map(|t| t.storage().write())
        .collect::<Result<_>>()?;
    let views: Vec<TensorView<'_>> = inputs
        .iter()
        .zip(&read_guards)
        .map(|(t, guard)| t.view(guard))
        .collect::<Result<_>>()?;
    let mut views_mut: Vec<TensorViewMut<'_>> = outputs
        .iter()
        .zip(&mut write_guards)
        .map(|(t, guard)| t.view_mut(guard))
        .collect::<Result<_>>()?;
    kernel(&views, &mut views_mut)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Device, Error};
    use kiln_ir::DType;

    #[test]
    fn runs_the_kernel_on_views_of_the_tensors() {
        let a = Tensor::from_vec(vec![1.5f32, -2.0, 0.25], [3]).unwrap();
        let b = Tensor::from_vec(vec![0.5f32, 4.0, 1.0], [3]).unwrap();
        let out = Tensor::zeros([3], DType::F32, Device::Cpu);
        launch(&[&a, &b], &[&out], |i, o| {
            kiln_kernels::elementwise::add(&i[0], &i[1], &mut o[0])
        })
        .unwrap();
        assert_eq!(out.to_vec::<f32>().unwrap(), [2.0, 2.0, 1.25]);
    }

    #[test]
    fn an_output_aliasing_an_input_is_refused() {
        let a = Tensor::from_vec(vec![1.5f32, -2.0, 0.25], [3]).unwrap();
        let err = launch(&[&a], &[&a], |i, o| {
            kiln_kernels::elementwise::scale(&i[0], 2.0, &mut o[0])
        })
        .unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert_eq!(a.to_vec::<f32>().unwrap(), [1.5, -2.0, 0.25]);
    }

    #[test]
    fn kernel_errors_are_returned() {
        let a = Tensor::from_vec(vec![1.5f32, -2.0], [2]).unwrap();
        let out = Tensor::zeros([3], DType::F32, Device::Cpu);
        let err = launch(&[&a], &[&out], |i, o| {
            kiln_kernels::elementwise::scale(&i[0], 2.0, &mut o[0])
        })
        .unwrap_err();
        assert!(matches!(err, Error::Kernel(_)), "{err}");
        assert!(err.to_string().contains("`out`"), "{err}");
    }
}
