//! Tests of `norm`: forward passes against a plain f64 computation written here, backward passes
//! against central differences of the forward kernels, and determinism.

use super::*;
use crate::testing::{assert_close, central_difference, dot, rng, signed, uniform};
use crate::Element;

const EPS: f64 = 1e-6;

/// RMSNorm written out plainly in f64, independent of the kernel.
fn naive_rmsnorm(x: &[f64], weight: &[f64], eps: f64) -> Vec<f64> {
    let hidden = weight.len();
    let mut out = vec![0.0; x.len()];
    if hidden == 0 {
        return out;
    }
    for row in 0..x.len() / hidden {
        let start = row * hidden;
        let mut mean_square = 0.0;
        for j in 0..hidden {
            mean_square += x[start + j] * x[start + j];
        }
        mean_square /= hidden as f64;
        let rstd = 1.0 / (mean_square + eps).sqrt();
        for j in 0..hidden {
            out[start + j] = x[start + j] * rstd * weight[j];
        }
    }
    out
}

fn to<T: Real>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&v| T::of(v)).collect()
}

fn back(values: &[impl Element]) -> Vec<f64> {
    values.iter().map(|v| v.to_f64()).collect()
}

/// Values rounded to f32 and back, so an f64 reference sees exactly the f32 kernel's inputs.
fn round_f32(values: &[f64]) -> Vec<f64> {
    values.iter().map(|&v| v as f32 as f64).collect()
}

fn view<'a, T: Element>(data: &'a [T], dims: &[usize]) -> TensorView<'a> {
    TensorView::contiguous(data, dims).unwrap()
}

fn view_mut<'a, T: Element>(data: &'a mut [T], dims: &[usize]) -> TensorViewMut<'a> {
    TensorViewMut::contiguous(data, dims).unwrap()
}

fn run_rmsnorm<T: Real>(dims: &[usize], x: &[f64], weight: &[f64], eps: f64) -> Vec<f64> {
    let (x, weight) = (to::<T>(x), to::<T>(weight));
    let mut out = vec![T::of(9.0); x.len()];
    let w_dims = [weight.len()];
    rmsnorm(
        &view(&x, dims),
        &view(&weight, &w_dims),
        eps,
        &mut view_mut(&mut out, dims),
    )
    .unwrap();
    back(&out)
}

/// Returns (sum, out).
fn run_add_rmsnorm<T: Real>(
    dims: &[usize],
    x: &[f64],
    residual: &[f64],
    weight: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let (x, residual, weight) = (to::<T>(x), to::<T>(residual), to::<T>(weight));
    let mut sum = vec![T::of(9.0); x.len()];
    let mut out = vec![T::of(9.0); x.len()];
    add_rmsnorm(
        &view(&x, dims),
        &view(&residual, dims),
        &view(&weight, &[weight.len()]),
        EPS,
        &mut view_mut(&mut sum, dims),
        &mut view_mut(&mut out, dims),
    )
    .unwrap();
    (back(&sum), back(&out))
}

/// Returns (grad_x, grad_weight); the outputs start as junk to prove they are overwritten.
fn run_backward<T: Real>(
    dims: &[usize],
    x: &[f64],
    weight: &[f64],
    grad_out: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let (x, weight, grad_out) = (to::<T>(x), to::<T>(weight), to::<T>(grad_out));
    let mut grad_x = vec![T::of(9.0); x.len()];
    let mut grad_weight = vec![T::of(9.0); weight.len()];
    let w_dims = [weight.len()];
    rmsnorm_backward(
        &view(&x, dims),
        &view(&weight, &w_dims),
        &view(&grad_out, dims),
        EPS,
        &mut view_mut(&mut grad_x, dims),
        &mut view_mut(&mut grad_weight, &w_dims),
    )
    .unwrap();
    (back(&grad_x), back(&grad_weight))
}

const SHAPES: &[&[usize]] = &[
    &[3, 7],
    &[2, 3, 13],
    &[1, 1],
    &[5, 8],
    &[33],
    &[2, 17, 9],
    &[4, 0],
    &[0, 5],
    &[2, 0, 3],
];

#[test]
fn rmsnorm_matches_naive_f64_and_f32() {
    let mut rng = rng("rmsnorm_matches_naive_f64_and_f32");
    for &dims in SHAPES {
        let numel: usize = dims.iter().product();
        let hidden = *dims.last().unwrap();
        let x = signed(&mut rng, numel);
        let weight = uniform(&mut rng, hidden, 0.5, 1.5);
        let got = run_rmsnorm::<f64>(dims, &x, &weight, EPS);
        let want = naive_rmsnorm(&x, &weight, EPS);
        assert_close(&format!("f64 {dims:?}"), &got, &want, 1e-12, 1e-14);

        let (x, weight) = (round_f32(&x), round_f32(&weight));
        let got = run_rmsnorm::<f32>(dims, &x, &weight, EPS);
        let want = naive_rmsnorm(&x, &weight, EPS as f32 as f64);
        assert_close(&format!("f32 {dims:?}"), &got, &want, 1e-5, 1e-6);
    }
}

#[test]
fn rmsnorm_uses_eps() {
    // A row with a tiny mean square: eps dominates, so a kernel ignoring it would be far off.
    let x = [1e-4, -2e-4, 3e-4];
    let weight = [1.0, 2.0, 0.5];
    let got = run_rmsnorm::<f64>(&[1, 3], &x, &weight, 1e-2);
    assert_close("eps", &got, &naive_rmsnorm(&x, &weight, 1e-2), 1e-12, 0.0);
}

#[test]
fn add_rmsnorm_returns_sum_and_its_norm() {
    let mut rng = rng("add_rmsnorm_returns_sum_and_its_norm");
    for &dims in SHAPES {
        let numel: usize = dims.iter().product();
        let hidden = *dims.last().unwrap();
        let (x, residual) = (signed(&mut rng, numel), signed(&mut rng, numel));
        let weight = uniform(&mut rng, hidden, -1.5, 1.5);
        let want_sum: Vec<f64> = x.iter().zip(&residual).map(|(a, b)| a + b).collect();
        let (sum, out) = run_add_rmsnorm::<f64>(dims, &x, &residual, &weight);
        assert_eq!(sum, want_sum, "f64 sum {dims:?}");
        let want = naive_rmsnorm(&want_sum, &weight, EPS);
        assert_close(&format!("f64 {dims:?}"), &out, &want, 1e-12, 1e-14);

        let (x, residual, weight) = (round_f32(&x), round_f32(&residual), round_f32(&weight));
        let want_sum: Vec<f64> = x
            .iter()
            .zip(&residual)
            .map(|(&a, &b)| (a as f32 + b as f32) as f64)
            .collect();
        let (sum, out) = run_add_rmsnorm::<f32>(dims, &x, &residual, &weight);
        assert_eq!(sum, want_sum, "f32 sum {dims:?}");
        let want = naive_rmsnorm(&want_sum, &weight, EPS as f32 as f64);
        assert_close(&format!("f32 {dims:?}"), &out, &want, 1e-5, 1e-6);
    }
}

const GRAD_SHAPES: &[&[usize]] = &[&[3, 7], &[2, 2, 5], &[1, 9], &[4, 1], &[0, 4], &[3, 0]];

#[test]
fn rmsnorm_backward_matches_central_differences() {
    let mut rng = rng("rmsnorm_backward_matches_central_differences");
    for &dims in GRAD_SHAPES {
        let numel: usize = dims.iter().product();
        let hidden = *dims.last().unwrap();
        let x = signed(&mut rng, numel);
        let weight = uniform(&mut rng, hidden, -1.5, 1.5);
        let cotangent = signed(&mut rng, numel);
        let (grad_x, grad_weight) = run_backward::<f64>(dims, &x, &weight, &cotangent);

        let loss_of_x = |x: &[f64]| dot(&cotangent, &run_rmsnorm::<f64>(dims, x, &weight, EPS));
        let want = central_difference(loss_of_x, &x, 1e-6);
        assert_close(&format!("grad_x {dims:?}"), &grad_x, &want, 1e-6, 1e-6);
        let loss_of_w = |w: &[f64]| dot(&cotangent, &run_rmsnorm::<f64>(dims, &x, w, EPS));
        let want = central_difference(loss_of_w, &weight, 1e-6);
        assert_close(&format!("grad_w {dims:?}"), &grad_weight, &want, 1e-6, 1e-6);
        if numel == 0 {
            assert!(grad_weight.iter().all(|&g| g == 0.0), "{grad_weight:?}");
        }

        // The f32 path computes the same gradients to f32 precision.
        let (x, weight, cotangent) = (round_f32(&x), round_f32(&weight), round_f32(&cotangent));
        let (want_x, want_w) = run_backward::<f64>(dims, &x, &weight, &cotangent);
        let (got_x, got_w) = run_backward::<f32>(dims, &x, &weight, &cotangent);
        assert_close(&format!("f32 grad_x {dims:?}"), &got_x, &want_x, 1e-5, 1e-5);
        assert_close(&format!("f32 grad_w {dims:?}"), &got_w, &want_w, 1e-5, 1e-5);
    }
}

/// Returns (grad_input, grad_weight) of add_rmsnorm at (x, residual).
fn run_add_backward<T: Real>(
    dims: &[usize],
    sum: &[f64],
    weight: &[f64],
    grad_out: &[f64],
    grad_sum: Option<&[f64]>,
) -> (Vec<f64>, Vec<f64>) {
    let (sum, weight, grad_out) = (to::<T>(sum), to::<T>(weight), to::<T>(grad_out));
    let grad_sum = grad_sum.map(to::<T>);
    let grad_sum_view = grad_sum.as_ref().map(|g| view(g, dims));
    let mut grad_input = vec![T::of(9.0); sum.len()];
    let mut grad_weight = vec![T::of(9.0); weight.len()];
    let w_dims = [weight.len()];
    add_rmsnorm_backward(
        &view(&sum, dims),
        &view(&weight, &w_dims),
        &view(&grad_out, dims),
        grad_sum_view.as_ref(),
        EPS,
        &mut view_mut(&mut grad_input, dims),
        &mut view_mut(&mut grad_weight, &w_dims),
    )
    .unwrap();
    (back(&grad_input), back(&grad_weight))
}

#[test]
fn add_rmsnorm_backward_matches_central_differences() {
    let mut rng = rng("add_rmsnorm_backward_matches_central_differences");
    for &dims in GRAD_SHAPES {
        let numel: usize = dims.iter().product();
        let hidden = *dims.last().unwrap();
        let (x, residual) = (signed(&mut rng, numel), signed(&mut rng, numel));
        let weight = uniform(&mut rng, hidden, -1.5, 1.5);
        let (cot_out, cot_sum) = (signed(&mut rng, numel), signed(&mut rng, numel));
        let (sum, _) = run_add_rmsnorm::<f64>(dims, &x, &residual, &weight);

        for with_grad_sum in [true, false] {
            let grad_sum = with_grad_sum.then_some(&cot_sum[..]);
            let loss = |x: &[f64], r: &[f64], w: &[f64]| {
                let (sum, out) = run_add_rmsnorm::<f64>(dims, x, r, w);
                dot(&cot_out, &out)
                    + if with_grad_sum {
                        dot(&cot_sum, &sum)
                    } else {
                        0.0
                    }
            };
            let (grad_input, grad_weight) =
                run_add_backward::<f64>(dims, &sum, &weight, &cot_out, grad_sum);
            let what = format!("{dims:?} grad_sum {with_grad_sum}");
            let want_x = central_difference(|x| loss(x, &residual, &weight), &x, 1e-6);
            assert_close(&format!("grad_x {what}"), &grad_input, &want_x, 1e-6, 1e-6);
            let want_r = central_difference(|r| loss(&x, r, &weight), &residual, 1e-6);
            assert_close(&format!("grad_r {what}"), &grad_input, &want_r, 1e-6, 1e-6);
            let want_w = central_difference(|w| loss(&x, &residual, w), &weight, 1e-6);
            assert_close(&format!("grad_w {what}"), &grad_weight, &want_w, 1e-6, 1e-6);

            let (sum, weight) = (round_f32(&sum), round_f32(&weight));
            let (cot_out, cot_sum) = (round_f32(&cot_out), round_f32(&cot_sum));
            let grad_sum = with_grad_sum.then_some(&cot_sum[..]);
            let (want_i, want_w) = run_add_backward::<f64>(dims, &sum, &weight, &cot_out, grad_sum);
            let (got_i, got_w) = run_add_backward::<f32>(dims, &sum, &weight, &cot_out, grad_sum);
            assert_close(&format!("f32 grad_in {what}"), &got_i, &want_i, 1e-5, 1e-5);
            assert_close(&format!("f32 grad_w {what}"), &got_w, &want_w, 1e-5, 1e-5);
        }
    }
}

#[test]
fn results_are_bitwise_deterministic() {
    let mut rng = rng("results_are_bitwise_deterministic");
    let dims = [61, 67];
    let x = signed(&mut rng, 61 * 67);
    let weight = signed(&mut rng, 67);
    let cotangent = signed(&mut rng, 61 * 67);
    let bits = |v: Vec<f64>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let first = run_backward::<f32>(&dims, &x, &weight, &cotangent);
    let second = run_backward::<f32>(&dims, &x, &weight, &cotangent);
    assert_eq!(bits(first.0), bits(second.0));
    assert_eq!(bits(first.1), bits(second.1));
    let first = run_rmsnorm::<f32>(&dims, &x, &weight, EPS);
    let second = run_rmsnorm::<f32>(&dims, &x, &weight, EPS);
    assert_eq!(bits(first), bits(second));
}
