//! Tests of `rope`: the forward pass against HF's `q·cos + rotate_half(q)·sin` written out here
//! in f64, and the backward pass (and the caller's bias gradient) against central differences.

use super::*;
use crate::testing::{assert_close, central_difference, dot, indices, rng, signed};
use crate::Element;

fn to<T: Real>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&v| T::of(v)).collect()
}

fn back<T: Element>(values: &[T]) -> Vec<f64> {
    values.iter().map(|v| v.to_f64()).collect()
}

fn round_f32(values: &[f64]) -> Vec<f64> {
    values.iter().map(|&v| v as f32 as f64).collect()
}

/// HF's rotation written out again: `y·cos_full + rotate_half(y)·sin_full`, where
/// `cos_full = cat(cos, cos)` and `rotate_half(y) = cat(−y2, y1)`, with f32 angles.
fn naive_rope(
    [batch, seq, heads, dim]: [usize; 4],
    x: &[f64],
    positions: &[i64],
    bias: Option<&[f64]>,
    theta: f64,
) -> Vec<f64> {
    let half = dim / 2;
    let mut out = vec![0.0; x.len()];
    for b in 0..batch {
        for t in 0..seq {
            let p = positions[b * seq + t];
            let mut cos_full = vec![0.0; dim];
            let mut sin_full = vec![0.0; dim];
            for i in 0..half {
                let inv_freq = 1.0f32 / (theta as f32).powf((2 * i) as f32 / dim as f32);
                let angle = p as f32 * inv_freq;
                cos_full[i] = angle.cos() as f64;
                cos_full[i + half] = angle.cos() as f64;
                sin_full[i] = angle.sin() as f64;
                sin_full[i + half] = angle.sin() as f64;
            }
            for h in 0..heads {
                let y: Vec<f64> = (0..dim)
                    .map(|k| {
                        x[((b * seq + t) * heads + h) * dim + k]
                            + bias.map_or(0.0, |bi| bi[h * dim + k])
                    })
                    .collect();
                let rotated: Vec<f64> = (0..dim)
                    .map(|k| if k < half { -y[k + half] } else { y[k - half] })
                    .collect();
                for k in 0..dim {
                    out[((b * heads + h) * seq + t) * dim + k] =
                        y[k] * cos_full[k] + rotated[k] * sin_full[k];
                }
            }
        }
    }
    out
}

fn position_view<'a>(
    as_i32: &'a [i32],
    as_i64: &'a [i64],
    use_i32: bool,
    dims: &[usize],
) -> TensorView<'a> {
    if use_i32 {
        TensorView::contiguous(as_i32, dims).unwrap()
    } else {
        TensorView::contiguous(as_i64, dims).unwrap()
    }
}

fn run_rope<T: Real>(
    dims: [usize; 4],
    x: &[f64],
    positions: &[i64],
    use_i32: bool,
    bias: Option<&[f64]>,
    theta: f64,
) -> Vec<f64> {
    let [batch, seq, heads, dim] = dims;
    let x = to::<T>(x);
    let bias = bias.map(to::<T>);
    let pos32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    let bias_view = bias
        .as_ref()
        .map(|b| TensorView::contiguous(b, [heads * dim]).unwrap());
    let mut out = vec![T::of(9.0); x.len()];
    rope(
        &TensorView::contiguous(&x, dims).unwrap(),
        &position_view(&pos32, positions, use_i32, &[batch, seq]),
        bias_view.as_ref(),
        theta,
        &mut TensorViewMut::contiguous(&mut out, [batch, heads, seq, dim]).unwrap(),
    )
    .unwrap();
    back(&out)
}

fn run_rope_backward<T: Real>(
    dims: [usize; 4],
    grad_out: &[f64],
    positions: &[i64],
    theta: f64,
) -> Vec<f64> {
    let [batch, seq, heads, dim] = dims;
    let grad_out = to::<T>(grad_out);
    let mut grad_x = vec![T::of(9.0); grad_out.len()];
    rope_backward(
        &TensorView::contiguous(&grad_out, [batch, heads, seq, dim]).unwrap(),
        &TensorView::contiguous(positions, [batch, seq]).unwrap(),
        theta,
        &mut TensorViewMut::contiguous(&mut grad_x, dims).unwrap(),
    )
    .unwrap();
    back(&grad_x)
}

const SHAPES: &[[usize; 4]] = &[
    [2, 3, 4, 6],
    [1, 5, 3, 10],
    [3, 2, 2, 14],
    [1, 1, 1, 2],
    [2, 7, 1, 128],
    [2, 0, 3, 4],
    [2, 3, 0, 4],
    [1, 2, 3, 0],
];

#[test]
fn rope_matches_naive_f64_and_f32() {
    let mut rng = rng("rope_matches_naive_f64_and_f32");
    for (case, &dims) in SHAPES.iter().enumerate() {
        let [batch, seq, heads, dim] = dims;
        let numel = batch * seq * heads * dim;
        let x = signed(&mut rng, numel);
        let bias = signed(&mut rng, heads * dim);
        let positions = indices(&mut rng, batch * seq, 40_000);
        let theta = if case % 2 == 0 { 10_000.0 } else { 1_000_000.0 };
        for (with_bias, use_i32) in [(true, false), (false, true)] {
            let bias = with_bias.then_some(&bias[..]);
            let what = format!("{dims:?} bias {with_bias} i32 {use_i32}");
            let got = run_rope::<f64>(dims, &x, &positions, use_i32, bias, theta);
            let want = naive_rope(dims, &x, &positions, bias, theta);
            assert_close(&format!("f64 {what}"), &got, &want, 1e-12, 1e-14);

            let (x, bias) = (round_f32(&x), bias.map(round_f32));
            let got = run_rope::<f32>(dims, &x, &positions, use_i32, bias.as_deref(), theta);
            let want = naive_rope(dims, &x, &positions, bias.as_deref(), theta);
            assert_close(&format!("f32 {what}"), &got, &want, 1e-5, 1e-6);
        }
    }
}

#[test]
fn f64_path_uses_hf_f32_angles() {
    // x = e_0 in one head of size 2: out = (cos, sin) of the angle, exactly. At a large position
    // the f32 angle's cosine differs from the f64 one, so this pins the f32 computation.
    let position = 100_003i64;
    let out = run_rope::<f64>(
        [1, 1, 1, 2],
        &[1.0, 0.0],
        &[position],
        false,
        None,
        10_000.0,
    );
    let angle = position as f32;
    assert_eq!(out, [angle.cos() as f64, angle.sin() as f64]);
    assert_ne!(out[0], (position as f64).cos());
}

#[test]
fn rope_backward_matches_central_differences() {
    let mut rng = rng("rope_backward_matches_central_differences");
    for &dims in &[[2, 3, 4, 6], [1, 5, 3, 10], [2, 2, 1, 2], [2, 0, 3, 4]] {
        let [batch, seq, heads, dim] = dims;
        let numel = batch * seq * heads * dim;
        let x = signed(&mut rng, numel);
        let bias = signed(&mut rng, heads * dim);
        let positions = indices(&mut rng, batch * seq, 4096);
        let cotangent = signed(&mut rng, numel);
        let theta = 10_000.0;
        let grad_x = run_rope_backward::<f64>(dims, &cotangent, &positions, theta);

        let loss = |x: &[f64], bias: &[f64]| {
            dot(
                &cotangent,
                &run_rope::<f64>(dims, x, &positions, false, Some(bias), theta),
            )
        };
        let want = central_difference(|x| loss(x, &bias), &x, 1e-6);
        assert_close(&format!("grad_x {dims:?}"), &grad_x, &want, 1e-6, 1e-6);

        // The bias gradient is grad_x summed over B and T.
        let mut grad_bias = vec![0.0; heads * dim];
        for (k, g) in grad_x.iter().enumerate() {
            grad_bias[k % (heads * dim)] += g;
        }
        let want = central_difference(|bias| loss(&x, bias), &bias, 1e-6);
        assert_close(
            &format!("grad_bias {dims:?}"),
            &grad_bias,
            &want,
            1e-6,
            1e-6,
        );

        let cotangent = round_f32(&cotangent);
        let want = run_rope_backward::<f64>(dims, &cotangent, &positions, theta);
        let got = run_rope_backward::<f32>(dims, &cotangent, &positions, theta);
        assert_close(&format!("f32 grad_x {dims:?}"), &got, &want, 1e-5, 1e-6);
    }
}
