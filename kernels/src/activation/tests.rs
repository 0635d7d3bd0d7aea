//! Tests of SwiGLU and softmax against naive f64 formulas and central differences.

use super::*;
use crate::element::Element;
use crate::error::Error;
use crate::testing::{self, assert_close, central_difference};
use kiln_ir::DType;

/// Ranks 0–3, sizes that are not multiples of 8, and empty tensors.
const SHAPES: [&[usize]; 7] = [&[], &[1], &[7], &[3, 13], &[2, 3, 17], &[0, 5], &[4, 0]];

fn view<'a, T: Element>(data: &'a [T], shape: &[usize]) -> TensorView<'a> {
    TensorView::contiguous(data, shape).unwrap()
}

fn view_mut<'a, T: Element>(data: &'a mut [T], shape: &[usize]) -> TensorViewMut<'a> {
    TensorViewMut::contiguous(data, shape).unwrap()
}

fn cast<T: Real>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&x| T::of(x)).collect()
}

fn widen<T: Real>(values: &[T]) -> Vec<f64> {
    values.iter().map(|&x| Element::to_f64(x)).collect()
}

/// `values` rounded to `T` and back: the inputs the `T` kernel really sees.
fn rounded<T: Real>(values: &[f64]) -> Vec<f64> {
    widen(&cast::<T>(values))
}

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn run_swiglu<T: Real>(gate: &[f64], up: &[f64], shape: &[usize]) -> Vec<f64> {
    let (gate, up) = (cast::<T>(gate), cast::<T>(up));
    let mut out = vec![T::of(9.0); gate.len()];
    swiglu(
        &view(&gate, shape),
        &view(&up, shape),
        &mut view_mut(&mut out, shape),
    )
    .unwrap();
    widen(&out)
}

fn naive_swiglu(gate: &[f64], up: &[f64]) -> Vec<f64> {
    gate.iter()
        .zip(up)
        .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

fn run_softmax<T: Real>(x: &[f64], shape: &[usize]) -> Vec<f64> {
    let x = cast::<T>(x);
    let mut out = vec![T::of(9.0); x.len()];
    softmax(&view(&x, shape), &mut view_mut(&mut out, shape)).unwrap();
    widen(&out)
}

fn naive_softmax(x: &[f64], shape: &[usize]) -> Vec<f64> {
    let n = shape.last().copied().unwrap_or(1);
    if x.is_empty() {
        return Vec::new();
    }
    x.chunks(n)
        .flat_map(|row| {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let total: f64 = row.iter().map(|v| (v - max).exp()).sum();
            row.iter().map(move |v| (v - max).exp() / total)
        })
        .collect()
}

#[test]
fn swiglu_matches_naive() {
    let mut rng = testing::rng("swiglu");
    for shape in SHAPES {
        // ±8 reaches the saturated tails of the sigmoid.
        let gate = testing::uniform(&mut rng, numel(shape), -8.0, 8.0);
        let up = testing::uniform(&mut rng, numel(shape), -2.0, 2.0);
        let want = naive_swiglu(&gate, &up);
        assert_close(
            "swiglu f64",
            &run_swiglu::<f64>(&gate, &up, shape),
            &want,
            1e-14,
            1e-14,
        );
        let want = naive_swiglu(&rounded::<f32>(&gate), &rounded::<f32>(&up));
        assert_close(
            "swiglu f32",
            &run_swiglu::<f32>(&gate, &up, shape),
            &want,
            1e-6,
            1e-7,
        );
    }
}

#[test]
fn swiglu_is_finite_for_large_gates() {
    let gate = [-1000.0, -100.0, 100.0, 1000.0];
    let up = [1.5, -2.0, 0.5, -0.25];
    let out = run_swiglu::<f32>(&gate, &up, &[4]);
    assert_eq!(out, [0.0, 0.0, 50.0, -250.0]);
}

#[test]
fn swiglu_backward_matches_central_differences() {
    let mut rng = testing::rng("swiglu_backward");
    for shape in SHAPES {
        let n = numel(shape);
        let gate = testing::uniform(&mut rng, n, -5.0, 5.0);
        let up = testing::signed(&mut rng, n);
        let cotangent = testing::signed(&mut rng, n);
        let mut grad_gate = vec![9.0; n];
        let mut grad_up = vec![9.0; n];
        swiglu_backward(
            &view(&gate, shape),
            &view(&up, shape),
            &view(&cotangent, shape),
            &mut view_mut(&mut grad_gate, shape),
            &mut view_mut(&mut grad_up, shape),
        )
        .unwrap();
        let loss = |g: &[f64], u: &[f64]| testing::dot(&cotangent, &run_swiglu::<f64>(g, u, shape));
        let numeric = central_difference(|g| loss(g, &up), &gate, 1e-6);
        assert_close("grad_gate", &grad_gate, &numeric, 1e-6, 1e-8);
        let numeric = central_difference(|u| loss(&gate, u), &up, 1e-6);
        assert_close("grad_up", &grad_up, &numeric, 1e-6, 1e-8);
    }
}

#[test]
fn softmax_matches_naive() {
    let mut rng = testing::rng("softmax");
    for shape in SHAPES {
        let x = testing::uniform(&mut rng, numel(shape), -4.0, 4.0);
        let want = naive_softmax(&x, shape);
        assert_close(
            "softmax f64",
            &run_softmax::<f64>(&x, shape),
            &want,
            1e-14,
            1e-15,
        );
        let want = naive_softmax(&rounded::<f32>(&x), shape);
        assert_close(
            "softmax f32",
            &run_softmax::<f32>(&x, shape),
            &want,
            1e-6,
            1e-7,
        );
    }
}

#[test]
fn softmax_of_large_logits_is_finite() {
    // Without the max subtraction exp(1000) overflows to inf and the rows become NaN.
    let x = [1000.0, 999.0, -1000.0, -1000.0, -1001.0, -1000.0];
    let e = (-1.0f64).exp();
    let want = [
        1.0 / (1.0 + e),
        e / (1.0 + e),
        0.0,
        1.0 / (2.0 + e),
        e / (2.0 + e),
        1.0 / (2.0 + e),
    ];
    assert_close("f64", &run_softmax::<f64>(&x, &[2, 3]), &want, 1e-15, 0.0);
    assert_close("f32", &run_softmax::<f32>(&x, &[2, 3]), &want, 1e-6, 0.0);
}

#[test]
fn softmax_backward_matches_central_differences() {
    let mut rng = testing::rng("softmax_backward");
    for shape in SHAPES {
        let n = numel(shape);
        let x = testing::uniform(&mut rng, n, -3.0, 3.0);
        let cotangent = testing::signed(&mut rng, n);
        let y = run_softmax::<f64>(&x, shape);
        let mut grad_x = vec![9.0; n];
        softmax_backward(
            &view(&y, shape),
            &view(&cotangent, shape),
            &mut view_mut(&mut grad_x, shape),
        )
        .unwrap();
        let loss = |x: &[f64]| testing::dot(&cotangent, &run_softmax::<f64>(x, shape));
        let numeric = central_difference(loss, &x, 1e-6);
        assert_close("grad_x", &grad_x, &numeric, 1e-6, 1e-8);
    }
}

#[test]
fn softmax_gives_the_same_bits_twice() {
    let mut rng = testing::rng("softmax_determinism");
    let shape = [5, 301];
    let x = testing::uniform(&mut rng, numel(&shape), -10.0, 10.0);
    let g = testing::signed(&mut rng, numel(&shape));
    let run = || {
        let y = cast::<f32>(&run_softmax::<f32>(&x, &shape));
        let g = cast::<f32>(&g);
        let mut grad_x = vec![0f32; y.len()];
        softmax_backward(
            &view(&y, &shape),
            &view(&g, &shape),
            &mut view_mut(&mut grad_x, &shape),
        )
        .unwrap();
        (
            y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            grad_x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        )
    };
    assert_eq!(run(), run());
}

#[track_caller]
fn assert_operand(result: Result<()>, operand: &str) -> Error {
    let err = result.unwrap_err();
    let message = err.to_string();
    assert!(message.contains(&format!("`{operand}`")), "{message}");
    err
}

#[test]
fn rejects_shape_mismatches() {
    let (a, b) = (vec![0.5f32; 6], vec![0.5f32; 6]);
    let (mut o1, mut o2) = (vec![0f32; 6], vec![0f32; 6]);
    let is_shape = |e: Error| assert!(matches!(e, Error::Shape { .. }), "{e}");
    is_shape(assert_operand(
        swiglu(
            &view(&a, &[2, 3]),
            &view(&b, &[3, 2]),
            &mut view_mut(&mut o1, &[2, 3]),
        ),
        "up",
    ));
    is_shape(assert_operand(
        swiglu(
            &view(&a, &[2, 3]),
            &view(&b, &[2, 3]),
            &mut view_mut(&mut o1, &[6]),
        ),
        "out",
    ));
    let backward = |shapes: [&[usize]; 5], o1: &mut [f32], o2: &mut [f32]| {
        swiglu_backward(
            &view(&a, shapes[0]),
            &view(&b, shapes[1]),
            &view(&b, shapes[2]),
            &mut view_mut(o1, shapes[3]),
            &mut view_mut(o2, shapes[4]),
        )
    };
    let (s, t): (&[usize], &[usize]) = (&[2, 3], &[3, 2]);
    is_shape(assert_operand(
        backward([s, s, t, s, s], &mut o1, &mut o2),
        "grad_out",
    ));
    is_shape(assert_operand(
        backward([s, s, s, t, s], &mut o1, &mut o2),
        "grad_gate",
    ));
    is_shape(assert_operand(
        backward([s, s, s, s, t], &mut o1, &mut o2),
        "grad_up",
    ));
    is_shape(assert_operand(
        softmax(&view(&a, s), &mut view_mut(&mut o1, t)),
        "out",
    ));
    is_shape(assert_operand(
        softmax_backward(&view(&a, s), &view(&b, t), &mut view_mut(&mut o1, s)),
        "grad_out",
    ));
    is_shape(assert_operand(
        softmax_backward(&view(&a, s), &view(&b, s), &mut view_mut(&mut o1, t)),
        "grad_x",
    ));
}

#[test]
fn rejects_bad_dtypes_and_layouts() {
    let (a32, a64, ids) = (vec![0.5f32; 6], vec![0.5f64; 6], vec![1i64; 6]);
    let mut out32 = vec![0f32; 6];
    let s: &[usize] = &[2, 3];
    let err = assert_operand(
        swiglu(&view(&a32, s), &view(&a64, s), &mut view_mut(&mut out32, s)),
        "up",
    );
    assert!(matches!(
        err,
        Error::DType {
            expected: DType::F32,
            got: DType::F64,
            ..
        }
    ));
    let mut out64 = vec![0f64; 6];
    let err = assert_operand(softmax(&view(&a32, s), &mut view_mut(&mut out64, s)), "out");
    assert!(matches!(err, Error::DType { .. }));
    let err = softmax(&view(&ids, s), &mut view_mut(&mut out64, s)).unwrap_err();
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
    // A transposed view: same shape, not row-major.
    let x_t = TensorView::new(&a32[..], [2, 3], &[1, 2], 0).unwrap();
    let err = assert_operand(softmax(&x_t, &mut view_mut(&mut out32, s)), "x");
    assert!(matches!(err, Error::NotContiguous { .. }));
    let err = assert_operand(
        softmax_backward(&view(&a32, s), &x_t, &mut view_mut(&mut out32, s)),
        "grad_out",
    );
    assert!(matches!(err, Error::NotContiguous { .. }));
}

#[test]
fn argmax_takes_the_first_largest_and_refuses_rows_without_one() {
    let inf = f32::INFINITY;
    #[rustfmt::skip]
    let x = [
        1.0f32, 3.0, 3.0, -2.0,
        0.5, f32::NAN, 2.0, 9.0,
        -1.0, -inf, 4.0, 4.0,
        -inf, -inf, -inf, -inf,
    ];
    let mut out = [7i64; 4];
    argmax(
        &TensorView::contiguous(&x[..], [4, 4]).unwrap(),
        &mut TensorViewMut::contiguous(&mut out[..], [4]).unwrap(),
    )
    .unwrap();
    assert_eq!(out, [1, -1, 2, -1]);
    let mut rng = crate::testing::rng("argmax_random_rows");
    let values = crate::testing::signed(&mut rng, 5 * 33);
    let mut out = [0i64; 5];
    argmax(
        &TensorView::contiguous(&values[..], [5, 33]).unwrap(),
        &mut TensorViewMut::contiguous(&mut out[..], [5]).unwrap(),
    )
    .unwrap();
    for (row, &at) in values.chunks(33).zip(&out) {
        assert!(row.iter().all(|&v| v <= row[at as usize]));
    }
}
