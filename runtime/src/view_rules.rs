//! The view rules — reshape, transpose, positive-step slice — as pure arithmetic on a layout
//! (shape, element strides, element offset). [`Tensor`](crate::Tensor)'s zero-copy views and the
//! planned executor's arena layouts both go through here, so a value has the same layout in
//! both; neither allocates nor touches data. Whether the result fits its storage is the
//! caller's check (the kernels' view bounds rule).

use kiln_ir::{Shape, Strides};

use crate::error::{Error, Result};

/// Where a view's elements sit in its storage, in elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ViewLayout {
    pub shape: Shape,
    pub strides: Strides,
    pub offset: usize,
}

impl ViewLayout {
    /// The same elements as `to` (same count), for a row-major layout only; same offset.
    pub fn reshape(&self, to: Shape) -> Result<ViewLayout> {
        if to.numel() != self.shape.numel() {
            return Err(Error::Reshape {
                from: self.shape.clone(),
                to,
            });
        }
        if !self.shape.is_contiguous(&self.strides) {
            return Err(Error::NotContiguous {
                op: "reshape",
                shape: self.shape.clone(),
                strides: self.strides.to_vec(),
            });
        }
        Ok(ViewLayout {
            strides: to.contiguous_strides(),
            shape: to,
            offset: self.offset,
        })
    }

    /// Two dimensions (and their strides) swapped.
    pub fn transpose(&self, dim0: usize, dim1: usize) -> Result<ViewLayout> {
        let rank = self.shape.rank();
        if let Some(&axis) = [dim0, dim1].iter().find(|&&axis| axis >= rank) {
            return Err(Error::Axis {
                op: "transpose",
                axis,
                rank,
            });
        }
        let mut dims = self.shape.dims().to_vec();
        let mut strides = self.strides.clone();
        dims.swap(dim0, dim1);
        strides.swap(dim0, dim1);
        Ok(ViewLayout {
            shape: Shape::new(&dims),
            strides,
            offset: self.offset,
        })
    }

    /// Elements `start, start+step, ...` below `end` along `axis`; `step > 0`,
    /// `start <= end <= size`.
    pub fn slice(&self, axis: usize, start: usize, end: usize, step: usize) -> Result<ViewLayout> {
        let rank = self.shape.rank();
        if axis >= rank {
            return Err(Error::Axis {
                op: "slice",
                axis,
                rank,
            });
        }
        let size = self.shape.dims()[axis];
        if step == 0 || start > end || end > size {
            return Err(Error::Slice {
                axis,
                start,
                end,
                step,
                size,
            });
        }
        let mut dims = self.shape.dims().to_vec();
        let mut strides = self.strides.clone();
        dims[axis] = (end - start).div_ceil(step);
        let offset = self.offset + start * strides[axis];
        strides[axis] *= step;
        Ok(ViewLayout {
            shape: Shape::new(&dims),
            strides,
            offset,
        })
    }
}
