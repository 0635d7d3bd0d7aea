//! Rejection tests of `rope`: each error `rope` and `rope_backward` can return, with the operand
//! it names.

use super::*;
use crate::Element;

fn view_mut<T: Element>(data: &mut [T], dims: [usize; 4]) -> TensorViewMut<'_> {
    TensorViewMut::contiguous(data, dims).unwrap()
}

#[track_caller]
fn assert_names(err: Error, operand: &str) {
    let message = err.to_string();
    assert!(message.contains(&format!("`{operand}`")), "{message}");
}

/// The error `rope` returns for these operands (it must fail).
fn rope_with(
    x: &TensorView<'_>,
    positions: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    theta: f64,
    out: &mut TensorViewMut<'_>,
) -> Error {
    rope(x, positions, bias, theta, out).unwrap_err()
}

#[test]
fn rope_rejections_name_the_operand() {
    let x = [0.5f32; 16];
    let x64 = [0.5f64; 16];
    let positions = [0i64, 3];
    let bias = [0.1f32; 8];
    let mut out = [0f32; 16];
    let mut out64 = [0f64; 16];
    let xv = TensorView::contiguous(&x[..], [1, 2, 2, 4]).unwrap();
    let pv = TensorView::contiguous(&positions[..], [1, 2]).unwrap();
    let bv = TensorView::contiguous(&bias[..], [8]).unwrap();
    assert!(rope(
        &xv,
        &pv,
        Some(&bv),
        1e4,
        &mut view_mut(&mut out, [1, 2, 2, 4])
    )
    .is_ok());

    let shape = |err: Error, operand| {
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert_names(err, operand);
    };
    let odd = TensorView::contiguous(&x[..15], [1, 1, 3, 5]).unwrap();
    let mut odd_buffer = [0f32; 15];
    let mut odd_out = TensorViewMut::contiguous(&mut odd_buffer[..], [1, 3, 1, 5]).unwrap();
    let one_position = TensorView::contiguous(&positions[..1], [1, 1]).unwrap();
    shape(rope_with(&odd, &one_position, None, 1e4, &mut odd_out), "x");
    let rank3 = TensorView::contiguous(&x[..], [2, 2, 4]).unwrap();
    shape(
        rope_with(
            &rank3,
            &pv,
            None,
            1e4,
            &mut view_mut(&mut out, [1, 2, 2, 4]),
        ),
        "x",
    );
    let pv_wrong = TensorView::contiguous(&positions[..], [2, 1]).unwrap();
    shape(
        rope_with(
            &xv,
            &pv_wrong,
            None,
            1e4,
            &mut view_mut(&mut out, [1, 2, 2, 4]),
        ),
        "positions",
    );
    let bv_wrong = TensorView::contiguous(&bias[..], [2, 4]).unwrap();
    shape(
        rope_with(
            &xv,
            &pv,
            Some(&bv_wrong),
            1e4,
            &mut view_mut(&mut out, [1, 2, 2, 4]),
        ),
        "bias",
    );
    let mut out_bthd = TensorViewMut::contiguous(&mut out64[..], [2, 1, 2, 4]).unwrap();
    let xv64 = TensorView::contiguous(&x64[..], [1, 2, 2, 4]).unwrap();
    shape(rope_with(&xv64, &pv, None, 1e4, &mut out_bthd), "out");

    for theta in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e39, 1e-50] {
        let err = rope_with(&xv, &pv, None, theta, &mut view_mut(&mut out, [1, 2, 2, 4]));
        assert!(matches!(err, Error::Argument { .. }), "{theta}: {err}");
        assert_names(err, "theta");
    }

    let negative = [1i32, -2];
    let nv = TensorView::contiguous(&negative[..], [1, 2]).unwrap();
    let err = rope_with(&xv, &nv, None, 1e4, &mut view_mut(&mut out, [1, 2, 2, 4]));
    assert!(
        matches!(
            err,
            Error::IndexOutOfRange {
                at: 1,
                value: -2,
                ..
            }
        ),
        "{err}"
    );
    assert_names(err, "positions");

    let float_positions = [0f32, 1.0];
    let fv = TensorView::contiguous(&float_positions[..], [1, 2]).unwrap();
    let err = rope_with(&xv, &fv, None, 1e4, &mut view_mut(&mut out, [1, 2, 2, 4]));
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(err, "positions");

    let mut out64v = TensorViewMut::contiguous(&mut out64[..], [1, 2, 2, 4]).unwrap();
    let err = rope_with(&xv, &pv, Some(&bv), 1e4, &mut out64v);
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(err, "out");
    let bias64 = [0.1f64; 8];
    let bv64 = TensorView::contiguous(&bias64[..], [8]).unwrap();
    let err = rope_with(
        &xv,
        &pv,
        Some(&bv64),
        1e4,
        &mut view_mut(&mut out, [1, 2, 2, 4]),
    );
    assert_names(err, "bias");

    let ids = [1i64; 16];
    let iv = TensorView::contiguous(&ids[..], [1, 2, 2, 4]).unwrap();
    let err = rope_with(&iv, &pv, None, 1e4, &mut view_mut(&mut out, [1, 2, 2, 4]));
    assert!(
        matches!(err, Error::UnsupportedDType { op: "rope", .. }),
        "{err}"
    );

    // x as the [B,T,H,D] transpose of a [B,H,T,D] buffer: not contiguous.
    let strided = TensorView::new(&x[..], [1, 2, 2, 4], &[16, 4, 8, 1], 0).unwrap();
    let err = rope_with(
        &strided,
        &pv,
        None,
        1e4,
        &mut view_mut(&mut out, [1, 2, 2, 4]),
    );
    assert!(matches!(err, Error::NotContiguous { .. }), "{err}");
    assert_names(err, "x");
}

#[test]
fn rope_backward_rejections_name_the_operand() {
    let g = [0.5f64; 16];
    let positions = [0i32, 3];
    let mut grad_x = [0f64; 16];
    let gv = TensorView::contiguous(&g[..], [1, 2, 2, 4]).unwrap();
    let pv = TensorView::contiguous(&positions[..], [1, 2]).unwrap();
    assert!(rope_backward(&gv, &pv, 1e4, &mut view_mut(&mut grad_x, [1, 2, 2, 4])).is_ok());

    let err = rope_backward(&gv, &pv, 1e4, &mut view_mut(&mut grad_x, [1, 2, 4, 2])).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert_names(err, "grad_x");
    let odd = TensorView::contiguous(&g[..6], [1, 2, 1, 3]).unwrap();
    let err = rope_backward(&odd, &pv, 1e4, &mut view_mut(&mut grad_x, [1, 2, 2, 4])).unwrap_err();
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    assert_names(err, "grad_out");
    let pv_wrong = TensorView::contiguous(&positions[..1], [1, 1]).unwrap();
    let err = rope_backward(
        &gv,
        &pv_wrong,
        1e4,
        &mut view_mut(&mut grad_x, [1, 2, 2, 4]),
    )
    .unwrap_err();
    assert_names(err, "positions");
    let err =
        rope_backward(&gv, &pv, f64::NAN, &mut view_mut(&mut grad_x, [1, 2, 2, 4])).unwrap_err();
    assert!(matches!(err, Error::Argument { .. }), "{err}");
    assert_names(err, "theta");
    let negative = [-1i64, 0];
    let nv = TensorView::contiguous(&negative[..], [1, 2]).unwrap();
    let err = rope_backward(&gv, &nv, 1e4, &mut view_mut(&mut grad_x, [1, 2, 2, 4])).unwrap_err();
    assert!(matches!(err, Error::IndexOutOfRange { at: 0, .. }), "{err}");
    let mut grad_x32 = [0f32; 16];
    let mut gx32 = TensorViewMut::contiguous(&mut grad_x32[..], [1, 2, 2, 4]).unwrap();
    let err = rope_backward(&gv, &pv, 1e4, &mut gx32).unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(err, "grad_x");
}
