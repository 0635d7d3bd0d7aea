//! The operator seam: non-owning views that kernels read ([`TensorView`]) and write
//! ([`TensorViewMut`]).
//!
//! A view is data plus a [`Layout`] (kiln-ir's one shape + element strides + element offset).
//! Invariants, checked when a view is built:
//! 1. The layout's strides have one entry per dimension and count elements, not bytes.
//! 2. The layout lies entirely inside the data ([`Layout::fits`]).
//! 3. A view never owns or allocates; whoever made the data owns it.

use half::{bf16, f16};
use std::ops::Range;

use kiln_ir::{DType, Layout, Shape};

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

    /// A mutable borrow of the same elements, for as long as `self` is borrowed.
    pub fn reborrow_mut(&mut self) -> DataMut<'_> {
        match self {
            DataMut::F32(s) => DataMut::F32(s),
            DataMut::F64(s) => DataMut::F64(s),
            DataMut::BF16(s) => DataMut::BF16(s),
            DataMut::F16(s) => DataMut::F16(s),
            DataMut::I32(s) => DataMut::I32(s),
            DataMut::I64(s) => DataMut::I64(s),
        }
    }

    /// The same elements, read-only for the rest of the borrow.
    pub fn into_data(self) -> Data<'a> {
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

/// A read-only, non-owning view: data and the [`Layout`] of its elements there.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    data: Data<'a>,
    layout: Layout,
}

impl<'a> TensorView<'a> {
    /// A strided view; fails unless it lies inside `data` (module invariants 1–2).
    pub fn new(
        data: impl Into<Data<'a>>,
        shape: impl Into<Shape>,
        strides: &[usize],
        offset: usize,
    ) -> Result<Self> {
        Self::with_layout(data, Layout::new(shape.into(), strides, offset)?)
    }

    /// `data` seen through `layout`; fails unless the layout lies inside it.
    pub fn with_layout(data: impl Into<Data<'a>>, layout: Layout) -> Result<Self> {
        let data = data.into();
        layout.fits(data.len())?;
        Ok(TensorView { data, layout })
    }

    /// A row-major view of the first `shape.numel()` elements of `data`.
    pub fn contiguous(data: impl Into<Data<'a>>, shape: impl Into<Shape>) -> Result<Self> {
        Self::with_layout(data, Layout::contiguous(shape.into()))
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }
    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }
    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.layout.offset()
    }
    pub fn data(&self) -> Data<'a> {
        self.data
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
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
        let range = contiguous_range(&self.layout, op, operand)?;
        Ok(&all[range])
    }
}

/// A writable, non-owning view: data and the [`Layout`] of its elements there.
#[derive(Debug)]
pub struct TensorViewMut<'a> {
    data: DataMut<'a>,
    layout: Layout,
}

impl<'a> TensorViewMut<'a> {
    /// A strided view; fails unless it lies inside `data` (module invariants 1–2).
    pub fn new(
        data: impl Into<DataMut<'a>>,
        shape: impl Into<Shape>,
        strides: &[usize],
        offset: usize,
    ) -> Result<Self> {
        Self::with_layout(data, Layout::new(shape.into(), strides, offset)?)
    }

    /// `data` seen through `layout`; fails unless the layout lies inside it.
    pub fn with_layout(data: impl Into<DataMut<'a>>, layout: Layout) -> Result<Self> {
        let data = data.into();
        layout.fits(data.len())?;
        Ok(TensorViewMut { data, layout })
    }

    /// A row-major view of the first `shape.numel()` elements of `data`.
    pub fn contiguous(data: impl Into<DataMut<'a>>, shape: impl Into<Shape>) -> Result<Self> {
        Self::with_layout(data, Layout::contiguous(shape.into()))
    }

    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }
    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }
    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.layout.offset()
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// A read-only view of the same elements.
    pub fn as_view(&self) -> TensorView<'_> {
        TensorView {
            data: self.data.reborrow(),
            layout: self.layout.clone(),
        }
    }

    /// A writable view of the same elements, for as long as `self` is borrowed.
    pub fn as_view_mut(&mut self) -> TensorViewMut<'_> {
        TensorViewMut {
            data: self.data.reborrow_mut(),
            layout: self.layout.clone(),
        }
    }

    /// The same view, read-only for the rest of the borrow (what was written, to be read).
    pub fn into_view(self) -> TensorView<'a> {
        TensorView {
            data: self.data.into_data(),
            layout: self.layout,
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
        let range = contiguous_range(&self.layout, op, operand)?;
        let all = T::of_data_mut(&mut self.data).ok_or(Error::DType {
            op,
            operand,
            expected: T::DTYPE,
            got: dtype,
        })?;
        Ok(&mut all[range])
    }
}

/// The elements a contiguous `layout` covers, or the error naming `op` and `operand`.
fn contiguous_range(
    layout: &Layout,
    op: &'static str,
    operand: &'static str,
) -> Result<Range<usize>> {
    if !layout.is_contiguous() {
        return Err(Error::NotContiguous {
            op,
            operand,
            shape: layout.shape().clone(),
            strides: layout.strides().to_vec(),
        });
    }
    Ok(layout.offset()..layout.offset() + layout.numel())
}

#[cfg(test)]
mod tests {
    use kiln_ir::LayoutError;

    use super::*;

    #[test]
    fn views_must_fit_their_data() {
        let data = [0f32; 6];
        assert!(TensorView::new(&data[..], [2, 3], &[3, 1], 0).is_ok());
        // Transposed view of the same data.
        assert!(TensorView::new(&data[..], [3, 2], &[1, 3], 0).is_ok());
        let err = TensorView::new(&data[..], [2, 3], &[3, 1], 1).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Layout(LayoutError::OutOfBounds { end: 7, len: 6, .. })
            ),
            "{err}"
        );
        assert!(matches!(
            TensorView::new(&data[..], [2, 3], &[1], 0),
            Err(Error::Layout(LayoutError::StridesRank { .. }))
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
