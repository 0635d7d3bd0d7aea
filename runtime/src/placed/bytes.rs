//! Raw bytes seen as elements of one dtype: how workspaces, the planned executor's arena and
//! a device buffer's bytes read back become the typed slices and views kernels take, without
//! unsafe code (`bytemuck` checks alignment).
//!
//! Invariant: a byte slice is seen as the longest whole number of elements it holds; trailing
//! bytes that do not make a whole element are never seen. Misaligned bytes give `None`, never a
//! panic.

use half::{bf16, f16};
use kiln_ir::DType;
use kiln_kernels::{Data, DataMut, TensorView, TensorViewMut};

use super::ValueLayout;
use crate::error::{Error, Result};

/// The longest prefix of `bytes` that is a whole number of `size`-byte elements.
fn whole(len: usize, size: usize) -> usize {
    len - len % size
}

/// `bytes` as elements of `dtype`, or `None` when they are not aligned for it (no bytes are
/// no elements, wherever they point).
pub(crate) fn data(bytes: &[u8], dtype: DType) -> Option<Data<'_>> {
    let bytes = &bytes[..whole(bytes.len(), dtype.size_bytes())];
    if bytes.is_empty() {
        return Some(empty(dtype));
    }
    Some(match dtype {
        DType::F32 => Data::F32(bytemuck::try_cast_slice::<u8, f32>(bytes).ok()?),
        DType::F64 => Data::F64(bytemuck::try_cast_slice::<u8, f64>(bytes).ok()?),
        DType::BF16 => Data::BF16(bytemuck::try_cast_slice::<u8, bf16>(bytes).ok()?),
        DType::F16 => Data::F16(bytemuck::try_cast_slice::<u8, f16>(bytes).ok()?),
        DType::I32 => Data::I32(bytemuck::try_cast_slice::<u8, i32>(bytes).ok()?),
        DType::I64 => Data::I64(bytemuck::try_cast_slice::<u8, i64>(bytes).ok()?),
    })
}

/// `bytes` as mutable elements of `dtype`, or `None` when they are not aligned for it (no
/// bytes are no elements, wherever they point).
pub(crate) fn data_mut(bytes: &mut [u8], dtype: DType) -> Option<DataMut<'_>> {
    let end = whole(bytes.len(), dtype.size_bytes());
    let bytes = &mut bytes[..end];
    if bytes.is_empty() {
        return Some(empty_mut(dtype));
    }
    Some(match dtype {
        DType::F32 => DataMut::F32(bytemuck::try_cast_slice_mut::<u8, f32>(bytes).ok()?),
        DType::F64 => DataMut::F64(bytemuck::try_cast_slice_mut::<u8, f64>(bytes).ok()?),
        DType::BF16 => DataMut::BF16(bytemuck::try_cast_slice_mut::<u8, bf16>(bytes).ok()?),
        DType::F16 => DataMut::F16(bytemuck::try_cast_slice_mut::<u8, f16>(bytes).ok()?),
        DType::I32 => DataMut::I32(bytemuck::try_cast_slice_mut::<u8, i32>(bytes).ok()?),
        DType::I64 => DataMut::I64(bytemuck::try_cast_slice_mut::<u8, i64>(bytes).ok()?),
    })
}

fn empty(dtype: DType) -> Data<'static> {
    match dtype {
        DType::F32 => Data::F32(&[]),
        DType::F64 => Data::F64(&[]),
        DType::BF16 => Data::BF16(&[]),
        DType::F16 => Data::F16(&[]),
        DType::I32 => Data::I32(&[]),
        DType::I64 => Data::I64(&[]),
    }
}

fn empty_mut(dtype: DType) -> DataMut<'static> {
    match dtype {
        DType::F32 => DataMut::F32(&mut []),
        DType::F64 => DataMut::F64(&mut []),
        DType::BF16 => DataMut::BF16(&mut []),
        DType::F16 => DataMut::F16(&mut []),
        DType::I32 => DataMut::I32(&mut []),
        DType::I64 => DataMut::I64(&mut []),
    }
}

/// The bytes of typed elements (every dtype is plain old data).
pub(crate) fn of_data(data: Data<'_>) -> &[u8] {
    match data {
        Data::F32(s) => bytemuck::cast_slice(s),
        Data::F64(s) => bytemuck::cast_slice(s),
        Data::BF16(s) => bytemuck::cast_slice(s),
        Data::F16(s) => bytemuck::cast_slice(s),
        Data::I32(s) => bytemuck::cast_slice(s),
        Data::I64(s) => bytemuck::cast_slice(s),
    }
}

/// Zeroed, 8-byte aligned storage for `bytes` bytes (aligned for every dtype).
pub(crate) fn aligned_zeros(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

/// The first `len` bytes of aligned storage (`len` at most its size).
pub(crate) fn prefix_mut(words: &mut [u64], len: usize) -> &mut [u8] {
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(words);
    let len = len.min(bytes.len());
    &mut bytes[..len]
}

/// A kernel view of the value laid out as `layout` in `bytes`.
pub(crate) fn read_view<'a>(bytes: &'a [u8], layout: &ValueLayout) -> Result<TensorView<'a>> {
    let data = data(bytes, layout.dtype).ok_or_else(|| misaligned(layout))?;
    Ok(TensorView::with_layout(data, layout.layout.clone())?)
}

/// A writable kernel view of the value laid out as `layout` in `bytes`.
pub(crate) fn write_view<'a>(
    bytes: &'a mut [u8],
    layout: &ValueLayout,
) -> Result<TensorViewMut<'a>> {
    let data = data_mut(bytes, layout.dtype).ok_or_else(|| misaligned(layout))?;
    Ok(TensorViewMut::with_layout(data, layout.layout.clone())?)
}

fn misaligned(layout: &ValueLayout) -> Error {
    kiln_kernels::Error::Argument {
        op: "execute",
        argument: "buffer",
        reason: format!("its bytes are not aligned for {}", layout.dtype),
    }
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_through_every_dtype() {
        let mut words = aligned_zeros(16);
        let bytes = prefix_mut(&mut words, 14);
        bytes.copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
        for dtype in DType::ALL {
            let seen = data(bytes, dtype).unwrap();
            // Trailing bytes that make no whole element are not seen.
            assert_eq!(seen.len(), 14 / dtype.size_bytes(), "{dtype}");
            let back = of_data(seen);
            assert_eq!(back, &bytes[..back.len()], "{dtype}");
        }
        let DataMut::F32(floats) = data_mut(bytes, DType::F32).unwrap() else {
            panic!("not f32");
        };
        floats[0] = -1.5;
        assert_eq!(&bytes[..4], &(-1.5f32).to_ne_bytes());
    }

    #[test]
    fn misaligned_bytes_are_refused() {
        let mut words = aligned_zeros(16);
        let bytes = prefix_mut(&mut words, 16);
        assert!(data(&bytes[2..], DType::F32).is_none());
        assert!(data_mut(&mut bytes[4..], DType::F64).is_none());
        assert!(data(&bytes[2..], DType::BF16).is_some());
        // Empty (or shorter than one element) is fine at any address.
        assert_eq!(data(&bytes[1..1], DType::F64).unwrap().len(), 0);
        assert_eq!(data_mut(&mut bytes[1..4], DType::F32).unwrap().len(), 0);
    }
}
