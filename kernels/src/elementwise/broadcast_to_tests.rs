//! Tests of [`broadcast_to`] against a plain f64 loop, its adjointness to [`sum_to_shape`],
//! and its rejections.

use kiln_ir::DType;

use super::*;
use crate::element::Element;
use crate::testing::{self, assert_close, dot};

/// (src's shape, out's shape) pairs: src is a suffix of out, including scalars, equal shapes
/// and zero-sized dims.
const CASES: [(&[usize], &[usize]); 8] = [
    (&[7], &[4, 7]),
    (&[3, 5], &[2, 3, 5]),
    (&[5], &[2, 3, 5]),
    (&[], &[3, 9]),
    (&[6], &[6]),
    (&[], &[]),
    (&[5], &[0, 5]),
    (&[0], &[3, 0]),
];

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// `out[i, j] = src[j]` written with explicit loops, in f64.
fn naive_broadcast(src: &[f64], src_shape: &[usize], out_shape: &[usize]) -> Vec<f64> {
    let inner = numel(src_shape);
    let outer = numel(&out_shape[..out_shape.len() - src_shape.len()]);
    let mut out = Vec::new();
    for _ in 0..outer {
        for &x in &src[..inner] {
            out.push(x);
        }
    }
    out
}

/// Runs the kernel in `T`; `out` starts as NaN so every element must be written.
fn run<T: Real>(src: &[f64], src_shape: &[usize], out_shape: &[usize]) -> Vec<f64> {
    let src: Vec<T> = src.iter().map(|&x| T::of(x)).collect();
    let mut out = vec![T::nan(); numel(out_shape)];
    broadcast_to(
        &TensorView::contiguous(&src, src_shape).unwrap(),
        &mut TensorViewMut::contiguous(&mut out, out_shape).unwrap(),
    )
    .unwrap();
    out.iter().map(|&x| Element::to_f64(x)).collect()
}

fn check_forward<T: Real>(name: &str) {
    let mut rng = testing::rng(name);
    for (src_shape, out_shape) in CASES {
        // Rounded to T first: a broadcast copies, so the result is exact.
        let src: Vec<f64> = testing::signed(&mut rng, numel(src_shape))
            .into_iter()
            .map(|x| Element::to_f64(T::of(x)))
            .collect();
        let got = run::<T>(&src, src_shape, out_shape);
        let want = naive_broadcast(&src, src_shape, out_shape);
        assert_eq!(got, want, "src {src_shape:?}, out {out_shape:?}");
    }
}

#[test]
fn broadcast_to_repeats_f32() {
    check_forward::<f32>("broadcast_to_repeats_f32");
}

#[test]
fn broadcast_to_repeats_f64() {
    check_forward::<f64>("broadcast_to_repeats_f64");
}

/// `⟨broadcast(x), y⟩ = ⟨x, sum_to_shape(y)⟩`: broadcast_to is sum_to_shape's adjoint, which
/// is what makes each the other's VJP.
#[test]
fn broadcast_to_is_the_adjoint_of_sum_to_shape() {
    let mut rng = testing::rng("broadcast_to_is_the_adjoint_of_sum_to_shape");
    for (small, big) in CASES {
        let x = testing::signed(&mut rng, numel(small));
        let y = testing::signed(&mut rng, numel(big));
        let mut summed = vec![f64::NAN; x.len()];
        sum_to_shape(
            &TensorView::contiguous(&y, big).unwrap(),
            &mut TensorViewMut::contiguous(&mut summed, small).unwrap(),
        )
        .unwrap();
        let lhs = dot(&run::<f64>(&x, small, big), &y);
        let rhs = dot(&x, &summed);
        assert_close("adjoint", &[lhs], &[rhs], 1e-12, 1e-12);
    }
}

#[track_caller]
fn assert_names(err: &Error, operand: &str) {
    let message = err.to_string();
    assert!(message.contains(&format!("`{operand}`")), "{message}");
}

#[test]
fn broadcast_to_rejects_bad_operands() {
    let src = [0.5f32, -1.0, 2.0];
    let mut out = [0f32; 6];
    let mut out64 = [0f64; 6];
    let src_view = || TensorView::contiguous(&src[..], [3]).unwrap();

    // [3] is not a suffix of [3,2].
    let err = broadcast_to(
        &src_view(),
        &mut TensorViewMut::contiguous(&mut out[..], [3, 2]).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Shape { operand: "src", .. }), "{err}");
    assert_names(&err, "src");

    // out of another dtype than src.
    let err = broadcast_to(
        &src_view(),
        &mut TensorViewMut::contiguous(&mut out64[..], [2, 3]).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { operand: "out", .. }), "{err}");
    assert_names(&err, "out");

    // Integers are not broadcast by this kernel.
    let ints = [1i64, 2, 3];
    let mut int_out = [0i64; 6];
    let err = broadcast_to(
        &TensorView::contiguous(&ints[..], [3]).unwrap(),
        &mut TensorViewMut::contiguous(&mut int_out[..], [2, 3]).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedDType {
                dtype: DType::I64,
                ..
            }
        ),
        "{err}"
    );

    // A strided src: every second element of six.
    let wide = [1f32, 0.0, 2.0, 0.0, 3.0, 0.0];
    let strided = TensorView::new(&wide[..], [3], &[2], 0).unwrap();
    let err = broadcast_to(
        &strided,
        &mut TensorViewMut::contiguous(&mut out[..], [2, 3]).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::NotContiguous { operand: "src", .. }),
        "{err}"
    );
}
