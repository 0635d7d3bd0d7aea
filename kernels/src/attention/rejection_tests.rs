//! Rejection tests of the causal GQA kernels: every error names the operand at fault.

use super::tests::{case, view, view_mut};
use super::*;
use kiln_ir::DType;

/// Calls the forward with the given shapes (f32 data of matching sizes) and returns its error.
fn forward_error(q: &[usize], k: &[usize], v: &[usize], probs: &[usize], out: &[usize]) -> Error {
    let len = |shape: &[usize]| shape.iter().product::<usize>();
    let (qd, kd, vd) = (
        vec![0.5f32; len(q)],
        vec![0.5f32; len(k)],
        vec![0.5f32; len(v)],
    );
    let (mut pd, mut od) = (vec![0f32; len(probs)], vec![0f32; len(out)]);
    attention(
        &view(&qd, q),
        &view(&kd, k),
        &view(&vd, v),
        1.0,
        &mut view_mut(&mut pd, probs),
        &mut view_mut(&mut od, out),
    )
    .unwrap_err()
}

#[track_caller]
fn assert_names(err: &Error, operand: &str) {
    let message = err.to_string();
    assert!(message.contains(&format!("`{operand}`")), "{message}");
}

#[test]
fn forward_rejects_bad_shapes() {
    let shape_of = |err: Error, operand: &str| {
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert_names(&err, operand);
    };
    let (q, kv) = ([1, 6, 3, 4], [1, 2, 5, 4]);
    let (probs, out) = ([1, 6, 3, 5], [1, 3, 6, 4]);
    // Hq = 6 is not a multiple of Hkv = 4; Hkv = 0 divides nothing.
    shape_of(
        forward_error(&q, &[1, 4, 5, 4], &[1, 4, 5, 4], &probs, &out),
        "k",
    );
    shape_of(
        forward_error(&q, &[1, 0, 5, 4], &[1, 0, 5, 4], &probs, &out),
        "k",
    );
    // T = 3 queries but only S = 2 keys.
    shape_of(
        forward_error(&q, &[1, 2, 2, 4], &[1, 2, 2, 4], &[1, 6, 3, 2], &out),
        "q",
    );
    shape_of(forward_error(&q, &[1, 2, 5, 3], &kv, &probs, &out), "k");
    shape_of(forward_error(&q, &kv, &[1, 2, 4, 4], &probs, &out), "v");
    shape_of(forward_error(&q, &kv, &kv, &[1, 6, 3, 4], &out), "probs");
    // out must be BTHD, not BHTD.
    shape_of(forward_error(&q, &kv, &kv, &probs, &[1, 6, 3, 4]), "out");
    shape_of(forward_error(&[6, 3, 4], &kv, &kv, &probs, &out), "q");
}

#[test]
fn forward_rejects_bad_dtypes_and_layouts() {
    let (q, k64, v) = (vec![0.5f32; 8], vec![0.5f64; 8], vec![0.5f32; 8]);
    let (mut probs, mut out) = (vec![0f32; 4], vec![0f32; 8]);
    let err = attention(
        &view(&q, &[1, 2, 2, 2]),
        &view(&k64, &[1, 2, 2, 2]),
        &view(&v, &[1, 2, 2, 2]),
        1.0,
        &mut view_mut(&mut probs, &[1, 1, 2, 2]),
        &mut view_mut(&mut out, &[1, 2, 1, 2]),
    );
    // Shapes are checked first: probs has the wrong head count here.
    assert!(matches!(err, Err(Error::Shape { .. })));
    let mut probs = vec![0f32; 8];
    let err = attention(
        &view(&q, &[1, 2, 2, 2]),
        &view(&k64, &[1, 2, 2, 2]),
        &view(&v, &[1, 2, 2, 2]),
        1.0,
        &mut view_mut(&mut probs, &[1, 2, 2, 2]),
        &mut view_mut(&mut out, &[1, 2, 2, 2]),
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { operand: "k", .. }), "{err}");
    assert_names(&err, "k");

    let ids = vec![1i32; 8];
    let err = attention(
        &view(&ids, &[1, 2, 2, 2]),
        &view(&ids, &[1, 2, 2, 2]),
        &view(&ids, &[1, 2, 2, 2]),
        1.0,
        &mut view_mut(&mut probs, &[1, 2, 2, 2]),
        &mut view_mut(&mut out, &[1, 2, 2, 2]),
    )
    .unwrap_err();
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

    // q viewed with its T and D axes swapped is not contiguous.
    let q_t = TensorView::new(&q[..], [1, 2, 2, 2], &[4, 2, 1, 2], 0).unwrap();
    let k = vec![0.5f32; 8];
    let err = attention(
        &q_t,
        &view(&k, &[1, 2, 2, 2]),
        &view(&v, &[1, 2, 2, 2]),
        1.0,
        &mut view_mut(&mut probs, &[1, 2, 2, 2]),
        &mut view_mut(&mut out, &[1, 2, 2, 2]),
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::NotContiguous { operand: "q", .. }),
        "{err}"
    );
}

#[test]
fn backward_rejects_bad_operands() {
    let c = case(1, 4, 2, 3, 5, 2);
    let q_shape = [c.b, c.hq, c.t, c.d];
    let kv_shape = [c.b, c.hkv, c.s, c.d];
    let bthd = [c.b, c.t, c.hq, c.d];
    let probs_shape = [c.b, c.hq, c.t, c.s];
    let (q, kv) = (vec![0.5f64; c.q_len()], vec![0.5f64; c.kv_len()]);
    let (probs, grad_out) = (vec![0.2f64; c.probs_len()], vec![1.0f64; c.q_len()]);
    let call = |probs_shape: &[usize], workspace_len: usize, workspace_f32: bool| {
        let mut grad_q = vec![0f64; c.q_len()];
        let (mut grad_k, mut grad_v) = (vec![0f64; c.kv_len()], vec![0f64; c.kv_len()]);
        let mut ws64 = vec![0f64; workspace_len];
        let mut ws32 = vec![0f32; workspace_len];
        let mut workspace = if workspace_f32 {
            view_mut(&mut ws32, &[workspace_len])
        } else {
            view_mut(&mut ws64, &[workspace_len])
        };
        attention_backward(
            &view(&q, &q_shape),
            &view(&kv, &kv_shape),
            &view(&kv, &kv_shape),
            &view(&probs[..probs_shape.iter().product()], probs_shape),
            &view(&grad_out, &bthd),
            1.0,
            &mut view_mut(&mut grad_q, &q_shape),
            &mut view_mut(&mut grad_k, &kv_shape),
            &mut view_mut(&mut grad_v, &kv_shape),
            &mut workspace,
        )
    };
    assert!(call(&probs_shape, c.s, false).is_ok());
    let err = call(&probs_shape, c.s - 1, false).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Workspace {
                needed: 5,
                got: 4,
                ..
            }
        ),
        "{err}"
    );
    assert_names(&err, "workspace");
    let err = call(&probs_shape, c.s, true).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                operand: "workspace",
                ..
            }
        ),
        "{err}"
    );
    let err = call(&[c.b, c.hkv, c.t, c.s], c.s, false).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "probs",
                ..
            }
        ),
        "{err}"
    );
    assert_names(&err, "probs");

    // grad_k shaped like grad_q.
    let mut grad_q = vec![0f64; c.q_len()];
    let (mut grad_k, mut grad_v) = (vec![0f64; c.q_len()], vec![0f64; c.kv_len()]);
    let mut workspace = vec![0f64; c.s];
    let err = attention_backward(
        &view(&q, &q_shape),
        &view(&kv, &kv_shape),
        &view(&kv, &kv_shape),
        &view(&probs, &probs_shape),
        &view(&grad_out, &bthd),
        1.0,
        &mut view_mut(&mut grad_q, &q_shape),
        &mut view_mut(&mut grad_k, &q_shape),
        &mut view_mut(&mut grad_v, &kv_shape),
        &mut view_mut(&mut workspace, &[c.s]),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "grad_k",
                ..
            }
        ),
        "{err}"
    );
}
