//! Layout: where a tensor's elements sit in a run of storage — shape, element strides and
//! element offset — and the view rules (reshape, transpose, positive-step slice) as arithmetic
//! on it.
//!
//! Every layer that places elements uses this one type: the kernels' views, the runtime's
//! tensors, the planned executor's arena values and the device lowering's placed values. So a
//! value has the same layout on every path, and the bounds and view rules are written once.
//!
//! Invariants:
//! 1. `strides` has one entry per dimension (checked by [`Layout::new`]).
//! 2. Strides and the offset count elements, not bytes; the dtype belongs to the storage that
//!    holds the elements, never to the layout.
//! 3. Dimensions, strides and the offset are never negative: they are `usize`, and signed
//!    input is checked where it enters ([`Shape::from_signed`] and its callers).
//! 4. A layout used over storage lies inside it: [`Layout::fits`] checks that for a non-empty
//!    layout `offset + Σ (dim_i − 1)·stride_i < len`; an empty one (a zero-sized dim) touches
//!    nothing and only needs `offset <= len`. Whoever pairs a layout with storage calls it.
//! 5. `reshape` needs a contiguous layout and keeps the offset; `transpose` swaps two
//!    dimensions and their strides; `slice` takes a positive step. None of them touches
//!    storage, and whether the result fits is the caller's check (invariant 4).

use crate::{Shape, Strides};

/// A layout that breaks a rule of the module doc.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// The layout does not lie inside its storage (invariant 4).
    #[error(
        "view of shape {shape} with strides {strides:?} at offset {offset} reaches element \
         {end}, but the data holds {len}"
    )]
    OutOfBounds {
        shape: Shape,
        strides: Vec<usize>,
        offset: usize,
        end: usize,
        len: usize,
    },
    /// Shape and strides disagree in rank (invariant 1).
    #[error("view has rank {shape_rank} but {strides_rank} strides")]
    StridesRank {
        shape_rank: usize,
        strides_rank: usize,
    },
    /// A rule that needs a row-major layout got a strided one.
    #[error("{op}: the tensor is not contiguous (shape {shape}, strides {strides:?}); call contiguous() first")]
    NotContiguous {
        op: &'static str,
        shape: Shape,
        strides: Vec<usize>,
    },
    /// Reshape to a different element count.
    #[error(
        "reshape: cannot view {from} ({} elements) as {to} ({} elements)",
        .from.numel(),
        .to.numel()
    )]
    Reshape { from: Shape, to: Shape },
    /// A dimension index outside the layout's rank.
    #[error("{op}: dimension {axis} is out of range for rank {rank}")]
    Axis {
        op: &'static str,
        axis: usize,
        rank: usize,
    },
    /// A slice with bad bounds or step.
    #[error(
        "slice: range {start}..{end} step {step} is invalid for dimension {axis} of size {size}"
    )]
    Slice {
        axis: usize,
        start: usize,
        end: usize,
        step: usize,
        size: usize,
    },
}

/// Where elements sit in their storage: shape, element strides, element offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    shape: Shape,
    strides: Strides,
    offset: usize,
}

impl Layout {
    /// A strided layout; fails unless `strides` has one entry per dimension (invariant 1).
    pub fn new(shape: Shape, strides: &[usize], offset: usize) -> Result<Self, LayoutError> {
        if strides.len() != shape.rank() {
            return Err(LayoutError::StridesRank {
                shape_rank: shape.rank(),
                strides_rank: strides.len(),
            });
        }
        Ok(Layout {
            shape,
            strides: Strides::from_slice(strides),
            offset,
        })
    }

    /// Row-major from element 0.
    pub fn contiguous(shape: Shape) -> Self {
        Layout {
            strides: shape.contiguous_strides(),
            shape,
            offset: 0,
        }
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    pub fn rank(&self) -> usize {
        self.shape.rank()
    }
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }
    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Whether the elements are row-major and dense (strides of size-1 dims do not matter;
    /// every empty layout is contiguous).
    pub fn is_contiguous(&self) -> bool {
        self.shape.is_contiguous(&self.strides)
    }

    /// Checks invariant 4: the layout lies inside storage of `len` elements.
    pub fn fits(&self, len: usize) -> Result<(), LayoutError> {
        let out_of_bounds = |end| LayoutError::OutOfBounds {
            shape: self.shape.clone(),
            strides: self.strides.to_vec(),
            offset: self.offset,
            end,
            len,
        };
        if self.numel() == 0 {
            // Touches nothing; the offset may sit at the end of the storage.
            return if self.offset <= len {
                Ok(())
            } else {
                Err(out_of_bounds(self.offset))
            };
        }
        let mut last = self.offset;
        for (&dim, &stride) in self.dims().iter().zip(&self.strides) {
            last = (dim - 1)
                .checked_mul(stride)
                .and_then(|reach| last.checked_add(reach))
                .ok_or_else(|| out_of_bounds(usize::MAX))?;
        }
        if last < len {
            Ok(())
        } else {
            Err(out_of_bounds(last + 1))
        }
    }

    /// The same elements as `to` (same count), for a contiguous layout only; same offset.
    pub fn reshape(&self, to: Shape) -> Result<Layout, LayoutError> {
        if to.numel() != self.numel() {
            return Err(LayoutError::Reshape {
                from: self.shape.clone(),
                to,
            });
        }
        if !self.is_contiguous() {
            return Err(LayoutError::NotContiguous {
                op: "reshape",
                shape: self.shape.clone(),
                strides: self.strides.to_vec(),
            });
        }
        Ok(Layout {
            offset: self.offset,
            ..Layout::contiguous(to)
        })
    }

    /// Two dimensions (and their strides) swapped.
    pub fn transpose(&self, dim0: usize, dim1: usize) -> Result<Layout, LayoutError> {
        let rank = self.rank();
        if let Some(&axis) = [dim0, dim1].iter().find(|&&axis| axis >= rank) {
            return Err(LayoutError::Axis {
                op: "transpose",
                axis,
                rank,
            });
        }
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.swap(dim0, dim1);
        strides.swap(dim0, dim1);
        Ok(Layout {
            shape: Shape::from(dims),
            strides,
            offset: self.offset,
        })
    }

    /// Elements `start, start+step, ...` below `end` along `axis`; `step > 0`,
    /// `start <= end <= size`.
    pub fn slice(
        &self,
        axis: usize,
        start: usize,
        end: usize,
        step: usize,
    ) -> Result<Layout, LayoutError> {
        let rank = self.rank();
        if axis >= rank {
            return Err(LayoutError::Axis {
                op: "slice",
                axis,
                rank,
            });
        }
        let size = self.dims()[axis];
        if step == 0 || start > end || end > size {
            return Err(LayoutError::Slice {
                axis,
                start,
                end,
                step,
                size,
            });
        }
        let mut dims = self.dims().to_vec();
        let mut strides = self.strides.clone();
        dims[axis] = (end - start).div_ceil(step);
        let offset = self.offset + start * strides[axis];
        strides[axis] *= step;
        Ok(Layout {
            shape: Shape::from(dims),
            strides,
            offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dims: &[usize], strides: &[usize], offset: usize) -> Layout {
        Layout::new(Shape::new(dims), strides, offset).unwrap()
    }

    #[test]
    fn layouts_must_fit_their_storage() {
        assert!(layout(&[2, 3], &[3, 1], 0).fits(6).is_ok());
        assert!(layout(&[3, 2], &[1, 3], 0).fits(6).is_ok());
        let err = layout(&[2, 3], &[3, 1], 1).fits(6).unwrap_err();
        assert!(
            matches!(err, LayoutError::OutOfBounds { end: 7, len: 6, .. }),
            "{err}"
        );
        assert!(matches!(
            Layout::new(Shape::new(&[2, 3]), &[1], 0),
            Err(LayoutError::StridesRank { .. })
        ));
        let huge = layout(&[2, 2], &[usize::MAX, 1], 0).fits(6).unwrap_err();
        assert!(matches!(
            huge,
            LayoutError::OutOfBounds {
                end: usize::MAX,
                ..
            }
        ));
    }

    #[test]
    fn empty_and_scalar_layouts() {
        assert!(Layout::contiguous(Shape::scalar()).fits(1).is_ok());
        assert!(Layout::contiguous(Shape::scalar()).fits(0).is_err());
        let empty = layout(&[0, 3], &[3, 1], 7);
        assert!(empty.is_contiguous());
        assert!(empty.fits(7).is_ok());
        assert!(empty.fits(6).is_err());
    }

    #[test]
    fn view_rules() {
        let base = layout(&[2, 3, 4], &[12, 4, 1], 5);
        assert_eq!(
            base.reshape(Shape::new(&[6, 4])),
            Ok(layout(&[6, 4], &[4, 1], 5))
        );
        let t = base.transpose(0, 2).unwrap();
        assert_eq!(t, layout(&[4, 3, 2], &[1, 4, 12], 5));
        assert!(matches!(
            t.reshape(Shape::new(&[24])),
            Err(LayoutError::NotContiguous { op: "reshape", .. })
        ));
        assert!(matches!(
            base.reshape(Shape::new(&[5])),
            Err(LayoutError::Reshape { .. })
        ));
        assert_eq!(
            base.slice(2, 1, 4, 2),
            Ok(layout(&[2, 3, 2], &[12, 4, 2], 6))
        );
        assert!(matches!(
            base.slice(2, 0, 4, 0),
            Err(LayoutError::Slice { step: 0, .. })
        ));
        assert!(matches!(
            base.transpose(0, 3),
            Err(LayoutError::Axis {
                axis: 3,
                rank: 3,
                ..
            })
        ));
    }
}
