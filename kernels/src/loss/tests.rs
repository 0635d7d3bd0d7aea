//! Tests of cross-entropy against a naive f64 formula and central differences.

use super::*;
use crate::element::Element;
use crate::error::Error;
use crate::testing::{self, assert_close, central_difference};
use kiln_ir::DType;
use rand::rngs::StdRng;
use rand::Rng;

const IGNORE: i64 = -100;

fn view<'a, T: Element>(data: &'a [T], shape: &[usize]) -> TensorView<'a> {
    TensorView::contiguous(data, shape).unwrap()
}

fn view_mut<'a, T: Element>(data: &'a mut [T], shape: &[usize]) -> TensorViewMut<'a> {
    TensorViewMut::contiguous(data, shape).unwrap()
}

fn cast<T: Real>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&x| T::of(x)).collect()
}

/// Random targets in `0..vocab`, about a quarter of them replaced by `ignore`.
fn random_targets(rng: &mut StdRng, rows: usize, vocab: usize, ignore: i64) -> Vec<i64> {
    let mut targets = testing::indices(rng, rows, vocab);
    for t in &mut targets {
        if rng.random_range(0..4) == 0 {
            *t = ignore;
        }
    }
    targets
}

/// The loss written plainly: log-sum-exp with the max subtracted, averaged over kept rows.
fn naive_loss(logits: &[f64], targets: &[i64], vocab: usize, ignore: i64) -> f64 {
    let (mut total, mut count) = (0.0, 0.0);
    for (row, &t) in logits.chunks(vocab.max(1)).zip(targets) {
        if t == ignore {
            continue;
        }
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        total += lse - row[t as usize];
        count += 1.0;
    }
    total / count
}

/// Runs the forward in `T` with targets of dtype `I`.
fn run_loss<T: Real, I: Element>(
    logits: &[f64],
    targets: &[i64],
    vocab: usize,
    ignore: i64,
) -> f64 {
    let rows = targets.len();
    let logits = cast::<T>(logits);
    let targets: Vec<I> = targets.iter().map(|&t| I::from_f64(t as f64)).collect();
    let mut loss = [T::of(9.0)];
    cross_entropy(
        &view(&logits, &[rows, vocab]),
        &view(&targets, &[rows]),
        ignore,
        &mut view_mut(&mut loss, &[]),
    )
    .unwrap();
    Element::to_f64(loss[0])
}

fn run_backward<T: Real>(
    logits: &[f64],
    targets: &[i64],
    vocab: usize,
    ignore: i64,
    grad: f64,
) -> Vec<f64> {
    let rows = targets.len();
    let logits = cast::<T>(logits);
    let grad_loss = [T::of(grad)];
    let mut grad_logits = vec![T::of(9.0); logits.len()];
    cross_entropy_backward(
        &view(&logits, &[rows, vocab]),
        &view(targets, &[rows]),
        ignore,
        &view(&grad_loss, &[]),
        &mut view_mut(&mut grad_logits, &[rows, vocab]),
    )
    .unwrap();
    grad_logits.iter().map(|&g| Element::to_f64(g)).collect()
}

/// (rows, vocab), including V = 1 and sizes that are not multiples of 8.
const SIZES: [(usize, usize); 6] = [(1, 1), (5, 1), (7, 13), (16, 33), (3, 1000), (9, 2)];

#[test]
fn forward_matches_naive() {
    let mut rng = testing::rng("cross_entropy");
    for (rows, vocab) in SIZES {
        // An in-range ignore_index (torch allows it) as well as the usual −100.
        for ignore in [IGNORE, 0] {
            let logits = testing::uniform(&mut rng, rows * vocab, -6.0, 6.0);
            let mut targets = random_targets(&mut rng, rows, vocab, ignore);
            targets[0] = (vocab - 1) as i64; // at least one counted row when vocab > 1
            let want = naive_loss(&logits, &targets, vocab, ignore);
            let what = format!("{rows}x{vocab} ignore {ignore}");
            if want.is_nan() {
                // vocab == 1 with ignore 0: every row ignored.
                assert!(
                    run_loss::<f64, i64>(&logits, &targets, vocab, ignore).is_nan(),
                    "{what}"
                );
                continue;
            }
            let got = run_loss::<f64, i64>(&logits, &targets, vocab, ignore);
            assert_close(&what, &[got], &[want], 1e-13, 1e-14);
            let got = run_loss::<f64, i32>(&logits, &targets, vocab, ignore);
            assert_close(&what, &[got], &[want], 1e-13, 1e-14);
            let want = naive_loss(
                &cast::<f32>(&logits)
                    .iter()
                    .map(|&x| x as f64)
                    .collect::<Vec<_>>(),
                &targets,
                vocab,
                ignore,
            );
            let got = run_loss::<f32, i32>(&logits, &targets, vocab, ignore);
            assert_close(&format!("{what} f32"), &[got], &[want], 1e-5, 1e-6);
        }
    }
}

#[test]
fn large_logits_stay_finite() {
    // Row 0: ln(e^0 + e^-2000 + e^-1) − (−1) with the max 1000 shifted out.
    let logits = [1000.0, -1000.0, 999.0, -1000.0, -1000.0, -999.0];
    let targets = [2, 0];
    let e = (-1.0f64).exp();
    let row0 = (1.0 + e).ln() + 1.0;
    let row1 = (2.0 * e + 1.0).ln() + 1.0;
    let want = (row0 + row1) / 2.0;
    assert_close(
        "f64",
        &[run_loss::<f64, i64>(&logits, &targets, 3, IGNORE)],
        &[want],
        1e-15,
        0.0,
    );
    assert_close(
        "f32",
        &[run_loss::<f32, i64>(&logits, &targets, 3, IGNORE)],
        &[want],
        1e-6,
        0.0,
    );
    let grad = run_backward::<f32>(&logits, &targets, 3, IGNORE, 1.0);
    assert!(grad.iter().all(|g| g.is_finite()), "{grad:?}");
}

#[test]
fn ignored_rows_do_not_count() {
    let mut rng = testing::rng("cross_entropy_ignored");
    let (rows, vocab) = (6, 5);
    let logits = testing::signed(&mut rng, rows * vocab);
    let targets = [1, IGNORE, 4, IGNORE, IGNORE, 0];
    // The mean over the 3 kept rows equals the loss of those rows alone.
    let kept: Vec<f64> = [0, 2, 5]
        .iter()
        .flat_map(|&r| logits[r * vocab..(r + 1) * vocab].to_vec())
        .collect();
    let alone = run_loss::<f64, i64>(&kept, &[1, 4, 0], vocab, IGNORE);
    let with_ignored = run_loss::<f64, i64>(&logits, &targets, vocab, IGNORE);
    assert_close("kept rows", &[with_ignored], &[alone], 1e-15, 0.0);
    let grad = run_backward::<f64>(&logits, &targets, vocab, IGNORE, 0.7);
    for r in [1, 3, 4] {
        assert!(
            grad[r * vocab..(r + 1) * vocab].iter().all(|&g| g == 0.0),
            "row {r}"
        );
    }

    // Every row ignored (or none at all): NaN loss as torch gives, zero gradient.
    let all_ignored = [IGNORE; 6];
    assert!(run_loss::<f32, i64>(&logits, &all_ignored, vocab, IGNORE).is_nan());
    assert!(run_loss::<f64, i64>(&[], &[], vocab, IGNORE).is_nan());
    let grad = run_backward::<f64>(&logits, &all_ignored, vocab, IGNORE, 1.0);
    assert!(grad.iter().all(|&g| g == 0.0));
}

#[test]
fn backward_matches_central_differences() {
    let mut rng = testing::rng("cross_entropy_backward");
    for (rows, vocab) in SIZES {
        let logits = testing::uniform(&mut rng, rows * vocab, -4.0, 4.0);
        let mut targets = random_targets(&mut rng, rows, vocab, IGNORE);
        targets[0] = 0;
        let grad_loss = testing::uniform(&mut rng, 1, 0.5, 2.0)[0];
        let got = run_backward::<f64>(&logits, &targets, vocab, IGNORE, grad_loss);
        let loss = |x: &[f64]| grad_loss * run_loss::<f64, i64>(x, &targets, vocab, IGNORE);
        let numeric = central_difference(loss, &logits, 1e-6);
        assert_close(&format!("{rows}x{vocab}"), &got, &numeric, 1e-6, 1e-8);

        let got32 = run_backward::<f32>(&logits, &targets, vocab, IGNORE, grad_loss);
        assert_close(&format!("{rows}x{vocab} f32"), &got32, &got, 1e-5, 1e-6);
    }
}

#[test]
fn same_inputs_give_the_same_bits() {
    let mut rng = testing::rng("cross_entropy_determinism");
    let (rows, vocab) = (37, 301);
    let logits = testing::uniform(&mut rng, rows * vocab, -10.0, 10.0);
    let targets = random_targets(&mut rng, rows, vocab, IGNORE);
    let run = || {
        let loss = run_loss::<f32, i64>(&logits, &targets, vocab, IGNORE).to_bits();
        let grad: Vec<u64> = run_backward::<f32>(&logits, &targets, vocab, IGNORE, 1.3)
            .iter()
            .map(|g| g.to_bits())
            .collect();
        (loss, grad)
    };
    assert_eq!(run(), run());
}

#[track_caller]
fn assert_operand(err: &Error, operand: &str) {
    let message = err.to_string();
    assert!(message.contains(&format!("`{operand}`")), "{message}");
}

#[test]
fn rejects_targets_out_of_range_before_writing() {
    let logits = [0.5f64; 6];
    let mut loss = [9.0f64];
    for (bad, at) in [([0i64, 3], 1), ([-1, 0], 0)] {
        let err = cross_entropy(
            &view(&logits, &[2, 3]),
            &view(&bad, &[2]),
            IGNORE,
            &mut view_mut(&mut loss, &[]),
        )
        .unwrap_err();
        assert!(
            matches!(err, Error::IndexOutOfRange { at: a, bound: 3, .. } if a == at),
            "{err}"
        );
        assert_operand(&err, "targets");
        let mut grad = [9.0f64; 6];
        let err = cross_entropy_backward(
            &view(&logits, &[2, 3]),
            &view(&bad, &[2]),
            IGNORE,
            &view(&[1.0f64], &[]),
            &mut view_mut(&mut grad, &[2, 3]),
        )
        .unwrap_err();
        assert!(matches!(err, Error::IndexOutOfRange { .. }), "{err}");
        assert_eq!(grad, [9.0; 6], "grad_logits written before the error");
    }
    assert_eq!(loss, [9.0]);
}

#[test]
fn rejects_bad_shapes_and_dtypes() {
    let logits = [0.5f32; 6];
    let targets = [0i64, 1];
    let mut loss = [0f32];
    let forward = |logits_shape: &[usize],
                   targets: &TensorView<'_>,
                   loss_shape: &[usize],
                   loss: &mut [f32]| {
        cross_entropy(
            &view(&logits, logits_shape),
            targets,
            IGNORE,
            &mut view_mut(loss, loss_shape),
        )
        .unwrap_err()
    };
    let t = view(&targets, &[2]);
    let err = forward(&[6], &t, &[], &mut loss);
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "logits",
                ..
            }
        ),
        "{err}"
    );
    let err = forward(&[2, 3], &view(&targets, &[1, 2]), &[], &mut loss);
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "targets",
                ..
            }
        ),
        "{err}"
    );
    let err = forward(&[2, 3], &t, &[1], &mut loss);
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "loss",
                ..
            }
        ),
        "{err}"
    );
    assert_operand(&err, "loss");
    let float_targets = [0f32, 1.0];
    let err = forward(&[2, 3], &view(&float_targets, &[2]), &[], &mut loss);
    assert!(
        matches!(
            err,
            Error::DType {
                operand: "targets",
                ..
            }
        ),
        "{err}"
    );
    let mut loss64 = [0f64];
    let err = cross_entropy(
        &view(&logits, &[2, 3]),
        &t,
        IGNORE,
        &mut view_mut(&mut loss64, &[]),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DType {
                operand: "loss",
                ..
            }
        ),
        "{err}"
    );
    let int_logits = [1i32; 6];
    let err = cross_entropy(
        &view(&int_logits, &[2, 3]),
        &t,
        IGNORE,
        &mut view_mut(&mut loss, &[]),
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
    let logits_t = TensorView::new(&logits[..], [2, 3], &[1, 2], 0).unwrap();
    let err = cross_entropy(&logits_t, &t, IGNORE, &mut view_mut(&mut loss, &[])).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotContiguous {
                operand: "logits",
                ..
            }
        ),
        "{err}"
    );

    let mut grad = [0f32; 6];
    let backward = |grad_loss: &TensorView<'_>, grad_shape: &[usize], grad: &mut [f32]| {
        cross_entropy_backward(
            &view(&logits, &[2, 3]),
            &t,
            IGNORE,
            grad_loss,
            &mut view_mut(grad, grad_shape),
        )
        .unwrap_err()
    };
    let err = backward(&view(&[1f32], &[1]), &[2, 3], &mut grad);
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "grad_loss",
                ..
            }
        ),
        "{err}"
    );
    let err = backward(&view(&[1f32], &[]), &[3, 2], &mut grad);
    assert!(
        matches!(
            err,
            Error::Shape {
                operand: "grad_logits",
                ..
            }
        ),
        "{err}"
    );
    let err = backward(&view(&[1f64], &[]), &[2, 3], &mut grad);
    assert!(
        matches!(
            err,
            Error::DType {
                operand: "grad_loss",
                ..
            }
        ),
        "{err}"
    );
    assert_operand(&err, "grad_loss");
}
