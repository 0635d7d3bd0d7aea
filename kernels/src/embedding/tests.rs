//! Tests of the embedding kernels against plain f64 gathers and central differences.

use super::*;
use crate::element::Element;
use crate::testing::{self, assert_close, central_difference, dot};
use kiln_ir::DType;

const VOCAB: usize = 11;

/// `ids_shape ++ [hidden]`.
fn rows_shape(ids_shape: &[usize], hidden: usize) -> Vec<usize> {
    let mut dims = ids_shape.to_vec();
    dims.push(hidden);
    dims
}

/// Runs [`embedding`] in dtype `T` with ids as i32 or i64; `out` starts as NaN so every
/// element the kernel fails to write shows up.
fn run_forward<T: Real>(
    weight: &[f64],
    (vocab, hidden): (usize, usize),
    ids: &[i64],
    ids_shape: &[usize],
    ids_as_i32: bool,
) -> Result<Vec<f64>> {
    let table: Vec<T> = weight.iter().map(|&w| T::of(w)).collect();
    let weight = TensorView::contiguous(&table, [vocab, hidden])?;
    let ids32: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let ids = if ids_as_i32 {
        TensorView::contiguous(&ids32, ids_shape)?
    } else {
        TensorView::contiguous(ids, ids_shape)?
    };
    let out_shape = rows_shape(ids_shape, hidden);
    let mut out = vec![T::nan(); out_shape.iter().product()];
    embedding(
        &weight,
        &ids,
        &mut TensorViewMut::contiguous(&mut out, &out_shape[..])?,
    )?;
    Ok(out.iter().map(|&x| Element::to_f64(x)).collect())
}

/// Runs [`embedding_backward`] in dtype `T`; `grad_weight` starts as NaN.
fn run_backward<T: Real>(
    ids: &[i64],
    ids_shape: &[usize],
    grad_out: &[f64],
    vocab: usize,
    hidden: usize,
) -> Result<Vec<T>> {
    let rows: Vec<T> = grad_out.iter().map(|&g| T::of(g)).collect();
    let out_shape = rows_shape(ids_shape, hidden);
    let mut grad_weight = vec![T::nan(); vocab * hidden];
    embedding_backward(
        &TensorView::contiguous(ids, ids_shape)?,
        &TensorView::contiguous(&rows, &out_shape[..])?,
        None,
        &mut TensorViewMut::contiguous(&mut grad_weight, [vocab, hidden])?,
    )?;
    Ok(grad_weight)
}

/// The gather written plainly from the definition, in f64.
fn naive_gather(weight: &[f64], hidden: usize, ids: &[i64]) -> Vec<f64> {
    let mut out = Vec::new();
    for &id in ids {
        for h in 0..hidden {
            out.push(weight[id as usize * hidden + h]);
        }
    }
    out
}

fn rounded<T: Real>(values: &[f64]) -> Vec<f64> {
    values.iter().map(|&v| Element::to_f64(T::of(v))).collect()
}

fn check_forward<T: Real>(name: &str) {
    let mut rng = testing::rng(name);
    let cases: [(&[usize], usize); 7] = [
        (&[5], 7),
        (&[2, 3], 13),
        (&[], 4),
        (&[0], 5),
        (&[3, 0], 6),
        (&[4], 0),
        (&[3, 2, 2], 9),
    ];
    for (ids_shape, hidden) in cases {
        let weight = rounded::<T>(&testing::signed(&mut rng, VOCAB * hidden));
        let ids = testing::indices(&mut rng, ids_shape.iter().product(), VOCAB);
        let want = naive_gather(&weight, hidden, &ids);
        for ids_as_i32 in [false, true] {
            let got =
                run_forward::<T>(&weight, (VOCAB, hidden), &ids, ids_shape, ids_as_i32).unwrap();
            // A gather copies values, so it is exact.
            assert_eq!(
                got, want,
                "ids {ids_shape:?}, H {hidden}, i32 ids {ids_as_i32}"
            );
        }
    }
}

#[test]
fn forward_gathers_rows_f32() {
    check_forward::<f32>("forward_gathers_rows_f32");
}

#[test]
fn forward_gathers_rows_f64() {
    check_forward::<f64>("forward_gathers_rows_f64");
}

#[test]
fn backward_matches_central_difference() {
    let mut rng = testing::rng("backward_matches_central_difference");
    let (vocab, hidden, ids_shape) = (6, 5, [3, 4]);
    // 12 tokens over 6 rows: some rows repeat, and the repeats must add up.
    let ids = testing::indices(&mut rng, 12, vocab);
    let weight = testing::signed(&mut rng, vocab * hidden);
    let cotangent = testing::signed(&mut rng, 12 * hidden);
    let loss = |w: &[f64]| {
        dot(
            &cotangent,
            &run_forward::<f64>(w, (vocab, hidden), &ids, &ids_shape, false).unwrap(),
        )
    };
    let want = central_difference(loss, &weight, 1e-6);
    let got = run_backward::<f64>(&ids, &ids_shape, &cotangent, vocab, hidden).unwrap();
    assert_close("grad_weight", &got, &want, 1e-6, 1e-6);
}

#[test]
fn backward_f32_adds_repeated_ids_in_token_order() {
    let mut rng = testing::rng("backward_f32_adds_repeated_ids_in_token_order");
    let (vocab, hidden, tokens) = (3, 9, 50);
    let ids = testing::indices(&mut rng, tokens, vocab);
    let grad_out = rounded::<f32>(&testing::signed(&mut rng, tokens * hidden));
    let got = run_backward::<f32>(&ids, &[tokens], &grad_out, vocab, hidden).unwrap();

    // The promised order, spelled out: start at zero, add tokens 0, 1, 2, ... in f32.
    let mut in_order = vec![0f32; vocab * hidden];
    let mut in_f64 = vec![0f64; vocab * hidden];
    for (n, &id) in ids.iter().enumerate() {
        for h in 0..hidden {
            in_order[id as usize * hidden + h] += grad_out[n * hidden + h] as f32;
            in_f64[id as usize * hidden + h] += grad_out[n * hidden + h];
        }
    }
    assert_eq!(got, in_order);
    let got64: Vec<f64> = got.iter().map(|&g| g as f64).collect();
    assert_close("grad_weight vs f64", &got64, &in_f64, 1e-5, 1e-5);

    let again = run_backward::<f32>(&ids, &[tokens], &grad_out, vocab, hidden).unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&again));
}

#[test]
fn out_of_range_ids_are_rejected_before_writing() {
    let weight = [0.5f32; VOCAB * 2];
    let weight = TensorView::contiguous(&weight[..], [VOCAB, 2]).unwrap();
    for (ids, at, value) in [
        (vec![0i64, 3, VOCAB as i64, 1], 2, VOCAB as i64),
        (vec![-1i64, 2], 0, -1),
    ] {
        let mut out = vec![f32::NAN; ids.len() * 2];
        let err = embedding(
            &weight,
            &TensorView::contiguous(&ids, [ids.len()]).unwrap(),
            &mut TensorViewMut::contiguous(&mut out, [ids.len(), 2]).unwrap(),
        )
        .unwrap_err();
        let expected = Error::IndexOutOfRange {
            op: "embedding",
            operand: "ids",
            at,
            value,
            bound: VOCAB,
        };
        assert_eq!(err, expected);
        assert!(err.to_string().contains("`ids`"), "{err}");
        assert!(out.iter().all(|x| x.is_nan()), "out was written");

        let grad_out = vec![1f64; ids.len() * 2];
        let err = run_backward::<f64>(&ids, &[ids.len()], &grad_out, VOCAB, 2).unwrap_err();
        assert!(
            matches!(err, Error::IndexOutOfRange { operand: "ids", at: a, .. } if a == at),
            "{err}"
        );
    }
    // i32 ids take the same check.
    let err = run_forward::<f64>(&[1.0; VOCAB], (VOCAB, 1), &[12], &[1], true).unwrap_err();
    assert!(
        matches!(err, Error::IndexOutOfRange { value: 12, .. }),
        "{err}"
    );
}

#[test]
fn wrong_shapes_are_rejected() {
    let table = [1f32; 12];
    let ids = [0i64, 1];
    let ids = TensorView::contiguous(&ids[..], [2]).unwrap();
    let mut out = [0f32; 8];

    let flat = TensorView::contiguous(&table[..], [12]).unwrap();
    let mut rows = TensorViewMut::contiguous(&mut out[..], [2, 4]).unwrap();
    let err = embedding(&flat, &ids, &mut rows).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "weight",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("`weight`"), "{err}");

    let weight = TensorView::contiguous(&table[..], [3, 4]).unwrap();
    let mut wrong = TensorViewMut::contiguous(&mut out[..], [2, 2]).unwrap();
    let err = embedding(&weight, &ids, &mut wrong).unwrap_err();
    assert!(matches!(err, Error::Shape { operand: "out", .. }), "{err}");
    assert!(err.to_string().contains("`out`"), "{err}");

    let grad_out = [1f32; 6];
    let grad_out = TensorView::contiguous(&grad_out[..], [2, 3]).unwrap();
    let mut grad = vec![0f32; 12];
    let mut grad_weight = TensorViewMut::contiguous(&mut grad, [3, 4]).unwrap();
    let err = embedding_backward(&ids, &grad_out, None, &mut grad_weight).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "grad_out",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("`grad_out`"), "{err}");

    let mut grad_weight = TensorViewMut::contiguous(&mut grad, [12]).unwrap();
    let err = embedding_backward(&ids, &grad_out, None, &mut grad_weight).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "grad_weight",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn wrong_dtypes_and_layouts_are_rejected() {
    let table = [1f32; 12];
    let weight = TensorView::contiguous(&table[..], [3, 4]).unwrap();
    let mut out = [0f32; 8];
    let mut rows = TensorViewMut::contiguous(&mut out[..], [2, 4]).unwrap();

    let float_ids = [0f32, 1.0];
    let float_ids = TensorView::contiguous(&float_ids[..], [2]).unwrap();
    let err = embedding(&weight, &float_ids, &mut rows).unwrap_err();
    // The error names i64; i32 ids are accepted too.
    assert_eq!(
        err,
        Error::DType {
            op: "embedding",
            operand: "ids",
            expected: DType::I64,
            got: DType::F32,
        }
    );
    assert!(err.to_string().contains("`ids`"), "{err}");
    let mut grad = vec![0f32; 12];
    let mut grad_weight = TensorViewMut::contiguous(&mut grad, [3, 4]).unwrap();
    let grad_rows = [1f32; 8];
    let grad_rows = TensorView::contiguous(&grad_rows[..], [2, 4]).unwrap();
    let err = embedding_backward(&float_ids, &grad_rows, None, &mut grad_weight).unwrap_err();
    assert_eq!(
        err,
        Error::DType {
            op: "embedding_backward",
            operand: "ids",
            expected: DType::I64,
            got: DType::F32,
        }
    );

    let ids = [0i32, 1];
    let ids = TensorView::contiguous(&ids[..], [2]).unwrap();
    let int_table = [1i32; 12];
    let int_weight = TensorView::contiguous(&int_table[..], [3, 4]).unwrap();
    let err = embedding(&int_weight, &ids, &mut rows).unwrap_err();
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

    let mut out64 = [0f64; 8];
    let mut rows64 = TensorViewMut::contiguous(&mut out64[..], [2, 4]).unwrap();
    let err = embedding(&weight, &ids, &mut rows64).unwrap_err();
    assert!(matches!(err, Error::DType { operand: "out", .. }), "{err}");
    assert!(err.to_string().contains("`out`"), "{err}");

    // Every second id of four: not contiguous.
    let spaced = [0i64, 9, 1, 9];
    let spaced = TensorView::new(&spaced[..], [2], &[2], 0).unwrap();
    let err = embedding(&weight, &spaced, &mut rows).unwrap_err();
    assert!(
        matches!(err, Error::NotContiguous { operand: "ids", .. }),
        "{err}"
    );
    assert!(err.to_string().contains("`ids`"), "{err}");

    let grad_out = [1f64; 8];
    let grad_out = TensorView::contiguous(&grad_out[..], [2, 4]).unwrap();
    let mut grad = vec![0f32; 12];
    let mut grad_weight = TensorViewMut::contiguous(&mut grad, [3, 4]).unwrap();
    let err = embedding_backward(&ids, &grad_out, None, &mut grad_weight).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                operand: "grad_out",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("`grad_out`"), "{err}");
}

#[test]
fn backward_onto_a_base_adds_the_base_after_the_sums() {
    // Three ids over a vocabulary of 3, hidden 2: id 2 twice, id 0 once, id 1 never.
    let ids = [2i64, 0, 2];
    let grad_out = [0.5f32, -1.25, 2.0, 0.75, 0.125, 3.5];
    // -0.0 where no token lands: the sum 0.0 plus -0.0 is +0.0, as an `Add` after the scatter.
    let base = [1.5f32, -0.0, -0.0, 0.25, f32::NAN, -2.0];
    let mut got = vec![f32::NAN; 6];
    embedding_backward(
        &TensorView::contiguous(&ids[..], [3]).unwrap(),
        &TensorView::contiguous(&grad_out[..], [3, 2]).unwrap(),
        Some(&TensorView::contiguous(&base[..], [3, 2]).unwrap()),
        &mut TensorViewMut::contiguous(&mut got, [3, 2]).unwrap(),
    )
    .unwrap();
    let sums = [2.0, 0.75, 0.0, 0.0, 0.5 + 0.125, -1.25 + 3.5];
    for (k, (&g, (&s, &b))) in got.iter().zip(sums.iter().zip(&base)).enumerate() {
        let want: f32 = s + b;
        assert_eq!(g.to_bits(), want.to_bits(), "element {k}: {g} vs {want}");
    }
    assert_eq!(got[2].to_bits(), 0.0f32.to_bits());
    assert!(got[4].is_nan());
}
