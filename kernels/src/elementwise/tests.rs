//! Tests of the elementwise kernels against plain f64 loops and central differences.

use kiln_ir::DType;

use super::*;
use crate::element::Element;
use crate::testing::{self, assert_close, central_difference, dot};

/// (a's shape, b's shape) pairs that broadcast, including scalars and zero-sized dims.
const CASES: [(&[usize], &[usize]); 9] = [
    (&[4, 7], &[7]),
    (&[2, 3, 5], &[3, 5]),
    (&[2, 3, 5], &[5]),
    (&[3, 9], &[]),
    (&[6], &[6]),
    (&[], &[]),
    (&[0, 5], &[5]),
    (&[3, 0], &[0]),
    (&[2, 0, 3], &[3]),
];

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn to_t<T: Real>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&v| T::of(v)).collect()
}

fn to_f64<T: Real>(values: &[T]) -> Vec<f64> {
    values.iter().map(|&v| Element::to_f64(v)).collect()
}

type Binary = fn(&TensorView<'_>, &TensorView<'_>, &mut TensorViewMut<'_>) -> Result<()>;
/// The same binary op written plainly on f64 values.
type Naive = fn(f64, f64) -> f64;

/// Runs a broadcasting binary kernel in dtype `T`; `out` starts as NaN.
fn run_binary<T: Real>(
    kernel: Binary,
    (a, a_shape): (&[f64], &[usize]),
    (b, b_shape): (&[f64], &[usize]),
) -> Result<Vec<f64>> {
    let (a, b) = (to_t::<T>(a), to_t::<T>(b));
    let mut out = vec![T::nan(); a.len()];
    kernel(
        &TensorView::contiguous(&a, a_shape)?,
        &TensorView::contiguous(&b, b_shape)?,
        &mut TensorViewMut::contiguous(&mut out, a_shape)?,
    )?;
    Ok(to_f64(&out))
}

/// Runs [`sum_to_shape`] in dtype `T`; `out` starts as NaN.
fn run_sum<T: Real>(src: &[f64], src_shape: &[usize], out_shape: &[usize]) -> Result<Vec<T>> {
    let src = to_t::<T>(src);
    let mut out = vec![T::nan(); numel(out_shape)];
    sum_to_shape(
        &TensorView::contiguous(&src, src_shape)?,
        &mut TensorViewMut::contiguous(&mut out, out_shape)?,
    )?;
    Ok(out)
}

/// `combine(a[i, j], b[j])` written with explicit outer and inner loops, in f64.
fn naive_binary(
    a: &[f64],
    a_shape: &[usize],
    b: &[f64],
    b_shape: &[usize],
    combine: Naive,
) -> Vec<f64> {
    let outer = numel(&a_shape[..a_shape.len() - b_shape.len()]);
    let inner = numel(b_shape);
    let mut out = Vec::new();
    for i in 0..outer {
        for j in 0..inner {
            out.push(combine(a[i * inner + j], b[j]));
        }
    }
    out
}

fn naive_sum(src: &[f64], src_shape: &[usize], out_shape: &[usize]) -> Vec<f64> {
    let outer = numel(&src_shape[..src_shape.len() - out_shape.len()]);
    let inner = numel(out_shape);
    (0..inner)
        .map(|j| (0..outer).map(|i| src[i * inner + j]).sum())
        .collect()
}

/// Inputs already rounded to `T`, so the f64 truth sees exactly what the kernel sees.
fn inputs<T: Real>(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<f64> {
    to_f64(&to_t::<T>(&testing::signed(rng, len)))
}

fn check_binary_forward<T: Real>(name: &str) {
    let mut rng = testing::rng(name);
    let kernels: [(Binary, Naive); 2] = [(add, |x, y| x + y), (mul, |x, y| x * y)];
    for (a_shape, b_shape) in CASES {
        let a = inputs::<T>(&mut rng, numel(a_shape));
        let b = inputs::<T>(&mut rng, numel(b_shape));
        for (kernel, combine) in kernels {
            let got = run_binary::<T>(kernel, (&a, a_shape), (&b, b_shape)).unwrap();
            // One rounding of the exact f64 result is what IEEE add/mul in T give.
            let want: Vec<f64> = naive_binary(&a, a_shape, &b, b_shape, combine)
                .iter()
                .map(|&v| Element::to_f64(T::of(v)))
                .collect();
            assert_eq!(got, want, "a {a_shape:?}, b {b_shape:?}");
        }
    }
}

#[test]
fn add_and_mul_broadcast_f32() {
    check_binary_forward::<f32>("add_and_mul_broadcast_f32");
}

#[test]
fn add_and_mul_broadcast_f64() {
    check_binary_forward::<f64>("add_and_mul_broadcast_f64");
}

fn check_scale<T: Real>(name: &str) {
    let mut rng = testing::rng(name);
    let alpha = testing::uniform(&mut rng, 1, -3.0, 3.0)[0];
    for shape in [&[3, 7][..], &[9], &[], &[0, 4]] {
        let a = inputs::<T>(&mut rng, numel(shape));
        let ta = to_t::<T>(&a);
        let mut out = vec![T::nan(); a.len()];
        scale(
            &TensorView::contiguous(&ta, shape).unwrap(),
            alpha,
            &mut TensorViewMut::contiguous(&mut out, shape).unwrap(),
        )
        .unwrap();
        let rounded_alpha = Element::to_f64(T::of(alpha));
        let want: Vec<f64> = a
            .iter()
            .map(|&x| Element::to_f64(T::of(rounded_alpha * x)))
            .collect();
        assert_eq!(to_f64(&out), want, "shape {shape:?}");
    }
}

#[test]
fn scale_f32() {
    check_scale::<f32>("scale_f32");
}

#[test]
fn scale_f64() {
    check_scale::<f64>("scale_f64");
}

fn check_sum_to_shape<T: Real>(name: &str, tol: f64) {
    let mut rng = testing::rng(name);
    for (src_shape, out_shape) in CASES {
        let src = inputs::<T>(&mut rng, numel(src_shape));
        let got = run_sum::<T>(&src, src_shape, out_shape).unwrap();
        let want = naive_sum(&src, src_shape, out_shape);
        assert_close("sum_to_shape", &to_f64(&got), &want, tol, tol);
    }
}

#[test]
fn sum_to_shape_f32() {
    check_sum_to_shape::<f32>("sum_to_shape_f32", 1e-5);
}

#[test]
fn sum_to_shape_f64() {
    check_sum_to_shape::<f64>("sum_to_shape_f64", 1e-12);
}

#[test]
fn sum_to_shape_adds_rows_in_increasing_order() {
    let mut rng = testing::rng("sum_to_shape_adds_rows_in_increasing_order");
    let (rows, inner) = (300, 11);
    let src = inputs::<f32>(&mut rng, rows * inner);
    let got = run_sum::<f32>(&src, &[3, 100, inner], &[inner]).unwrap();
    let mut in_order = vec![0f32; inner];
    for i in 0..rows {
        for j in 0..inner {
            in_order[j] += src[i * inner + j] as f32;
        }
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&in_order));
    let again = run_sum::<f32>(&src, &[3, 100, inner], &[inner]).unwrap();
    assert_eq!(bits(&got), bits(&again));
}

#[test]
fn accumulate_adds_in_place() {
    let mut rng = testing::rng("accumulate_adds_in_place");
    for shape in [&[4, 6][..], &[5], &[], &[0, 3]] {
        let dst = inputs::<f64>(&mut rng, numel(shape));
        let src = inputs::<f64>(&mut rng, numel(shape));
        let mut sum = dst.clone();
        accumulate(
            &mut TensorViewMut::contiguous(&mut sum, shape).unwrap(),
            &TensorView::contiguous(&src, shape).unwrap(),
        )
        .unwrap();
        let want: Vec<f64> = dst.iter().zip(&src).map(|(d, s)| d + s).collect();
        assert_eq!(sum, want);

        let mut sum32 = to_t::<f32>(&dst);
        let src32 = to_t::<f32>(&src);
        accumulate(
            &mut TensorViewMut::contiguous(&mut sum32, shape).unwrap(),
            &TensorView::contiguous(&src32, shape).unwrap(),
        )
        .unwrap();
        let want32: Vec<f32> = dst
            .iter()
            .zip(&src)
            .map(|(d, s)| (*d as f32) + (*s as f32))
            .collect();
        assert_eq!(sum32, want32);
    }
}

/// The VJPs of broadcast add and mul, built from these kernels, match central differences of
/// `L(a, b) = dot(g, op(a, b))`.
#[test]
fn broadcast_vjps_match_central_difference() {
    let mut rng = testing::rng("broadcast_vjps_match_central_difference");
    let (a_shape, b_shape) = (&[3, 4, 5][..], &[4, 5][..]);
    let a = testing::signed(&mut rng, numel(a_shape));
    let b = testing::signed(&mut rng, numel(b_shape));
    let g = testing::signed(&mut rng, numel(a_shape));
    let h = 1e-6;
    for (kernel, is_mul) in [(add as Binary, false), (mul as Binary, true)] {
        let forward =
            |a: &[f64], b: &[f64]| run_binary::<f64>(kernel, (a, a_shape), (b, b_shape)).unwrap();
        let want_a = central_difference(|x| dot(&g, &forward(x, &b)), &a, h);
        let want_b = central_difference(|x| dot(&g, &forward(&a, x)), &b, h);

        // add: grad_a = g, grad_b = sum_to_shape(g).
        // mul: grad_a = g · b (b broadcast), grad_b = sum_to_shape(g · a).
        let (grad_a, g_times_a) = if is_mul {
            (
                run_binary::<f64>(mul, (&g, a_shape), (&b, b_shape)).unwrap(),
                run_binary::<f64>(mul, (&g, a_shape), (&a, a_shape)).unwrap(),
            )
        } else {
            (g.clone(), g.clone())
        };
        let grad_b = run_sum::<f64>(&g_times_a, a_shape, b_shape).unwrap();
        assert_close("grad_a", &grad_a, &want_a, 1e-6, 1e-6);
        assert_close("grad_b", &grad_b, &want_b, 1e-6, 1e-6);
    }
}

#[track_caller]
fn assert_names(err: &Error, operand: &str) {
    assert!(err.to_string().contains(&format!("`{operand}`")), "{err}");
}

#[test]
fn wrong_shapes_are_rejected() {
    let a = [1f32; 28];
    let b = [2f32; 7];
    let mut out = [0f32; 28];
    let av = TensorView::contiguous(&a[..], [4, 7]).unwrap();

    // A prefix is not a suffix.
    let prefix = TensorView::contiguous(&b[..4], [4]).unwrap();
    let mut outv = TensorViewMut::contiguous(&mut out[..], [4, 7]).unwrap();
    for kernel in [add as Binary, mul as Binary] {
        let err = kernel(&av, &prefix, &mut outv).unwrap_err();
        assert!(matches!(err, Error::Shape { operand: "b", .. }), "{err}");
        assert_names(&err, "b");
    }

    let bv = TensorView::contiguous(&b[..], [7]).unwrap();
    let mut wrong_out = TensorViewMut::contiguous(&mut out[..], [7, 4]).unwrap();
    let err = add(&av, &bv, &mut wrong_out).unwrap_err();
    assert!(matches!(err, Error::Shape { operand: "out", .. }), "{err}");
    assert_names(&err, "out");
    let err = scale(&av, 2.0, &mut wrong_out).unwrap_err();
    assert!(matches!(err, Error::Shape { operand: "out", .. }), "{err}");

    let mut sum = [0f32; 4];
    let mut sumv = TensorViewMut::contiguous(&mut sum[..], [4]).unwrap();
    let err = sum_to_shape(&av, &mut sumv).unwrap_err();
    assert!(matches!(err, Error::Shape { operand: "out", .. }), "{err}");
    assert_names(&err, "out");

    let err = accumulate(&mut sumv, &bv).unwrap_err();
    assert!(matches!(err, Error::Shape { operand: "src", .. }), "{err}");
    assert_names(&err, "src");
}

#[test]
fn wrong_dtypes_and_layouts_are_rejected() {
    let a = [1f32; 6];
    let av = TensorView::contiguous(&a[..], [2, 3]).unwrap();
    let b64 = [1f64; 3];
    let b64v = TensorView::contiguous(&b64[..], [3]).unwrap();
    let mut out = [0f32; 6];
    let mut outv = TensorViewMut::contiguous(&mut out[..], [2, 3]).unwrap();

    let err = add(&av, &b64v, &mut outv).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "b", .. }), "{err}");
    assert_names(&err, "b");

    let mut out64 = [0f64; 6];
    let mut out64v = TensorViewMut::contiguous(&mut out64[..], [2, 3]).unwrap();
    let err = mul(&av, &av, &mut out64v).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "out", .. }), "{err}");
    assert_names(&err, "out");

    let err = accumulate(&mut out64v, &av).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "src", .. }), "{err}");

    let ints = [1i32; 6];
    let intv = TensorView::contiguous(&ints[..], [2, 3]).unwrap();
    let err = scale(&intv, 2.0, &mut outv).unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedDType {
                dtype: DType::I32,
                ..
            }
        ),
        "{err}"
    );

    // The transpose of a [3, 2] matrix: right shape, wrong layout.
    let transposed = TensorView::new(&a[..], [2, 3], &[1, 2], 0).unwrap();
    let err = add(&transposed, &av, &mut outv).unwrap_err();
    assert!(
        matches!(err, Error::NotContiguous { operand: "a", .. }),
        "{err}"
    );
    assert_names(&err, "a");
    let mut sum = [0f32; 3];
    let err = sum_to_shape(
        &transposed,
        &mut TensorViewMut::contiguous(&mut sum[..], [3]).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::NotContiguous { operand: "src", .. }),
        "{err}"
    );
}
