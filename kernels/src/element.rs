//! Element types the kernels read and write, and the real-number types they compute in.

use half::{bf16, f16};
use kiln_ir::DType;

use crate::buffer::Buffer;
use crate::view::{Data, DataMut};

/// A Rust type that is one of kiln's dtypes.
pub trait Element: Copy + Send + Sync + std::fmt::Debug + 'static {
    /// The dtype this Rust type stands for.
    const DTYPE: DType;
    /// The typed slice inside `data`, if `data` holds this type.
    fn of_data(data: Data<'_>) -> Option<&[Self]>;
    /// The typed mutable slice inside `data`, if `data` holds this type.
    fn of_data_mut<'b>(data: &'b mut DataMut<'_>) -> Option<&'b mut [Self]>;
    /// Wraps a slice of this type.
    fn data(slice: &[Self]) -> Data<'_>;
    /// Wraps a mutable slice of this type.
    fn data_mut(slice: &mut [Self]) -> DataMut<'_>;
    /// Wraps owned elements of this type (no copy).
    fn into_buffer(values: Vec<Self>) -> Buffer;
    /// The value as f64 (exact for every dtype but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// The nearest value of this type, rounded once (to nearest, ties to even; integers
    /// truncate toward zero). Since every float dtype converts to f64 exactly,
    /// `D::from_f64(s.to_f64())` converts between any two float dtypes with one correct rounding.
    fn from_f64(value: f64) -> Self;
}

macro_rules! element {
    ($ty:ty, $variant:ident, $to:expr, $from:expr) => {
        impl Element for $ty {
            const DTYPE: DType = DType::$variant;
            fn of_data(data: Data<'_>) -> Option<&[Self]> {
                match data {
                    Data::$variant(s) => Some(s),
                    _ => None,
                }
            }
            fn of_data_mut<'b>(data: &'b mut DataMut<'_>) -> Option<&'b mut [Self]> {
                match data {
                    DataMut::$variant(s) => Some(&mut **s),
                    _ => None,
                }
            }
            fn data(slice: &[Self]) -> Data<'_> {
                Data::$variant(slice)
            }
            fn data_mut(slice: &mut [Self]) -> DataMut<'_> {
                DataMut::$variant(slice)
            }
            fn into_buffer(values: Vec<Self>) -> Buffer {
                Buffer::$variant(values)
            }
            fn to_f64(self) -> f64 {
                let f: fn($ty) -> f64 = $to;
                f(self)
            }
            fn from_f64(value: f64) -> Self {
                let f: fn(f64) -> $ty = $from;
                f(value)
            }
        }
    };
}

// Rust's `as` rounds f64 to f32 to nearest even. `half`'s own `from_f64` drops the low 32
// mantissa bits before rounding, so a value just above a tie can round down; going through f32
// rounded to odd rounds once.
element!(f32, F32, |x| x as f64, |x| x as f32);
element!(f64, F64, |x| x, |x| x);
element!(bf16, BF16, |x| x.to_f64(), |x| bf16::from_f32(
    f64_to_f32_round_to_odd(x)
));
element!(f16, F16, |x| x.to_f64(), |x| f16::from_f32(
    f64_to_f32_round_to_odd(x)
));
element!(i32, I32, |x| x as f64, |x| x as i32);
element!(i64, I64, |x| x as f64, |x| x as i64);

/// `x` in f32, rounded to odd: truncated toward zero, with the lowest mantissa bit set when
/// inexact. Rounding that to nearest-even at 8 or 11 significant bits (bf16, f16) gives the
/// same result as rounding `x` directly, since f32 keeps more than two extra bits: the odd bit
/// stands for everything below f32's precision, so a value just above a tie stays above it and
/// an exact tie stays exact. (In the subnormal range of bf16, f32 still keeps 16 extra bits;
/// beyond f32's range the result is `f32::MAX`, which rounds to infinity in bf16 and f16 as `x`
/// would.)
fn f64_to_f32_round_to_odd(x: f64) -> f32 {
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

/// A real-number type kernels compute in: `f32` for models, `f64` for gradient checks.
pub trait Real:
    Element
    + num_traits::Float
    + std::ops::AddAssign
    + std::ops::SubAssign
    + std::ops::MulAssign
    + std::ops::DivAssign
    + std::iter::Sum
    + Default
{
    /// `value` rounded to this type.
    fn of(value: f64) -> Self {
        <Self as Element>::from_f64(value)
    }
}

impl Real for f32 {}
impl Real for f64 {}

/// Calls `$f::<T>($args)` with `T` the real type of `$dtype`, or returns
/// [`Error::UnsupportedDType`](crate::Error::UnsupportedDType) naming `$op`.
#[macro_export]
macro_rules! dispatch_real {
    ($op:expr, $dtype:expr, $f:ident ( $($arg:expr),* $(,)? )) => {
        match $dtype {
            kiln_ir::DType::F32 => $f::<f32>($($arg),*),
            kiln_ir::DType::F64 => $f::<f64>($($arg),*),
            other => Err($crate::Error::UnsupportedDType {
                op: $op,
                dtype: other,
                supported: "f32, f64",
            }),
        }
    };
}

#[cfg(test)]
#[path = "element_tests.rs"]
mod tests;
