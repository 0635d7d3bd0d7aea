//! The type of every IR value: a dtype and a static shape.

use std::fmt;

use crate::{DType, Shape};

/// Dtype and static shape of a value.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Self {
        TensorType {
            dtype,
            shape: shape.into(),
        }
    }

    /// The dims of the shape.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Bytes the value occupies when contiguous.
    pub fn size_bytes(&self) -> usize {
        self.shape.numel() * self.dtype.size_bytes()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}
