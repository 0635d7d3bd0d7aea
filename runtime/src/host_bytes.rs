//! Tensors to and from host bytes that kiln does not own: the seam the Python and C bindings
//! cross. A caller describes foreign memory as bytes plus a [`Layout`] (element strides and
//! offset); these functions check that the layout lies inside those bytes before touching one,
//! and always copy — a kiln [`Tensor`] never borrows memory it does not own.
//!
//! Invariants:
//! 1. Nothing outside `bytes` is read or written: the layout is checked with [`Layout::fits`]
//!    against the whole elements `bytes` holds (a trailing partial element is not accessible).
//! 2. A destination whose elements overlap (a zero or too small stride on a dimension of more
//!    than one element) is refused: writing it would depend on the order of the writes.
//! 3. Elements are copied as bytes in native byte order: the bits of every value are kept.

use kiln_ir::{DType, Layout};
use kiln_kernels::{Buffer, Data, DataMut};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Byte offsets of every element of `layout`, in row-major order of its shape. The layout has
/// been checked to fit, so no offset overflows.
fn element_offsets(layout: &Layout, size: usize) -> impl Iterator<Item = usize> + '_ {
    let dims = layout.dims();
    let strides = layout.strides();
    let mut index = vec![0usize; dims.len()];
    let mut remaining = layout.numel();
    std::iter::from_fn(move || {
        if remaining == 0 {
            return None;
        }
        remaining -= 1;
        let element: usize =
            layout.offset() + index.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
        // Advance the row-major index (the last dimension fastest).
        for axis in (0..dims.len()).rev() {
            index[axis] += 1;
            if index[axis] < dims[axis] {
                break;
            }
            index[axis] = 0;
        }
        Some(element * size)
    })
}

/// Checks invariant 1 for `layout` over `bytes` of `dtype` elements.
fn check_fits(layout: &Layout, dtype: DType, bytes: usize) -> Result<()> {
    Ok(layout.fits(bytes / dtype.size_bytes())?)
}

/// Checks invariant 2: no two elements of `layout` share an address.
fn check_no_overlap(layout: &Layout) -> Result<()> {
    let mut axes: Vec<(usize, usize)> = (layout.dims().iter().copied())
        .zip(layout.strides().iter().copied())
        .filter(|&(dim, _)| dim > 1)
        .collect();
    axes.sort_by_key(|&(_, stride)| stride);
    // Each stride must step past every element the smaller strides reach.
    let mut span = 1usize;
    for (dim, stride) in axes {
        if stride < span {
            return Err(Error::HostBytes {
                reason: format!(
                    "a destination with dims {:?} and strides {:?} writes some elements to \
                     the same address",
                    layout.dims(),
                    layout.strides()
                ),
            });
        }
        span = stride.saturating_mul(dim);
    }
    Ok(())
}

/// The elements of `data` as bytes.
fn bytes_of(data: Data<'_>) -> &[u8] {
    match data {
        Data::F32(v) => bytemuck::cast_slice(v),
        Data::F64(v) => bytemuck::cast_slice(v),
        Data::BF16(v) => bytemuck::cast_slice(v),
        Data::F16(v) => bytemuck::cast_slice(v),
        Data::I32(v) => bytemuck::cast_slice(v),
        Data::I64(v) => bytemuck::cast_slice(v),
    }
}

/// The elements of `data` as mutable bytes.
fn bytes_mut(data: DataMut<'_>) -> &mut [u8] {
    match data {
        DataMut::F32(v) => bytemuck::cast_slice_mut(v),
        DataMut::F64(v) => bytemuck::cast_slice_mut(v),
        DataMut::BF16(v) => bytemuck::cast_slice_mut(v),
        DataMut::F16(v) => bytemuck::cast_slice_mut(v),
        DataMut::I32(v) => bytemuck::cast_slice_mut(v),
        DataMut::I64(v) => bytemuck::cast_slice_mut(v),
    }
}

impl Tensor {
    /// A contiguous host tensor holding a copy of the `dtype` elements that `layout` selects in
    /// `bytes` (see the module's invariants).
    pub fn from_host_bytes(dtype: DType, layout: &Layout, bytes: &[u8]) -> Result<Tensor> {
        check_fits(layout, dtype, bytes.len())?;
        let size = dtype.size_bytes();
        let mut buffer = Buffer::zeros(dtype, layout.numel());
        let dense = bytes_mut(buffer.data_mut());
        for (element, at) in dense
            .chunks_exact_mut(size)
            .zip(element_offsets(layout, size))
        {
            element.copy_from_slice(&bytes[at..at + size]);
        }
        Tensor::from_buffer(buffer, layout.shape().clone())
    }

    /// Copies this tensor's elements into the elements `layout` selects in `bytes`; the
    /// layout's shape must be this tensor's (see the module's invariants).
    pub fn copy_to_host_bytes(&self, layout: &Layout, bytes: &mut [u8]) -> Result<()> {
        if layout.shape() != self.shape() {
            return Err(Error::HostBytes {
                reason: format!(
                    "the destination has shape {}, the tensor {}",
                    layout.shape(),
                    self.shape()
                ),
            });
        }
        check_fits(layout, self.dtype(), bytes.len())?;
        check_no_overlap(layout)?;
        let dense = self.contiguous()?;
        let size = self.dtype().size_bytes();
        dense.read_with(|view| {
            let source = bytes_of(view.data());
            let start = view.offset() * size;
            let elements = source[start..start + view.numel() * size].chunks_exact(size);
            for (element, at) in elements.zip(element_offsets(layout, size)) {
                bytes[at..at + size].copy_from_slice(element);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Shape;

    fn layout(dims: &[usize], strides: &[usize], offset: usize) -> Layout {
        Layout::new(Shape::from(dims), strides, offset).unwrap()
    }

    #[test]
    fn reads_a_strided_view_and_writes_it_back_bit_for_bit() {
        let values: Vec<f32> = (0..12).map(|i| i as f32 * 0.5 - 1.0).collect();
        let bytes: Vec<u8> = bytemuck::cast_slice(&values).to_vec();
        // The transpose of a [3,4] row-major matrix, from element 0.
        let transposed = layout(&[4, 3], &[1, 4], 0);
        let tensor = Tensor::from_host_bytes(DType::F32, &transposed, &bytes).unwrap();
        assert_eq!(tensor.dims(), &[4, 3]);
        let read = tensor.to_vec::<f32>().unwrap();
        assert_eq!(read[..3], [values[0], values[4], values[8]]);
        let mut out = vec![0u8; bytes.len()];
        tensor.copy_to_host_bytes(&transposed, &mut out).unwrap();
        assert_eq!(out, bytes);
    }

    #[test]
    fn refuses_layouts_outside_the_bytes() {
        let bytes = vec![0u8; 4 * 6 + 3];
        // 7 elements reach byte 28, past the 6 whole elements the bytes hold.
        let error = Tensor::from_host_bytes(DType::F32, &layout(&[7], &[1], 0), &bytes);
        assert!(matches!(error, Err(Error::Layout(_))), "{error:?}");
        let fits = Tensor::from_host_bytes(DType::F32, &layout(&[3], &[2], 0), &bytes);
        assert_eq!(fits.unwrap().numel(), 3);
    }

    #[test]
    fn refuses_overlapping_destinations_and_other_shapes() {
        let tensor = Tensor::from_vec(vec![1i64, 2, 3], [3]).unwrap();
        let mut bytes = vec![0u8; 64];
        let broadcast = tensor.copy_to_host_bytes(&layout(&[3], &[0], 0), &mut bytes);
        assert!(
            matches!(broadcast, Err(Error::HostBytes { .. })),
            "{broadcast:?}"
        );
        let other = tensor.copy_to_host_bytes(&layout(&[2], &[1], 0), &mut bytes);
        assert!(matches!(other, Err(Error::HostBytes { .. })), "{other:?}");
        assert!(bytes.iter().all(|&b| b == 0), "nothing written on refusal");
    }
}
