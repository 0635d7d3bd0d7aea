//! Static shapes and element strides.
//!
//! Invariants (Tensor N0 in DESIGN.md):
//! 1. A shape of rank 0 (`{}`) is a scalar with exactly one element.
//! 2. Zero-sized dimensions are valid; such a shape has zero elements.
//! 3. Dimensions and strides are never negative: the checked constructors take `i64`, as a user
//!    or file would give them, and reject negative values with an error.
//! 4. Strides count elements, not bytes.

use smallvec::SmallVec;
use std::fmt;

use crate::{Error, Result};

/// Dimensions of a tensor, outermost first.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(SmallVec<[usize; 6]>);

/// Element strides of a tensor, one per dimension (elements, not bytes).
pub type Strides = SmallVec<[usize; 6]>;

impl Shape {
    /// A shape from non-negative dimensions.
    pub fn new(dims: &[usize]) -> Self {
        Shape(SmallVec::from_slice(dims))
    }

    /// The scalar shape `{}` (one element).
    pub fn scalar() -> Self {
        Shape(SmallVec::new())
    }

    /// A shape from signed dimensions as users and files give them; negative ones are rejected,
    /// and so is a shape whose element count overflows.
    pub fn from_signed(dims: &[i64]) -> Result<Self> {
        let mut out = SmallVec::with_capacity(dims.len());
        for (axis, &value) in dims.iter().enumerate() {
            let dim = usize::try_from(value).map_err(|_| Error::NegativeDim { axis, value })?;
            out.push(dim);
        }
        let shape = Shape(out);
        shape.checked_numel()?;
        Ok(shape)
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions (0 for a scalar).
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements: 1 for a scalar, 0 if any dimension is 0. Unchecked: for shapes of
    /// a [`TensorType`](crate::TensorType) or a tensor, whose count is known to fit; a shape
    /// from a user or a file goes through [`Shape::checked_numel`].
    pub fn numel(&self) -> usize {
        // A zero dim makes the count 0 even where the other dims' product would overflow.
        if self.0.contains(&0) {
            return 0;
        }
        self.0.iter().product()
    }

    /// Number of elements, or an error naming the shape when the count overflows `usize`.
    pub fn checked_numel(&self) -> Result<usize> {
        let zero = self.0.contains(&0);
        let count = self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
        match count {
            Some(count) => Ok(count),
            // An empty dimension makes the product 0 whatever the others overflow to.
            None if zero => Ok(0),
            None => Err(Error::TooLarge {
                what: format!("shape {self}"),
                detail: format!("more than {} elements (usize::MAX)", usize::MAX),
            }),
        }
    }

    /// Row-major (C-order) element strides for this shape.
    pub fn contiguous_strides(&self) -> Strides {
        let mut strides: Strides = SmallVec::from_elem(0, self.rank());
        let mut step = 1usize;
        for axis in (0..self.rank()).rev() {
            strides[axis] = step;
            step = step.saturating_mul(self.0[axis]);
        }
        strides
    }

    /// Whether `strides` describe a row-major layout of this shape. Strides of dimensions of
    /// size 1 do not matter, and every layout of an empty tensor is contiguous.
    pub fn is_contiguous(&self, strides: &[usize]) -> bool {
        if strides.len() != self.rank() {
            return false;
        }
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1usize;
        for axis in (0..self.rank()).rev() {
            let dim = self.0[axis];
            if dim != 1 && strides[axis] != expected {
                return false;
            }
            expected *= dim;
        }
        true
    }

    /// Product of all dimensions but the last (rows of a row-wise op); 1 for a scalar.
    pub fn rows(&self) -> usize {
        match self.0.split_last() {
            Some((_, outer)) => outer.iter().product(),
            None => 1,
        }
    }

    /// The last dimension (row length of a row-wise op); 1 for a scalar.
    pub fn last_dim(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape::new(dims)
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape(SmallVec::from_vec(dims))
    }
}

impl From<&Vec<usize>> for Shape {
    fn from(dims: &Vec<usize>) -> Self {
        Shape::new(dims)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape::new(&dims)
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_has_one_element() {
        let s = Shape::scalar();
        assert_eq!(s.rank(), 0);
        assert_eq!(s.numel(), 1);
        assert!(s.is_contiguous(&[]));
        assert_eq!(s.to_string(), "[]");
    }

    #[test]
    fn zero_sized_dims_are_valid() {
        let s = Shape::from_signed(&[3, 0, 5]).unwrap();
        assert_eq!(s.numel(), 0);
        assert_eq!(s.contiguous_strides().as_slice(), &[0, 5, 1]);
        assert!(s.is_contiguous(&[7, 7, 7]));
    }

    #[test]
    fn negative_dims_are_rejected() {
        assert_eq!(
            Shape::from_signed(&[2, -1]),
            Err(Error::NegativeDim { axis: 1, value: -1 })
        );
    }

    #[test]
    fn overflowing_shapes_are_rejected() {
        let big = i64::MAX / 2;
        assert!(matches!(
            Shape::from_signed(&[big, big, big]),
            Err(Error::TooLarge { .. })
        ));
        let error = Shape::new(&[1 << 32, 1 << 32]).checked_numel().unwrap_err();
        assert_eq!(
            error.to_string(),
            "shape [4294967296,4294967296] is too large: more than 18446744073709551615 \
             elements (usize::MAX)"
        );
        assert_eq!(Shape::new(&[usize::MAX, 2, 0]).checked_numel(), Ok(0));
    }

    #[test]
    fn contiguity_ignores_unit_dims() {
        let s = Shape::new(&[2, 1, 3]);
        assert_eq!(s.contiguous_strides().as_slice(), &[3, 3, 1]);
        assert!(s.is_contiguous(&[3, 99, 1]));
        assert!(!s.is_contiguous(&[1, 3, 2]));
        assert_eq!(s.rows(), 2);
        assert_eq!(s.last_dim(), 3);
    }
}
