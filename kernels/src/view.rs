//! The operator seam: non-owning views that kernels read ([`TensorView`]) and write
//! ([`TensorViewMut`]).
//!
//! Invariants, checked when a view is built:
//! 1. `strides` has one entry per dimension; strides and `offset` count elements, not bytes.
//! 2. The view lies entirely inside its data: for a non-empty view,
//!    `offset + Σ (dim_i − 1)·stride_i < data.len()`. An empty view (a zero-sized dim) touches
//!    nothing and only needs `offset <= data.len()`.
//! 3. A view never owns or allocates; whoever made the data owns it.

use half::{bf16, f16};
use kiln_ir::{DType, Shape, Strides};

use crate::element::Element;
use crate::error::{Error, Result};

/// Borrowed elements of one dtype.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
    BF16(&'a [bf16]),
    F16(&'a [f16]),
    I32(&'a [i32]),
    I64(&'a [i64]),
}

/// Mutably borrowed elements of one dtype.
#[derive(Debug)]
pub enum DataMut<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
    BF16(&'a mut [bf16]),
    F16(&'a mut [f16]),
    I32(&'a mut [i32]),
    I64(&'a mut [i64]),
}

macro_rules! each_variant {
    ($data:expr, $s:ident => $body:expr) => {
        match $data {
            Self::F32($s) => $body,
            Self::F64($s) => $body,
            Self::BF16($s) => $body,
            Self::F16($s) => $body,
            Self::I32($s) => $body,
            Self::I64($s) => $body,
        }
    };
}

impl<'a> Data<'a> {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::BF16(_) => DType::BF16,
            Data::F16(_) => DType::F16,
            Data::I32(_) => DType::I32,
            Data::I64(_) => DType::I64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_variant!(self, s => s.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<'a> DataMut<'a> {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        self.reborrow().dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        each_variant!(self, s => s.len())
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A shared borrow of the same elements.
    pub fn reborrow(&self) -> Data<'_> {
        match self {
            DataMut::F32(s) => Data::F32(s),
            DataMut::F64(s) => Data::F64(s),
            DataMut::BF16(s) => Data::BF16(s),
            DataMut::F16(s) => Data::F16(s),
            DataMut::I32(s) => Data::I32(s),
            DataMut::I64(s) => Data::I64(s),
        }
    }
}

impl<'a, T: Element> From<&'a [T]> for Data<'a> {
    fn from(slice: &'a [T]) -> Self {
        T::data(slice)
    }
}

impl<'a, T: Element> From<&'a Vec<T>> for Data<'a> {
    fn from(v: &'a Vec<T>) -> Self {
        T::data(v)
    }
}

impl<'a, T: Element> From<&'a mut [T]> for DataMut<'a> {
    fn from(slice: &'a mut [T]) -> Self {
        T::data_mut(slice)
    }
}

impl<'a, T: Element> From<&'a mut Vec<T>> for DataMut<'a> {
    fn from(v: &'a mut Vec<T>) -> Self {
        T::data_mut(v)
    }
}

/// Checks invariants 1 and 2 of the module doc: `shape` with `strides` at `offset` lies inside
/// data of `len` elements (the one bounds rule every layer uses).
pub fn check_fits(shape: &Shape, strides: &[usize], offset: usize, len: usize) -> Result<()> {
    if strides.len() != shape.rank() {
        return Err(Error::StridesRank {
            shape_rank: shape.rank(),
            strides_rank: strides.len(),
        });
    }
    let out_of_bounds = |end| Error::ViewOutOfBounds {
        shape: shape.clone(),
        strides: strides.to_vec(),
        offset,
        end,
        len,
    };
    if shape.numel() == 0 {
        // Touches nothing; the offset may sit at the end of the data.
        return if offset <= len {
            Ok(())
        } else {
            Err(out_of_bounds(offset))
        };
    }
    let mut last = offset;
    for (&dim, &stride) in shape.dims().iter().zip(strides) {
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

/// A read-only, non-owning view: data, shape, element strides, element offset.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    data: Data<'a>,
    shape: Shape,
    strides: Strides,
    offset: usize,
}

impl<'a> TensorView<'a> {
    /// A strided view; fails unless it lies inside `data` (module invariants 1–2).
    pub fn new(
        data: impl Into<Data<'a>>,
        shape: impl Into<Shape>,
        strides: &[usize],
        offset: usize,
    ) -> Result<Self> {
        let (data, shape) = (data.into(), shape.into());
        check_fits(&shape, strides, offset, data.len())?;
        Ok(TensorView {
            data,
            shape,
            strides: Strides::from_slice(strides),
            offset,
        })
    }

    /// A row-major view of the first `shape.numel()` elements of `data`.
    pub fn contiguous(data: impl Into<Data<'a>>, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        let strides = shape.contiguous_strides();
        Self::new(data, shape, &strides, 0)
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn data(&self) -> Data<'a> {
        self.data
    }
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }
    pub fn is_contiguous(&self) -> bool {
        self.shape.is_contiguous(&self.strides)
    }

    /// The elements of a contiguous view as a typed slice, or an error naming `op` and
    /// `operand` if the dtype is not `T` or the layout is not contiguous.
    pub fn slice<T: Element>(&self, op: &'static str, operand: &'static str) -> Result<&'a [T]> {
        let all = T::of_data(self.data).ok_or(Error::DType {
            op,
            operand,
            expected: T::DTYPE,
            got: self.dtype(),
        })?;
        if !self.is_contiguous() {
            return Err(Error::NotContiguous {
                op,
                operand,
                shape: self.shape.clone(),
                strides: self.strides.to_vec(),
            });
        }
        Ok(&all[self.offset..self.offset + self.numel()])
    }
}

/// A writable, non-owning view: data, shape, element strides, element offset.
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    data: DataMut<'a>,
    shape: Shape,
    strides: Strides,
    offset: usize,
}

impl<'a> TensorViewMut<'a> {
    /// A strided view; fails unless it lies inside `data` (module invariants 1–2).
    pub fn new(
        data: impl Into<DataMut<'a>>,
        shape: impl Into<Shape>,
        strides: &[usize],
        offset: usize,
    ) -> Result<Self> {
        let (data, shape) = (data.into(), shape.into());
        check_fits(&shape, strides, offset, data.len())?;
        Ok(TensorViewMut {
            data,
            shape,
            strides: Strides::from_slice(strides),
            offset,
        })
    }

    /// A row-major view of the first `shape.numel()` elements of `data`.
    pub fn contiguous(data: impl Into<DataMut<'a>>, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        let strides = shape.contiguous_strides();
        Self::new(data, shape, &strides, 0)
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }
    pub fn is_contiguous(&self) -> bool {
        self.shape.is_contiguous(&self.strides)
    }

    /// A read-only view of the same elements.
    pub fn as_view(&self) -> TensorView<'_> {
        TensorView {
            data: self.data.reborrow(),
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            offset: self.offset,
        }
    }

    /// The elements of a contiguous view as a typed mutable slice, or an error naming `op` and
    /// `operand` if the dtype is not `T` or the layout is not contiguous.
    pub fn slice_mut<T: Element>(
        &mut self,
        op: &'static str,
        operand: &'static str,
    ) -> Result<&mut [T]> {
        let dtype = self.dtype();
        if !self.is_contiguous() {
            return Err(Error::NotContiguous {
                op,
                operand,
                shape: self.shape.clone(),
                strides: self.strides.to_vec(),
            });
        }
        let (offset, numel) = (self.offset, self.numel());
        let all = T::of_data_mut(&mut self.data).ok_or(Error::DType {
            op,
            operand,
            expected: T::DTYPE,
            got: dtype,
        })?;
        Ok(&mut all[offset..offset + numel])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn views_must_fit_their_data() {
        let data = [0f32; 6];
        assert!(TensorView::new(&data[..], [2, 3], &[3, 1], 0).is_ok());
        // Transposed view of the same data.
        assert!(TensorView::new(&data[..], [3, 2], &[1, 3], 0).is_ok());
        let err = TensorView::new(&data[..], [2, 3], &[3, 1], 1).unwrap_err();
        assert!(
            matches!(err, Error::ViewOutOfBounds { end: 7, len: 6, .. }),
            "{err}"
        );
        assert!(matches!(
            TensorView::new(&data[..], [2, 3], &[1], 0),
            Err(Error::StridesRank { .. })
        ));
    }

    #[test]
    fn empty_and_scalar_views() {
        let data = [1.5f64];
        let scalar = TensorView::new(&data[..], Shape::scalar(), &[], 0).unwrap();
        assert_eq!(scalar.numel(), 1);
        assert_eq!(scalar.slice::<f64>("t", "x").unwrap(), &[1.5]);
        let empty = TensorView::new(&data[..], [0, 4], &[4, 1], 1).unwrap();
        assert_eq!(empty.slice::<f64>("t", "x").unwrap().len(), 0);
    }

    #[test]
    fn slice_checks_dtype_and_layout() {
        let data = [0i32; 6];
        let v = TensorView::contiguous(&data[..], [2, 3]).unwrap();
        let err = v.slice::<f32>("op", "ids").unwrap_err();
        assert_eq!(
            err.to_string(),
            "op: operand `ids` has dtype i32, expected f32"
        );
        let t = TensorView::new(&data[..], [3, 2], &[1, 3], 0).unwrap();
        assert!(matches!(
            t.slice::<i32>("op", "ids"),
            Err(Error::NotContiguous { .. })
        ));
    }
}
