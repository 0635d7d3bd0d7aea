//! Copies: materializing a strided view, dtype casts, and fills.

use half::{bf16, f16};
use kiln_ir::DType;

use crate::element::Element;
use crate::error::{expect_shape, Error, Result};
use crate::view::{TensorView, TensorViewMut};

/// Visits the element offsets of a strided view in row-major order of its shape.
fn for_each_offset(view: &TensorView<'_>, mut visit: impl FnMut(usize)) {
    let dims = view.shape().dims();
    if view.numel() == 0 {
        return;
    }
    let strides = view.strides();
    let mut index = vec![0usize; dims.len()];
    let mut offset = view.offset();
    loop {
        visit(offset);
        // Advance the multi-index like an odometer, innermost dimension fastest.
        let mut axis = dims.len();
        loop {
            if axis == 0 {
                return;
            }
            axis -= 1;
            index[axis] += 1;
            offset += strides[axis];
            if index[axis] < dims[axis] {
                break;
            }
            offset -= strides[axis] * dims[axis];
            index[axis] = 0;
        }
    }
}

fn copy_typed<T: Element>(src: &TensorView<'_>, dst: &mut TensorViewMut<'_>) -> Result<()> {
    const OP: &str = "copy";
    let all = T::of_data(src.data()).ok_or(Error::DType {
        op: OP,
        operand: "src",
        expected: T::DTYPE,
        got: src.dtype(),
    })?;
    let out = dst.slice_mut::<T>(OP, "dst")?;
    if src.is_contiguous() {
        let first = src.offset();
        out.copy_from_slice(&all[first..first + out.len()]);
        return Ok(());
    }
    let mut next = 0;
    for_each_offset(src, |offset| {
        out[next] = all[offset];
        next += 1;
    });
    Ok(())
}

/// Copies a view of any strides into a contiguous `dst` of the same shape and dtype
/// (this is how `contiguous()` materializes).
pub fn copy(src: &TensorView<'_>, dst: &mut TensorViewMut<'_>) -> Result<()> {
    expect_shape("copy", "dst", dst.shape(), src.shape().dims())?;
    match src.dtype() {
        DType::F32 => copy_typed::<f32>(src, dst),
        DType::F64 => copy_typed::<f64>(src, dst),
        DType::BF16 => copy_typed::<bf16>(src, dst),
        DType::F16 => copy_typed::<f16>(src, dst),
        DType::I32 => copy_typed::<i32>(src, dst),
        DType::I64 => copy_typed::<i64>(src, dst),
    }
}

fn cast_into<S: Element, D: Element>(src: &[S], dst: &mut TensorViewMut<'_>) -> Result<()> {
    let out = dst.slice_mut::<D>("cast", "dst")?;
    for (o, &s) in out.iter_mut().zip(src) {
        *o = D::from_f64(s.to_f64());
    }
    Ok(())
}

fn cast_from<S: Element>(src: &TensorView<'_>, dst: &mut TensorViewMut<'_>) -> Result<()> {
    let src = src.slice::<S>("cast", "src")?;
    match dst.dtype() {
        DType::F32 => cast_into::<S, f32>(src, dst),
        DType::F64 => cast_into::<S, f64>(src, dst),
        DType::BF16 => cast_into::<S, bf16>(src, dst),
        DType::F16 => cast_into::<S, f16>(src, dst),
        other => Err(Error::UnsupportedDType {
            op: "cast",
            dtype: other,
            supported: "f32, f64, bf16, f16",
        }),
    }
}

/// Converts a contiguous float tensor to another float dtype of the same shape, rounding to
/// nearest even. Going through f64 is exact: every f32, bf16 and f16 value is an f64, and
/// rounding an f64 once to the narrower type gives the correctly rounded result.
pub fn cast(src: &TensorView<'_>, dst: &mut TensorViewMut<'_>) -> Result<()> {
    expect_shape("cast", "dst", dst.shape(), src.shape().dims())?;
    match src.dtype() {
        DType::F32 => cast_from::<f32>(src, dst),
        DType::F64 => cast_from::<f64>(src, dst),
        DType::BF16 => cast_from::<bf16>(src, dst),
        DType::F16 => cast_from::<f16>(src, dst),
        other => Err(Error::UnsupportedDType {
            op: "cast",
            dtype: other,
            supported: "f32, f64, bf16, f16",
        }),
    }
}

fn fill_typed<T: Element>(dst: &mut TensorViewMut<'_>, value: f64) -> Result<()> {
    dst.slice_mut::<T>("fill", "dst")?.fill(T::from_f64(value));
    Ok(())
}

/// Sets every element of a contiguous `dst` to `value` (rounded to its dtype).
pub fn fill(dst: &mut TensorViewMut<'_>, value: f64) -> Result<()> {
    match dst.dtype() {
        DType::F32 => fill_typed::<f32>(dst, value),
        DType::F64 => fill_typed::<f64>(dst, value),
        DType::BF16 => fill_typed::<bf16>(dst, value),
        DType::F16 => fill_typed::<f16>(dst, value),
        DType::I32 => fill_typed::<i32>(dst, value),
        DType::I64 => fill_typed::<i64>(dst, value),
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;

    #[test]
    fn copy_materializes_a_transpose() {
        let data: Vec<i64> = (0..6).collect();
        // [2,3] row-major viewed as its transpose [3,2].
        let src = TensorView::new(&data, [3, 2], &[1, 3], 0).unwrap();
        let mut out = vec![0i64; 6];
        copy(
            &src,
            &mut TensorViewMut::contiguous(&mut out, [3, 2]).unwrap(),
        )
        .unwrap();
        assert_eq!(out, [0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn copy_of_a_strided_slice_with_offset() {
        let data: Vec<f32> = (0..12).map(|x| x as f32).collect();
        // Rows 1..3 of a [4,3] matrix, every second column: offset 3, strides [3, 2].
        let src = TensorView::new(&data, [2, 2], &[3, 2], 3).unwrap();
        let mut out = vec![0f32; 4];
        copy(
            &src,
            &mut TensorViewMut::contiguous(&mut out, [2, 2]).unwrap(),
        )
        .unwrap();
        assert_eq!(out, [3.0, 5.0, 6.0, 8.0]);
    }

    #[test]
    fn cast_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0);
        // 1 + 3·2^-8 rounds up to 1 + 2^-6.
        let src = [1.0f32 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5];
        let mut out = vec![bf16::ZERO; 3];
        cast(
            &TensorView::contiguous(&src[..], [3]).unwrap(),
            &mut TensorViewMut::contiguous(&mut out, [3]).unwrap(),
        )
        .unwrap();
        assert_eq!(
            out.iter().map(|x| x.to_f32()).collect::<Vec<_>>(),
            [1.0, 1.0 + 1.0 / 64.0, -2.5]
        );
    }

    /// Casts `src` (contiguous, rank 1) to `D`.
    fn cast_to<S: Element, D: Element>(src: &[S]) -> Vec<D> {
        let mut out = vec![D::from_f64(0.0); src.len()];
        cast(
            &TensorView::contiguous(src, [src.len()]).unwrap(),
            &mut TensorViewMut::contiguous(&mut out, [src.len()]).unwrap(),
        )
        .unwrap();
        out
    }

    #[test]
    fn cast_rounds_once_just_above_a_tie() {
        // 1 + 2^-8 + 2^-23 is an f32 just above the bf16 tie 1 + 2^-8: it rounds up, as does
        // 1 + 2^-11 + 2^-23 to f16. Rounding the excess away first would give 1.0.
        let f32s = [
            1.0f32 + 2f32.powi(-8) + 2f32.powi(-23),
            -(1.0 + 2f32.powi(-8) + 2f32.powi(-23)),
            1.0 + 2f32.powi(-11) + 2f32.powi(-23),
        ];
        let up_bf16 = 1.0 + 2f64.powi(-7);
        let up_f16 = 1.0 + 2f64.powi(-10);
        let bf16s = cast_to::<f32, bf16>(&f32s);
        assert_eq!([bf16s[0].to_f64(), bf16s[1].to_f64()], [up_bf16, -up_bf16]);
        assert_eq!(cast_to::<f32, f16>(&f32s)[2].to_f64(), up_f16);

        // From f64 the excess can lie below f64's upper 32 mantissa bits.
        let f64s = [
            1.0 + 2f64.powi(-8) + 2f64.powi(-40),
            1.0 + 2f64.powi(-11) + 2f64.powi(-40),
        ];
        assert_eq!(cast_to::<f64, bf16>(&f64s)[0].to_f64(), up_bf16);
        assert_eq!(cast_to::<f64, f16>(&f64s)[1].to_f64(), up_f16);
    }

    #[test]
    fn cast_to_bf16_and_f16_rounds_once() {
        let mut rng = crate::testing::rng("cast_to_bf16_and_f16_rounds_once");
        let f64s: Vec<f64> = (0..4096)
            .map(|_| rng.random_range(-2.0..2.0) * 2f64.powi(rng.random_range(-14..15)))
            .collect();
        // Any f32 bits but NaN (a payload, not a rounding), every exponent and subnormal included;
        // two in three within 8 ulps above a bf16 or an f16 tie, where double rounding would show.
        let f32s: Vec<f32> = (0..6000)
            .map(|i| {
                let bits: u32 = rng.random();
                let near = rng.random_range(0..8);
                f32::from_bits(match i % 3 {
                    0 => bits,
                    1 => bits & !0xffff | 0x8000 | near,
                    // Exponents of f16's normal range (2^-14 to 2^15).
                    _ => {
                        let exp = rng.random_range(127 - 14..=127 + 15) << 23;
                        bits & 0x8000_0000 | exp | bits & 0x007f_e000 | 0x1000 | near
                    }
                })
            })
            .filter(|x| !x.is_nan())
            .collect();
        // From f32, against `half`'s own (single-rounding) f32 conversions.
        let (bf16s, f16s) = (cast_to::<f32, bf16>(&f32s), cast_to::<f32, f16>(&f32s));
        for (i, &x) in f32s.iter().enumerate() {
            assert_eq!(
                bf16s[i].to_bits(),
                bf16::from_f32(x).to_bits(),
                "bf16 of {x:e}"
            );
            assert_eq!(
                f16s[i].to_bits(),
                f16::from_f32(x).to_bits(),
                "f16 of {x:e}"
            );
        }
        // From f64, against `Element::from_f64` (tested against neighbours in `element`).
        let (bf16s, f16s) = (cast_to::<f64, bf16>(&f64s), cast_to::<f64, f16>(&f64s));
        for (i, &x) in f64s.iter().enumerate() {
            assert_eq!(bf16s[i], <bf16 as Element>::from_f64(x), "bf16 of {x:e}");
            assert_eq!(f16s[i], <f16 as Element>::from_f64(x), "f16 of {x:e}");
        }
    }

    #[test]
    fn cast_rejects_integers_and_shape_mismatch() {
        let src = [1i32, 2];
        let mut out = vec![0f32; 2];
        let err = cast(
            &TensorView::contiguous(&src[..], [2]).unwrap(),
            &mut TensorViewMut::contiguous(&mut out, [2]).unwrap(),
        )
        .unwrap_err();
        assert!(matches!(
            err,
            Error::UnsupportedDType {
                dtype: DType::I32,
                ..
            }
        ));
        let src = [1f32, 2.0];
        let mut out = vec![0f32; 2];
        let err = cast(
            &TensorView::contiguous(&src[..], [2]).unwrap(),
            &mut TensorViewMut::contiguous(&mut out, [1, 2]).unwrap(),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Shape { .. }));
    }
}
