//! Every error the matmul kernels return, each naming its operand.

use half::bf16;
use kiln_ir::DType;

use super::*;

/// Calls both paths on f32 inputs of the given shapes (with an ample workspace) and checks
/// both fail with a Shape error on `operand`.
#[track_caller]
fn assert_shape_rejected(
    a_shape: &[usize],
    b_shape: &[usize],
    out_shape: &[usize],
    t: Transpose,
    operand: &str,
) {
    let zeros = |shape: &[usize]| vec![0.5; shape.iter().product()];
    let (a, b) = (zeros(a_shape), zeros(b_shape));
    for path in [Path::Reference, Path::Fast] {
        let err = run::<f32, f32>(path, (&a, a_shape), (&b, b_shape), out_shape, t).unwrap_err();
        assert!(
            matches!(&err, Error::Shape { operand: o, .. } if *o == operand),
            "{path:?}: {err}"
        );
        assert!(err.to_string().contains(&format!("`{operand}`")), "{err}");
    }
}

#[test]
fn wrong_shapes_are_rejected() {
    let plain = Transpose::default();
    assert_shape_rejected(&[6], &[6, 2], &[1, 2], plain, "a");
    assert_shape_rejected(&[2, 3, 4], &[2, 2, 4, 5], &[2, 3, 5], plain, "b");
    assert_shape_rejected(&[3, 4], &[5, 2], &[3, 2], plain, "b"); // K differs
    assert_shape_rejected(
        &[3, 4],
        &[4, 2],
        &[3, 2],
        Transpose { a: false, b: true },
        "b",
    );
    assert_shape_rejected(&[2, 3, 4], &[3, 4, 5], &[2, 3, 5], plain, "b"); // batch differs
    assert_shape_rejected(&[3, 4], &[4, 5], &[5, 3], plain, "out");
    assert_shape_rejected(&[2, 3, 4], &[4, 5], &[3, 5], plain, "out");
    // aᵀ of [2, 3, 4] is [2, 4, 3]: out must be [2, 4, 5].
    assert_shape_rejected(
        &[2, 3, 4],
        &[3, 5],
        &[2, 3, 5],
        Transpose { a: true, b: false },
        "out",
    );
}

#[test]
fn wrong_dtypes_workspace_and_layouts_are_rejected() {
    let (a32, a64, a16) = ([1f32; 6], [1f64; 6], [bf16::ONE; 6]);
    let (b32, b64, b16) = ([1f32; 6], [1f64; 6], [bf16::ONE; 6]);
    let mut out32 = [0f32; 4];
    let mut out64 = [0f64; 4];
    let mut out16 = [bf16::ZERO; 4];
    let t = Transpose::default();
    let a = TensorView::contiguous(&a32[..], [2, 3]).unwrap();
    let b = TensorView::contiguous(&b64[..], [3, 2]).unwrap();
    let mut out = TensorViewMut::contiguous(&mut out32[..], [2, 2]).unwrap();
    let err = matmul(&a, &b, &mut out, t, &mut []).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "b", .. }), "{err}");
    assert!(err.to_string().contains("`b`"), "{err}");
    let err = matmul_reference(&a, &b, &mut out, t).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "b", .. }), "{err}");

    let a = TensorView::contiguous(&a64[..], [2, 3]).unwrap();
    let b = TensorView::contiguous(&b64[..], [3, 2]).unwrap();
    let err = matmul(&a, &b, &mut out, t, &mut []).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "out", .. }), "{err}");
    assert!(err.to_string().contains("`out`"), "{err}");

    // bf16 inputs write f32, not bf16.
    let a = TensorView::contiguous(&a16[..], [2, 3]).unwrap();
    let b = TensorView::contiguous(&b16[..], [3, 2]).unwrap();
    let mut out_bf16 = TensorViewMut::contiguous(&mut out16[..], [2, 2]).unwrap();
    let mut workspace = [0f32; 12];
    let err = matmul(&a, &b, &mut out_bf16, t, &mut workspace).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                operand: "out",
                expected: DType::F32,
                ..
            }
        ),
        "{err}"
    );
    let err = matmul_reference(&a, &b, &mut out_bf16, t).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "out", .. }), "{err}");

    let mut out = TensorViewMut::contiguous(&mut out32[..], [2, 2]).unwrap();
    let err = matmul(&a, &b, &mut out, t, &mut workspace[..11]).unwrap_err();
    assert_eq!(
        err,
        Error::Workspace {
            op: "matmul",
            operand: "workspace",
            needed: 12,
            got: 11
        }
    );
    assert!(err.to_string().contains("`workspace`"), "{err}");
    matmul(&a, &b, &mut out, t, &mut workspace).unwrap();
    assert_eq!(out32, [3.0; 4]);

    let ints = [1i32; 6];
    let a = TensorView::contiguous(&ints[..], [2, 3]).unwrap();
    let b = TensorView::contiguous(&ints[..], [3, 2]).unwrap();
    let mut out = TensorViewMut::contiguous(&mut out64[..], [2, 2]).unwrap();
    let err = matmul(&a, &b, &mut out, t, &mut []).unwrap_err();
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
    let err = matmul_reference(&a, &b, &mut out, t).unwrap_err();
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

    // A transposed view of a is a layout error; the Transpose flag is the way to say it.
    let a = TensorView::new(&a32[..], [2, 3], &[1, 2], 0).unwrap();
    let b = TensorView::contiguous(&b32[..], [3, 2]).unwrap();
    let mut out = TensorViewMut::contiguous(&mut out32[..], [2, 2]).unwrap();
    let err = matmul(&a, &b, &mut out, t, &mut []).unwrap_err();
    assert!(
        matches!(err, Error::NotContiguous { operand: "a", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("`a`"), "{err}");
}
