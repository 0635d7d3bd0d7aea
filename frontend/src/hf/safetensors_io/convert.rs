//! Element conversions between safetensors bytes and kiln dtypes.
//!
//! Reading: little-endian bytes of a stored dtype become a [`Buffer`] of the asked dtype. The
//! bytes come from a memory map at any address, so each element is assembled with
//! `from_le_bytes` from a chunk (never a cast of an unaligned slice).
//!
//! Float → float is exact when widening and rounds to nearest, ties to even, when narrowing,
//! with a single rounding: f64 → bf16/f16 goes through f32 rounded to odd, because `half`'s own
//! f64 conversions drop the low 32 mantissa bits first and so can round a value just above a
//! tie down. Integer → integer widens, or narrows only when the value fits. Float ↔ integer is
//! refused by the caller.

use half::{bf16, f16};
use kiln_ir::DType;
use kiln_kernels::Buffer;

/// A float dtype kiln stores, built from any other float with one correct rounding.
pub(super) trait Float: Copy {
    fn from_f32(x: f32) -> Self;
    fn from_f64(x: f64) -> Self;
    fn from_bf16(x: bf16) -> Self;
    fn from_f16(x: f16) -> Self;
}

impl Float for f32 {
    fn from_f32(x: f32) -> Self {
        x
    }
    fn from_f64(x: f64) -> Self {
        x as f32 // Rust's `as` rounds to nearest even.
    }
    fn from_bf16(x: bf16) -> Self {
        x.to_f32()
    }
    fn from_f16(x: f16) -> Self {
        x.to_f32()
    }
}

impl Float for f64 {
    fn from_f32(x: f32) -> Self {
        x as f64
    }
    fn from_f64(x: f64) -> Self {
        x
    }
    fn from_bf16(x: bf16) -> Self {
        x.to_f64()
    }
    fn from_f16(x: f16) -> Self {
        x.to_f64()
    }
}

impl Float for bf16 {
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn from_f64(x: f64) -> Self {
        bf16::from_f32(f64_to_f32_round_to_odd(x))
    }
    fn from_bf16(x: bf16) -> Self {
        x
    }
    fn from_f16(x: f16) -> Self {
        bf16::from_f32(x.to_f32())
    }
}

impl Float for f16 {
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn from_f64(x: f64) -> Self {
        f16::from_f32(f64_to_f32_round_to_odd(x))
    }
    fn from_bf16(x: bf16) -> Self {
        f16::from_f32(x.to_f32())
    }
    fn from_f16(x: f16) -> Self {
        x
    }
}

/// `x` in f32, rounded to odd: truncated toward zero, with the lowest mantissa bit set when
/// inexact. Rounding that to nearest-even at 8 or 11 significant bits (bf16, f16) gives the
/// same result as rounding `x` directly, since f32 keeps more than two extra bits.
pub(super) fn f64_to_f32_round_to_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if x.is_nan() || nearest as f64 == x {
        return nearest;
    }
    // Inexact. Magnitude bits are ordered like magnitudes, so stepping the bits down by one
    // moves toward zero (from infinity to f32::MAX as well).
    let toward_zero = if (nearest as f64).abs() > x.abs() {
        f32::from_bits(nearest.to_bits() - 1)
    } else {
        nearest
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}

/// A float source element: converts itself into any [`Float`].
pub(super) trait FloatSource: Copy {
    fn to<T: Float>(self) -> T;
}

impl FloatSource for f32 {
    fn to<T: Float>(self) -> T {
        T::from_f32(self)
    }
}
impl FloatSource for f64 {
    fn to<T: Float>(self) -> T {
        T::from_f64(self)
    }
}
impl FloatSource for bf16 {
    fn to<T: Float>(self) -> T {
        T::from_bf16(self)
    }
}
impl FloatSource for f16 {
    fn to<T: Float>(self) -> T {
        T::from_f16(self)
    }
}

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

/// Every element of `bytes` (stored as `S`) converted to `T`.
fn floats_from<S: LittleEndian + FloatSource, T: Float>(bytes: &[u8]) -> Vec<T> {
    bytes
        .chunks_exact(S::WIDTH)
        .map(|chunk| S::read(chunk).to::<T>())
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

fn floats_as<T: Float>(bytes: &[u8], stored: StoredFloat) -> Vec<T> {
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
