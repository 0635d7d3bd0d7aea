//! Where a value's elements sit inside its buffer: dtype, shape, element strides and element
//! offset, counted in elements of the value's dtype from the start of the buffer's storage.
//!
//! An op result that is not a view starts contiguous at element 0 of its buffer (where the
//! interpreter's fresh tensor would start at element 0 of its storage); a bound input has the
//! layout of its tensor; a view's layout is its operand's under the view rules that
//! [`Tensor::reshape`], [`Tensor::transpose`] and [`Tensor::slice`] also use ([`kiln_ir::Layout`]),
//! so kernels see the same views as in the interpreter.

use kiln_ir::{DType, LayoutError, Op, Shape, Strides, TensorType};

use crate::error::Result;
use crate::tensor::Tensor;

/// The layout of one value in its buffer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Layout {
    pub dtype: DType,
    pub shape: Shape,
    pub strides: Strides,
    /// Offset of the first element, in elements of `dtype`.
    pub offset: usize,
}

impl Layout {
    /// Row-major from element 0: where an op writes a (non-view) result.
    pub fn contiguous(ty: &TensorType) -> Self {
        Layout {
            dtype: ty.dtype,
            shape: ty.shape.clone(),
            strides: ty.shape.contiguous_strides(),
            offset: 0,
        }
    }

    /// The layout of a tensor over its storage.
    pub fn of_tensor(tensor: &Tensor) -> Self {
        Layout {
            dtype: tensor.dtype(),
            shape: tensor.shape().clone(),
            strides: Strides::from_slice(tensor.strides()),
            offset: tensor.offset(),
        }
    }

    /// The IR type of the value.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }

    /// The layout of view op `op` of this value, in a storage of `capacity` elements; `None`
    /// when `op` is not a view op.
    pub fn view(&self, op: &Op, capacity: usize) -> Option<Result<Layout>> {
        let view = match op {
            Op::Reshape { shape } => self.reshape(shape, capacity),
            Op::Transpose { dim0, dim1 } => self.transpose(*dim0, *dim1),
            Op::Slice { axis, start, end } => self.slice(*axis, *start, *end, capacity),
            _ => return None,
        };
        Some(view)
    }

    /// This layout viewed by `view` (the view rules of [`kiln_ir::Layout`]), dtype kept.
    fn with(
        &self,
        view: impl FnOnce(&kiln_ir::Layout) -> Result<kiln_ir::Layout, LayoutError>,
    ) -> Result<Layout> {
        let current = kiln_ir::Layout::new(self.shape.clone(), &self.strides, self.offset)?;
        let viewed = view(&current)?;
        Ok(Layout {
            dtype: self.dtype,
            shape: viewed.shape().clone(),
            strides: Strides::from_slice(viewed.strides()),
            offset: viewed.offset(),
        })
    }

    fn reshape(&self, to: &Shape, capacity: usize) -> Result<Layout> {
        self.with(|l| l.reshape(to.clone()))?.checked(capacity)
    }

    fn transpose(&self, dim0: usize, dim1: usize) -> Result<Layout> {
        self.with(|l| l.transpose(dim0, dim1))
    }

    fn slice(&self, axis: usize, start: usize, end: usize, capacity: usize) -> Result<Layout> {
        self.with(|l| l.slice(axis, start, end, 1))?
            .checked(capacity)
    }

    /// `self` if it fits in `capacity` elements, else the error a kernel view would give.
    fn checked(self, capacity: usize) -> Result<Layout> {
        kiln_ir::Layout::new(self.shape.clone(), &self.strides, self.offset)?.fits(capacity)?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2x3x4 f32 tensor viewed at element 5 of a 40-element storage, so offsets matter.
    fn base() -> Tensor {
        let values: Vec<f32> = (0..40).map(|x| x as f32 * 0.5 - 3.0).collect();
        let storage = Tensor::from_vec(values, [40]).unwrap();
        storage.as_strided(&[2, 3, 4], &[12, 4, 1], 5).unwrap()
    }

    #[test]
    fn views_match_the_tensor_view_methods() {
        let tensor = base();
        let capacity = tensor.storage().len();
        let layout = Layout::of_tensor(&tensor);
        let cases: Vec<(Op, Tensor)> = vec![
            (
                Op::Reshape {
                    shape: Shape::new(&[6, 4]),
                },
                tensor.reshape([6, 4]).unwrap(),
            ),
            (
                Op::Transpose { dim0: 0, dim1: 2 },
                tensor.transpose(0, 2).unwrap(),
            ),
            (
                Op::Slice {
                    axis: 1,
                    start: 1,
                    end: 3,
                },
                tensor.slice(1, 1, 3, 1).unwrap(),
            ),
        ];
        for (op, want) in cases {
            let got = layout.view(&op, capacity).unwrap().unwrap();
            assert_eq!(got, Layout::of_tensor(&want), "{op}");
        }
        // A slice of a transpose: strided, offset moved along the swapped axis.
        let t = tensor.transpose(1, 2).unwrap();
        let op = Op::Slice {
            axis: 2,
            start: 2,
            end: 3,
        };
        let got = Layout::of_tensor(&t).view(&op, capacity).unwrap().unwrap();
        assert_eq!(got, Layout::of_tensor(&t.slice(2, 2, 3, 1).unwrap()));
        assert!(layout.view(&Op::Softmax, capacity).is_none());
    }

    #[test]
    fn views_refuse_what_the_tensor_methods_refuse() {
        let tensor = base();
        let capacity = tensor.storage().len();
        let transposed = Layout::of_tensor(&tensor.transpose(0, 1).unwrap());
        let reshape = Op::Reshape {
            shape: Shape::new(&[24]),
        };
        let err = transposed.view(&reshape, capacity).unwrap().unwrap_err();
        let want = tensor.transpose(0, 1).unwrap().reshape([24]).unwrap_err();
        assert_eq!(err, want);
        let layout = Layout::of_tensor(&tensor);
        let wrong_count = Op::Reshape {
            shape: Shape::new(&[5]),
        };
        let err = layout.view(&wrong_count, capacity).unwrap().unwrap_err();
        assert_eq!(err, tensor.reshape([5]).unwrap_err());
        let transpose = Op::Transpose { dim0: 0, dim1: 3 };
        let err = layout.view(&transpose, capacity).unwrap().unwrap_err();
        assert_eq!(err, tensor.transpose(0, 3).unwrap_err());
        let slice = Op::Slice {
            axis: 2,
            start: 3,
            end: 5,
        };
        let err = layout.view(&slice, capacity).unwrap().unwrap_err();
        assert_eq!(err, tensor.slice(2, 3, 5, 1).unwrap_err());
        // A storage too small for the view (the tensor's is 40 elements; 28 is its last).
        let reshape = Op::Reshape {
            shape: Shape::new(&[24]),
        };
        assert!(layout.view(&reshape, 29).unwrap().is_ok());
        assert!(layout.view(&reshape, 28).unwrap().is_err());
    }

    #[test]
    fn fits_follows_the_kernel_bounds_rule() {
        let ty = TensorType::new(DType::F32, [2, 3]);
        let layout = Layout::contiguous(&ty);
        assert!(layout.clone().checked(6).is_ok());
        assert!(layout.clone().checked(5).is_err());
        let empty = Layout {
            offset: 7,
            ..Layout::contiguous(&TensorType::new(DType::F32, [0, 3]))
        };
        assert!(empty.clone().checked(7).is_ok());
        assert!(empty.clone().checked(6).is_err());
        assert_eq!(layout.ty(), ty);
    }
}
