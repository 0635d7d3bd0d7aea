//! Element conversions between safetensors bytes and kiln dtypes.
//!
//! Reading: little-endian bytes of a stored dtype become a [`Buffer`] of the asked dtype. The
//! bytes come from a memory map at any address, so each element is assembled with
//! `from_le_bytes` from a chunk (never a cast of an unaligned slice).
//!
//! Float → float is [`Element`]'s: `T::from_f64(s.to_f64())`, exact when widening (every
//! stored float is an f64) and rounded once to nearest, ties to even, when narrowing.
//! Integer → integer widens, or narrows only when the value fits. Float ↔ integer is refused by
//! the caller.

use half::{bf16, f16};
use kiln_ir::DType;
use kiln_kernels::{Buffer, Element};

/// An element with a fixed little-endian byte form.
pub(super) trait LittleEndian: Copy {
    const WIDTH: usize;
    /// Reads one element from a chunk of exactly `WIDTH` bytes.
    fn read(chunk: &[u8]) -> Self;
    /// Appends the element's bytes.
    fn write(self, out: &mut Vec<u8>);
}

macro_rules! little_endian {
    ($($ty:ty => $width:expr),*) => {$(
        impl LittleEndian for $ty {
            const WIDTH: usize = $width;
            fn read(chunk: &[u8]) -> Self {
                let mut bytes = [0u8; $width];
                bytes.copy_from_slice(chunk);
                <$ty>::from_le_bytes(bytes)
            }
            fn write(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
little_endian!(f32 => 4, f64 => 8, bf16 => 2, f16 => 2, i32 => 4, i64 => 8);

/// Every element of `bytes` (stored as `S`) converted to `T`. A dtype read as itself keeps
/// every bit (going through f64 would quiet signalling NaNs): on a little-endian machine the
/// bytes are copied whole. bf16 and f16 widen to f32 exactly by `to_f32` (what the f64 route
/// gives, without it).
fn floats_from<
    S: LittleEndian + Element + bytemuck::Pod,
    T: LittleEndian + Element + bytemuck::Pod,
>(
    bytes: &[u8],
) -> Vec<T> {
    let whole = bytes.len() / T::WIDTH * T::WIDTH;
    if S::DTYPE == T::DTYPE {
        if cfg!(target_endian = "little") {
            let mut out = vec![T::zeroed(); whole / T::WIDTH];
            bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes[..whole]);
            return out;
        }
        return bytes.chunks_exact(T::WIDTH).map(T::read).collect();
    }
    if T::DTYPE == DType::F32 && matches!(S::DTYPE, DType::BF16 | DType::F16) {
        let widen = |chunk: &[u8]| -> f32 {
            let bits = u16::from_le_bytes([chunk[0], chunk[1]]);
            match S::DTYPE {
                DType::BF16 => bf16::from_bits(bits).to_f32(),
                _ => f16::from_bits(bits).to_f32(),
            }
        };
        let mut out = vec![T::zeroed(); bytes.len() / 2];
        let widened = bytemuck::cast_slice_mut::<T, f32>(&mut out);
        for (to, chunk) in widened.iter_mut().zip(bytes.chunks_exact(2)) {
            *to = widen(chunk);
        }
        return out;
    }
    bytes
        .chunks_exact(S::WIDTH)
        .map(|chunk| T::from_f64(S::read(chunk).to_f64()))
        .collect()
}

/// The stored float dtypes kiln reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StoredFloat {
    F32,
    F64,
    BF16,
    F16,
}

fn floats_as<T: LittleEndian + Element + bytemuck::Pod>(
    bytes: &[u8],
    stored: StoredFloat,
) -> Vec<T> {
    match stored {
        StoredFloat::F32 => floats_from::<f32, T>(bytes),
        StoredFloat::F64 => floats_from::<f64, T>(bytes),
        StoredFloat::BF16 => floats_from::<bf16, T>(bytes),
        StoredFloat::F16 => floats_from::<f16, T>(bytes),
    }
}

/// Stored float bytes as a buffer of the float dtype `target`; `None` if `target` is not float.
pub(super) fn decode_floats(bytes: &[u8], stored: StoredFloat, target: DType) -> Option<Buffer> {
    Some(match target {
        DType::F32 => Buffer::F32(floats_as(bytes, stored)),
        DType::F64 => Buffer::F64(floats_as(bytes, stored)),
        DType::BF16 => Buffer::BF16(floats_as(bytes, stored)),
        DType::F16 => Buffer::F16(floats_as(bytes, stored)),
        DType::I32 | DType::I64 => return None,
    })
}

/// Stored integer bytes (`stored` is I32 or I64) as a buffer of the integer dtype `target`.
/// `Ok(None)` if `target` is not an integer; `Err((index, value))` names the first value that
/// does not fit.
pub(super) fn decode_ints(
    bytes: &[u8],
    stored: DType,
    target: DType,
) -> Result<Option<Buffer>, (usize, i64)> {
    let read = |width: usize| bytes.chunks_exact(width);
    Ok(Some(match (stored, target) {
        (DType::I32, DType::I32) => Buffer::I32(read(4).map(i32::read).collect()),
        (DType::I32, DType::I64) => Buffer::I64(read(4).map(|c| i32::read(c) as i64).collect()),
        (DType::I64, DType::I64) => Buffer::I64(read(8).map(i64::read).collect()),
        (DType::I64, DType::I32) => {
            let mut narrow = Vec::with_capacity(bytes.len() / 8);
            for (index, chunk) in read(8).enumerate() {
                let value = i64::read(chunk);
                narrow.push(i32::try_from(value).map_err(|_| (index, value))?);
            }
            Buffer::I32(narrow)
        }
        _ => return Ok(None),
    }))
}
