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
    /// The nearest value of this type (round to nearest even; integers truncate toward zero).
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

element!(f32, F32, |x| x as f64, |x| x as f32);
element!(f64, F64, |x| x, |x| x);
element!(bf16, BF16, |x| x.to_f64(), bf16::from_f64);
element!(f16, F16, |x| x.to_f64(), f16::from_f64);
element!(i32, I32, |x| x as f64, |x| x as i32);
element!(i64, I64, |x| x as f64, |x| x as i64);

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
