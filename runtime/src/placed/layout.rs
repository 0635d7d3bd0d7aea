//! Where a value's elements sit inside its buffer: its dtype (to see the buffer's bytes as
//! elements) and its [`Layout`], counted in elements of that dtype from the start of the
//! buffer's storage.
//!
//! An op result that is not a view starts contiguous at element 0 of its buffer (where the
//! interpreter's fresh tensor would start at element 0 of its storage); a bound input has the
//! layout of its tensor; a view's layout is its operand's under the view rules of [`Layout`]
//! that [`Tensor::reshape`], [`Tensor::transpose`] and [`Tensor::slice`] also use, so kernels
//! see the same views as in the interpreter.

use kiln_ir::{DType, Layout, Op, TensorType};

use crate::error::Result;
use crate::tensor::Tensor;

/// The layout of one value in its buffer. Derefs to the [`Layout`].
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ValueLayout {
    pub dtype: DType,
    pub layout: Layout,
}

impl std::ops::Deref for ValueLayout {
    type Target = Layout;

    fn deref(&self) -> &Layout {
        &self.layout
    }
}

impl ValueLayout {
    /// Row-major from element 0: where an op writes a (non-view) result.
    pub fn contiguous(ty: &TensorType) -> Self {
        ValueLayout {
            dtype: ty.dtype,
            layout: Layout::contiguous(ty.shape.clone()),
        }
    }

    /// The layout of a tensor over its storage.
    pub fn of_tensor(tensor: &Tensor) -> Self {
        ValueLayout {
            dtype: tensor.dtype(),
            layout: tensor.layout().clone(),
        }
    }

    /// The IR type of the value.
    pub fn ty(&self) -> TensorType {
        // Unchecked: a layout is placed for a value of a graph, whose type was checked when
        // the graph was built.
        TensorType {
            dtype: self.dtype,
            shape: self.shape().clone(),
        }
    }

    /// The layout of view op `op` of this value, in a storage of `capacity` elements; `None`
    /// when `op` is not a view op.
    pub fn view(&self, op: &Op, capacity: usize) -> Option<Result<ValueLayout>> {
        let view = match op {
            Op::Reshape { shape } => self.reshape(shape.clone()),
            Op::Transpose { dim0, dim1 } => self.transpose(*dim0, *dim1),
            Op::Slice { axis, start, end } => self.slice(*axis, *start, *end, 1),
            _ => return None,
        };
        let fitting = view.and_then(|layout| layout.fits(capacity).map(|()| layout));
        let dtype = self.dtype;
        Some(
            fitting
                .map(|layout| ValueLayout { dtype, layout })
                .map_err(Into::into),
        )
    }
}

#[cfg(test)]
mod tests {
    use kiln_ir::Shape;

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
        let layout = ValueLayout::of_tensor(&tensor);
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
            assert_eq!(got, ValueLayout::of_tensor(&want), "{op}");
        }
        // A slice of a transpose: strided, offset moved along the swapped axis.
        let t = tensor.transpose(1, 2).unwrap();
        let op = Op::Slice {
            axis: 2,
            start: 2,
            end: 3,
        };
        let got = ValueLayout::of_tensor(&t)
            .view(&op, capacity)
            .unwrap()
            .unwrap();
        assert_eq!(got, ValueLayout::of_tensor(&t.slice(2, 2, 3, 1).unwrap()));
        assert!(layout.view(&Op::Softmax, capacity).is_none());
    }

    #[test]
    fn views_refuse_what_the_tensor_methods_refuse() {
        let tensor = base();
        let capacity = tensor.storage().len();
        let transposed = ValueLayout::of_tensor(&tensor.transpose(0, 1).unwrap());
        let reshape = Op::Reshape {
            shape: Shape::new(&[24]),
        };
        let err = transposed.view(&reshape, capacity).unwrap().unwrap_err();
        let want = tensor.transpose(0, 1).unwrap().reshape([24]).unwrap_err();
        assert_eq!(err, want);
        let layout = ValueLayout::of_tensor(&tensor);
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
    fn results_are_contiguous_from_element_zero() {
        let ty = TensorType::new(DType::F32, [2, 3]).unwrap();
        let layout = ValueLayout::contiguous(&ty);
        assert_eq!(layout.layout, Layout::contiguous(ty.shape.clone()));
        assert_eq!(layout.ty(), ty);
    }
}
