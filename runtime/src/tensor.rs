//! Tensor: a [`Layout`] (shape, element strides, element offset) over a shared [`Storage`].
//!
//! Tensor N0 invariants (DESIGN.md), each kept by construction or checked with an error:
//! 1. A scalar (shape `{}`) has one element; zero-sized dimensions are valid.
//! 2. Dimensions, strides and offsets are never negative: the signed entry point
//!    [`Tensor::as_strided`] rejects them.
//! 3. Offsets and strides count elements, not bytes.
//! 4. A tensor lies entirely inside its storage ([`Layout::fits`], checked whenever a view is
//!    made).
//! 5. `reshape` is zero-copy and needs a contiguous tensor; `transpose` and positive-step
//!    `slice` are zero-copy (the view rules of [`Layout`]); `contiguous()` is the one call that
//!    copies. Nothing else copies behind the caller's back.

use kiln_ir::{DType, Layout, Shape, Strides};
use kiln_kernels::{Buffer, Element, TensorView, TensorViewMut};

use crate::device::Device;
use crate::error::{Error, Result};
use crate::storage::{Storage, StorageRead, StorageWrite};

/// A view of a storage: the layout of its elements there.
#[derive(Clone, Debug)]
pub struct Tensor {
    storage: Storage,
    layout: Layout,
}

impl Tensor {
    /// A view of this tensor's storage with `layout`, checked to fit it (invariant 4).
    fn with_layout(&self, layout: Layout) -> Result<Tensor> {
        layout.fits(self.storage.len())?;
        Ok(Tensor {
            storage: self.storage.clone(),
            layout,
        })
    }

    /// A contiguous tensor owning `values`; their count must equal the shape's element count.
    pub fn from_vec<T: Element>(values: Vec<T>, shape: impl Into<Shape>) -> Result<Self> {
        Self::from_buffer(Buffer::from_vec(values), shape)
    }

    /// A contiguous tensor owning `buffer`; its length must equal the shape's element count.
    pub fn from_buffer(buffer: Buffer, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if buffer.len() != shape.numel() {
            return Err(Error::DataLength {
                numel: shape.numel(),
                len: buffer.len(),
                shape,
            });
        }
        Ok(Tensor {
            storage: Storage::from_buffer(buffer),
            layout: Layout::contiguous(shape),
        })
    }

    /// A contiguous tensor of zeros.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: Device) -> Self {
        let shape = shape.into();
        Tensor {
            storage: Storage::zeros(device, dtype, shape.numel()),
            layout: Layout::contiguous(shape),
        }
    }

    /// A scalar (shape `{}`) holding `value` rounded to `dtype`.
    pub fn scalar(value: f64, dtype: DType) -> Self {
        let out = Tensor::zeros(Shape::scalar(), dtype, Device::Cpu);
        // A fresh tensor is contiguous and unshared, so the fill cannot fail.
        let filled = out.fill(value);
        debug_assert!(filled.is_ok());
        out
    }

    pub fn storage(&self) -> &Storage {
        &self.storage
    }
    /// Where the elements sit in the storage.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }
    pub fn shape(&self) -> &Shape {
        self.layout.shape()
    }
    pub fn dims(&self) -> &[usize] {
        self.layout.dims()
    }
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }
    /// Element strides, one per dimension.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }
    /// Offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.layout.offset()
    }
    pub fn dtype(&self) -> DType {
        self.storage.dtype()
    }
    pub fn device(&self) -> Device {
        self.storage.device()
    }
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// A view with the given signed shape, strides and offset over the same storage. Negative
    /// values and views that leave the storage are rejected.
    pub fn as_strided(&self, shape: &[i64], strides: &[i64], offset: i64) -> Result<Tensor> {
        let shape = Shape::from_signed(shape)?;
        if strides.len() != shape.rank() {
            return Err(kiln_ir::Error::RankMismatch {
                shape_rank: shape.rank(),
                strides_rank: strides.len(),
            }
            .into());
        }
        let mut unsigned = Strides::new();
        for (axis, &value) in strides.iter().enumerate() {
            let stride = usize::try_from(value)
                .map_err(|_| kiln_ir::Error::NegativeStride { axis, value })?;
            unsigned.push(stride);
        }
        let offset = usize::try_from(offset).map_err(|_| Error::NegativeOffset { offset })?;
        self.with_layout(Layout::new(shape, &unsigned, offset)?)
    }

    /// The same elements under another shape with the same element count; zero-copy, and only
    /// for contiguous tensors (call `contiguous()` first otherwise).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor> {
        self.with_layout(self.layout.reshape(shape.into())?)
    }

    /// Swaps two dimensions; zero-copy.
    pub fn transpose(&self, dim0: usize, dim1: usize) -> Result<Tensor> {
        self.with_layout(self.layout.transpose(dim0, dim1)?)
    }

    /// Elements `start, start+step, ...` below `end` along `axis`; zero-copy. `step` must be
    /// positive and `start <= end <= size`.
    pub fn slice(&self, axis: usize, start: usize, end: usize, step: usize) -> Result<Tensor> {
        self.with_layout(self.layout.slice(axis, start, end, step)?)
    }

    /// A row-major tensor with the same elements: `self` (sharing storage) when already
    /// contiguous, else a fresh copy. This is the one place a view materializes.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        self.deep_clone()
    }

    /// A fresh contiguous CPU tensor of this one's values in `dtype` (rounded to nearest
    /// even where it is narrower, as `Cast` does).
    pub fn cast_to(&self, dtype: DType) -> Result<Tensor> {
        let out = Tensor::zeros(self.shape().clone(), dtype, Device::Cpu);
        self.read_with(|source| {
            out.write_with(|mut target| kiln_kernels::copy::cast(&source, &mut target))
        })???;
        Ok(out)
    }

    /// A fresh contiguous copy that shares nothing with `self`.
    pub fn deep_clone(&self) -> Result<Tensor> {
        let out = Tensor::zeros(self.shape().clone(), self.dtype(), self.device());
        out.write_with(|mut dst| self.read_with(|src| kiln_kernels::copy::copy(&src, &mut dst)))???;
        Ok(out)
    }

    /// Sets every element to `value` (rounded to the dtype), in place. Needs a contiguous tensor.
    pub fn fill(&self, value: f64) -> Result<()> {
        self.write_with(|mut view| kiln_kernels::copy::fill(&mut view, value))??;
        Ok(())
    }

    /// A read-only kernel view of this tensor through a guard of its storage.
    pub fn view<'g>(&self, guard: &'g StorageRead<'_>) -> Result<TensorView<'g>> {
        Ok(TensorView::with_layout(guard.data(), self.layout.clone())?)
    }

    /// A writable kernel view of this tensor through a guard of its storage.
    pub fn view_mut<'g>(&self, guard: &'g mut StorageWrite<'_>) -> Result<TensorViewMut<'g>> {
        Ok(TensorViewMut::with_layout(
            guard.data_mut(),
            self.layout.clone(),
        )?)
    }

    /// Runs `f` on a read-only kernel view of this tensor.
    pub fn read_with<R>(&self, f: impl FnOnce(TensorView<'_>) -> R) -> Result<R> {
        let guard = self.storage.read()?;
        Ok(f(self.view(&guard)?))
    }

    /// Runs `f` on a writable kernel view of this tensor.
    pub fn write_with<R>(&self, f: impl FnOnce(TensorViewMut<'_>) -> R) -> Result<R> {
        let mut guard = self.storage.write()?;
        Ok(f(self.view_mut(&mut guard)?))
    }

    /// The elements in row-major order of the shape, as `T` (dtype must match).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(Error::DType {
                op: "to_vec",
                expected: T::DTYPE,
                got: self.dtype(),
            });
        }
        let dense = self.contiguous()?;
        Ok(dense.read_with(|view| view.slice::<T>("to_vec", "self").map(<[T]>::to_vec))??)
    }

    /// The elements in row-major order, converted to f64 (any dtype).
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        let dense = self.contiguous()?;
        dense
            .read_with(|view| {
                let mut out = Vec::with_capacity(view.numel());
                macro_rules! take {
                    ($t:ty) => {
                        out.extend(
                            view.slice::<$t>("to_f64_vec", "self")?
                                .iter()
                                .map(|x| x.to_f64()),
                        )
                    };
                }
                match view.dtype() {
                    DType::F32 => take!(f32),
                    DType::F64 => take!(f64),
                    DType::BF16 => take!(half::bf16),
                    DType::F16 => take!(half::f16),
                    DType::I32 => take!(i32),
                    DType::I64 => take!(i64),
                }
                Ok::<_, kiln_kernels::Error>(out)
            })?
            .map_err(Error::from)
    }
}
