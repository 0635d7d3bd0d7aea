//! Rejection tests of `norm`: each error a norm kernel can return, with the operand it names.

use super::*;
use crate::Element;

const EPS: f64 = 1e-6;

fn view<'a, T: Element>(data: &'a [T], dims: &[usize]) -> TensorView<'a> {
    TensorView::contiguous(data, dims).unwrap()
}

fn view_mut<'a, T: Element>(data: &'a mut [T], dims: &[usize]) -> TensorViewMut<'a> {
    TensorViewMut::contiguous(data, dims).unwrap()
}

#[track_caller]
fn assert_names(err: Error, operand: &str) {
    let message = err.to_string();
    assert!(message.contains(&format!("`{operand}`")), "{message}");
}

#[test]
fn rejects_bad_eps() {
    let x = [1.0f32, 2.0];
    let weight = [1.0f32, 1.0];
    let mut out = [0.0f32; 2];
    for eps in [-1e-6, f64::NAN, f64::INFINITY] {
        let err = rmsnorm(
            &view(&x, &[1, 2]),
            &view(&weight, &[2]),
            eps,
            &mut view_mut(&mut out, &[1, 2]),
        )
        .unwrap_err();
        assert!(matches!(err, Error::Argument { .. }), "{err}");
        assert_names(err, "eps");
    }
}

#[test]
fn rejects_wrong_shapes() {
    let x = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
    let weight = [1.0f64, 1.0, 1.0];
    let mut a = [0.0f64; 6];
    let mut b = [0.0f64; 6];
    let mut gw = [0.0f64; 3];
    let shape_err = |result: Result<()>, operand: &str| {
        let err = result.unwrap_err();
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert_names(err, operand);
    };
    let scalar = TensorView::contiguous(&x[..1], [0usize; 0]).unwrap();
    shape_err(
        rmsnorm(
            &scalar,
            &view(&weight, &[3]),
            EPS,
            &mut view_mut(&mut a, &[2, 3]),
        ),
        "x",
    );
    shape_err(
        rmsnorm(
            &view(&x, &[3, 2]),
            &view(&weight, &[3]),
            EPS,
            &mut view_mut(&mut a, &[3, 2]),
        ),
        "weight",
    );
    shape_err(
        rmsnorm(
            &view(&x, &[2, 3]),
            &view(&weight, &[3]),
            EPS,
            &mut view_mut(&mut a, &[6]),
        ),
        "out",
    );
    shape_err(
        add_rmsnorm(
            &view(&x, &[2, 3]),
            &view(&x, &[6, 1]),
            &view(&weight, &[3]),
            EPS,
            &mut view_mut(&mut a, &[2, 3]),
            &mut view_mut(&mut b, &[2, 3]),
        ),
        "residual",
    );
    shape_err(
        add_rmsnorm(
            &view(&x, &[2, 3]),
            &view(&x, &[2, 3]),
            &view(&weight, &[3]),
            EPS,
            &mut view_mut(&mut a, &[3, 2]),
            &mut view_mut(&mut b, &[2, 3]),
        ),
        "sum",
    );
    shape_err(
        rmsnorm_backward(
            &view(&x, &[2, 3]),
            &view(&weight, &[3]),
            &view(&x, &[1, 6]),
            EPS,
            &mut view_mut(&mut a, &[2, 3]),
            &mut view_mut(&mut gw, &[3]),
        ),
        "grad_out",
    );
    shape_err(
        rmsnorm_backward(
            &view(&x, &[2, 3]),
            &view(&weight, &[3]),
            &view(&x, &[2, 3]),
            EPS,
            &mut view_mut(&mut a, &[2, 3]),
            &mut view_mut(&mut gw[..2], &[2]),
        ),
        "grad_weight",
    );
    shape_err(
        add_rmsnorm_backward(
            &view(&x, &[2, 3]),
            &view(&weight, &[3]),
            &view(&x, &[2, 3]),
            Some(&view(&x, &[3, 2])),
            EPS,
            &mut view_mut(&mut a, &[2, 3]),
            &mut view_mut(&mut gw, &[3]),
        ),
        "grad_sum",
    );
    shape_err(
        add_rmsnorm_backward(
            &view(&x, &[2, 3]),
            &view(&weight, &[3]),
            &view(&x, &[2, 3]),
            None,
            EPS,
            &mut view_mut(&mut a, &[6]),
            &mut view_mut(&mut gw, &[3]),
        ),
        "grad_input",
    );
}

#[test]
fn rejects_wrong_dtypes_and_layouts() {
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let weight64 = [1.0f64, 1.0, 1.0];
    let mut out = [0.0f32; 6];
    let err = rmsnorm(
        &view(&x, &[2, 3]),
        &view(&weight64, &[3]),
        EPS,
        &mut view_mut(&mut out, &[2, 3]),
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(err, "weight");

    let ids = [1i32, 2, 3, 4, 5, 6];
    let err = rmsnorm(
        &view(&ids, &[2, 3]),
        &view(&weight64, &[3]),
        EPS,
        &mut view_mut(&mut out, &[2, 3]),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedDType { op: "rmsnorm", .. }),
        "{err}"
    );

    let weight = [1.0f32, 1.0, 1.0];
    let grad_sum64 = [1.0f64; 6];
    let mut grad_weight = [0.0f32; 3];
    let err = add_rmsnorm_backward(
        &view(&x, &[2, 3]),
        &view(&weight, &[3]),
        &view(&x, &[2, 3]),
        Some(&view(&grad_sum64, &[2, 3])),
        EPS,
        &mut view_mut(&mut out, &[2, 3]),
        &mut view_mut(&mut grad_weight, &[3]),
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(err, "grad_sum");

    // The transpose of a [3,2] matrix: shape [2,3] but column-major.
    let transposed = TensorView::new(&x[..], [2, 3], &[1, 2], 0).unwrap();
    let err = rmsnorm(
        &transposed,
        &view(&weight, &[3]),
        EPS,
        &mut view_mut(&mut out, &[2, 3]),
    )
    .unwrap_err();
    assert!(matches!(err, Error::NotContiguous { .. }), "{err}");
    assert_names(err, "x");
}
