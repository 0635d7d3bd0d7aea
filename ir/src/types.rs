//! The type of every IR value: a dtype and a static shape.
//!
//! Invariant: a `TensorType` made by [`TensorType::new`] has an element count that fits in
//! `usize` and a byte size of at most `isize::MAX` (the most one allocation can hold), so
//! `numel` and `size_bytes` on it cannot overflow. Types built from user sizes are refused
//! there, naming the dims, before anything is sized by them.

use std::fmt;

use crate::{DType, Error, Result, Shape};

/// Dtype and static shape of a value.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    /// The type of `dtype` elements of `shape`, or [`Error::TooLarge`] when its element count
    /// or byte size does not fit (see the module invariant).
    pub fn new(dtype: DType, shape: impl Into<Shape>) -> Result<Self> {
        let ty = TensorType {
            dtype,
            shape: shape.into(),
        };
        ty.checked_size_bytes()?;
        Ok(ty)
    }

    /// The dims of the shape.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Bytes the value occupies when contiguous (unchecked: `new` has checked it).
    pub fn size_bytes(&self) -> usize {
        self.shape.numel() * self.dtype.size_bytes()
    }

    /// Bytes the value occupies when contiguous, or an error naming the type when they exceed
    /// `isize::MAX` (for types not made by `new`, as a verifier must assume).
    pub fn checked_size_bytes(&self) -> Result<usize> {
        let too_large = |detail: String| Error::TooLarge {
            what: self.to_string(),
            detail,
        };
        let count = self.shape.checked_numel().map_err(|error| match error {
            Error::TooLarge { detail, .. } => too_large(detail),
            other => other,
        })?;
        // `count` fits in usize and an element is at most 8 bytes: no u128 overflow.
        let bytes = count as u128 * self.dtype.size_bytes() as u128;
        if bytes > isize::MAX as u128 {
            return Err(too_large(format!(
                "{bytes} bytes, more than one allocation can hold ({} = isize::MAX)",
                isize::MAX
            )));
        }
        Ok(bytes as usize)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_too_large_to_address_are_refused_with_their_dims() {
        let count = TensorType::new(DType::I64, [1usize << 32, 1 << 32]).unwrap_err();
        assert_eq!(
            count.to_string(),
            "i64[4294967296,4294967296] is too large: more than 18446744073709551615 elements \
             (usize::MAX)"
        );
        let bytes = TensorType::new(DType::F32, [1usize << 31, 1 << 31]).unwrap_err();
        assert_eq!(
            bytes.to_string(),
            "f32[2147483648,2147483648] is too large: 18446744073709551616 bytes, more than one \
             allocation can hold (9223372036854775807 = isize::MAX)"
        );
        let largest = TensorType::new(DType::I32, [(isize::MAX as usize) / 4]).unwrap();
        assert_eq!(largest.size_bytes(), isize::MAX as usize / 4 * 4);
        assert!(TensorType::new(DType::F32, [usize::MAX, 0]).is_ok());
    }
}
