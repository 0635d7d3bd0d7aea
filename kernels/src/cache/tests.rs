//! Tests of the KV cache kernels: the write against a plain loop, cached attention bit for bit
//! against `attention` and against an independent naive f64 computation.

use super::*;
use crate::attention::attention;
use crate::element::Element;
use crate::testing::{self, assert_close};
use rand::rngs::StdRng;

/// One cached-attention problem: batch, query heads, kv heads, query block, cache rows, head
/// dim, and each batch row's start position.
#[derive(Clone, Debug)]
struct Case {
    b: usize,
    hq: usize,
    hkv: usize,
    t: usize,
    smax: usize,
    d: usize,
    starts: Vec<i64>,
}

fn case(b: usize, hq: usize, hkv: usize, t: usize, smax: usize, d: usize, starts: &[i64]) -> Case {
    assert_eq!(starts.len(), b);
    Case {
        b,
        hq,
        hkv,
        t,
        smax,
        d,
        starts: starts.to_vec(),
    }
}

/// MHA, GQA and MQA; prefill (start 0), decode (T = 1), a full cache, rows at different
/// positions, odd sizes, an empty block and D = 0.
fn cases() -> Vec<Case> {
    vec![
        case(2, 3, 3, 4, 9, 5, &[0, 5]),
        case(2, 6, 2, 1, 11, 3, &[10, 0]),
        case(1, 4, 1, 3, 3, 8, &[0]),
        case(3, 4, 2, 2, 13, 12, &[7, 11, 3]),
        case(1, 2, 2, 1, 1, 1, &[0]),
        case(2, 4, 2, 0, 6, 5, &[6, 2]),
        case(1, 2, 1, 3, 5, 0, &[1]),
    ]
}

fn rounded<T: Real>(values: &[f64]) -> Vec<T> {
    values.iter().map(|&x| T::of(x)).collect()
}

fn widen<T: Real>(values: &[T]) -> Vec<f64> {
    values.iter().map(|&x| Element::to_f64(x)).collect()
}

/// Random q and caches (±2, for uneven softmax rows), already rounded to `T`.
fn inputs<T: Real>(rng: &mut StdRng, c: &Case) -> (Vec<T>, Vec<T>, Vec<T>) {
    let mut draw = |len| rounded::<T>(&testing::uniform(rng, len, -2.0, 2.0));
    (
        draw(c.b * c.hq * c.t * c.d),
        draw(c.b * c.hkv * c.smax * c.d),
        draw(c.b * c.hkv * c.smax * c.d),
    )
}

/// Runs `cached_attention` in `T`; returns (out, probs). Outputs start as garbage.
fn run_cached<T: Real>(c: &Case, q: &[T], k: &[T], v: &[T], scale: f64) -> (Vec<T>, Vec<T>) {
    let mut probs = vec![T::of(7.0); c.b * c.hq * c.t * c.smax];
    let mut out = vec![T::of(7.0); c.b * c.t * c.hq * c.d];
    let cache_shape = [c.b, c.hkv, c.smax, c.d];
    cached_attention(
        &TensorView::contiguous(q, [c.b, c.hq, c.t, c.d]).unwrap(),
        &TensorView::contiguous(k, cache_shape).unwrap(),
        &TensorView::contiguous(v, cache_shape).unwrap(),
        (&TensorView::contiguous(&c.starts, [c.b]).unwrap(), None),
        scale,
        &mut TensorViewMut::contiguous(&mut probs, [c.b, c.hq, c.t, c.smax]).unwrap(),
        &mut TensorViewMut::contiguous(&mut out, [c.b, c.t, c.hq, c.d]).unwrap(),
    )
    .unwrap();
    (out, probs)
}

/// Batch row `b` of a `[B, rows, per_row]` layout.
fn batch_row<T: Copy>(data: &[T], b: usize, len: usize) -> &[T] {
    &data[b * len..(b + 1) * len]
}

/// For every batch row `b`, cached attention must equal `attention` run on that row alone with
/// the `S = start + T` valid cache rows as `k` and `v`: the same bits for `out`, and for
/// `probs` in the first `S` columns (the rest exactly 0).
fn check_matches_attention<T: Real>(name: &str) {
    let mut rng = testing::rng(name);
    for c in cases() {
        let (q, k, v) = inputs::<T>(&mut rng, &c);
        let scale = 1.0 / (c.d.max(1) as f64).sqrt();
        let (out, probs) = run_cached(&c, &q, &k, &v, scale);
        for (b, &start) in c.starts.iter().enumerate() {
            let s = start as usize + c.t;
            // The first s rows of each head of this batch row: k[b, :, :s, :].
            let take = |cache: &[T]| -> Vec<T> {
                (0..c.hkv)
                    .flat_map(|h| {
                        let first = ((b * c.hkv + h) * c.smax) * c.d;
                        cache[first..first + s * c.d].to_vec()
                    })
                    .collect()
            };
            let (k_s, v_s) = (take(&k), take(&v));
            let mut want_probs = vec![T::of(5.0); c.hq * c.t * s];
            let mut want_out = vec![T::of(5.0); c.t * c.hq * c.d];
            attention(
                &TensorView::contiguous(batch_row(&q, b, c.hq * c.t * c.d), [1, c.hq, c.t, c.d])
                    .unwrap(),
                &TensorView::contiguous(&k_s, [1, c.hkv, s, c.d]).unwrap(),
                &TensorView::contiguous(&v_s, [1, c.hkv, s, c.d]).unwrap(),
                scale,
                &mut TensorViewMut::contiguous(&mut want_probs, [1, c.hq, c.t, s]).unwrap(),
                &mut TensorViewMut::contiguous(&mut want_out, [1, c.t, c.hq, c.d]).unwrap(),
            )
            .unwrap();
            let bits = |x: &[T]| widen(x).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let got_out = batch_row(&out, b, c.t * c.hq * c.d);
            assert_eq!(bits(got_out), bits(&want_out), "{c:?}: out of row {b}");
            for (row, want_row) in want_probs.chunks_exact(s.max(1)).enumerate() {
                let got_row = &probs[(b * c.hq * c.t + row) * c.smax..][..c.smax];
                assert_eq!(
                    bits(&got_row[..s]),
                    bits(want_row),
                    "{c:?}: probs row {row}"
                );
                assert!(
                    got_row[s..].iter().all(|&p| p == T::zero()),
                    "{c:?}: masked"
                );
            }
        }
    }
}

#[test]
fn cached_attention_is_attention_bit_for_bit_f32() {
    check_matches_attention::<f32>("cached_attention_is_attention_bit_for_bit_f32");
}

#[test]
fn cached_attention_is_attention_bit_for_bit_f64() {
    check_matches_attention::<f64>("cached_attention_is_attention_bit_for_bit_f64");
}

/// Cached attention written plainly in f64: repeat_kv, scores over every cache row with −∞
/// past the query's position, softmax, `P·V`, BTHD output.
fn naive_cached(c: &Case, q: &[f64], k: &[f64], v: &[f64], scale: f64) -> Vec<f64> {
    let group = c.hq / c.hkv;
    let mut out = vec![0.0; c.b * c.t * c.hq * c.d];
    for b in 0..c.b {
        for h in 0..c.hq {
            let kv = |cache: &[f64], s: usize, j: usize| {
                cache[((b * c.hkv + h / group) * c.smax + s) * c.d + j]
            };
            for t in 0..c.t {
                let position = c.starts[b] as usize + t;
                let scores: Vec<f64> = (0..c.smax)
                    .map(|s| {
                        if s > position {
                            return f64::NEG_INFINITY;
                        }
                        let qk: f64 = (0..c.d)
                            .map(|j| q[((b * c.hq + h) * c.t + t) * c.d + j] * kv(k, s, j))
                            .sum();
                        qk * scale
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|x| (x - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for (s, e) in exps.iter().enumerate() {
                    for j in 0..c.d {
                        out[((b * c.t + t) * c.hq + h) * c.d + j] += e / total * kv(v, s, j);
                    }
                }
            }
        }
    }
    out
}

fn check_against_naive<T: Real>(name: &str, tol: f64) {
    let mut rng = testing::rng(name);
    for c in cases() {
        let (q, k, v) = inputs::<T>(&mut rng, &c);
        let scale = 0.37;
        let (out, _) = run_cached(&c, &q, &k, &v, scale);
        let want = naive_cached(&c, &widen(&q), &widen(&k), &widen(&v), scale);
        assert_close(&format!("{c:?}"), &widen(&out), &want, tol, tol);
        // Same inputs, same bits.
        let (again, _) = run_cached(&c, &q, &k, &v, scale);
        assert_eq!(widen(&again), widen(&out), "{c:?}: not deterministic");
    }
}

#[test]
fn cached_attention_matches_naive_f32() {
    check_against_naive::<f32>("cached_attention_matches_naive_f32", 1e-5);
}

#[test]
fn cached_attention_matches_naive_f64() {
    check_against_naive::<f64>("cached_attention_matches_naive_f64", 1e-12);
}

/// Runs `kv_cache_write` in `T` with positions of integer type `I`.
fn run_write<T: Real, I: Element>(
    cache: &[T],
    new: &[T],
    starts: &[I],
    cache_shape: [usize; 4],
    new_shape: [usize; 4],
) -> Vec<T> {
    let mut cache = cache.to_vec();
    kv_cache_write(
        &mut TensorViewMut::contiguous(&mut cache, cache_shape).unwrap(),
        &TensorView::contiguous(new, new_shape).unwrap(),
        &TensorView::contiguous(starts, [starts.len()]).unwrap(),
        None,
    )
    .unwrap();
    cache
}

fn check_write<T: Real>(name: &str) {
    let mut rng = testing::rng(name);
    for c in cases() {
        let [b, h, t, smax, d] = [c.b, c.hkv, c.t, c.smax, c.d];
        let cache = rounded::<T>(&testing::signed(&mut rng, b * h * smax * d));
        let new = rounded::<T>(&testing::signed(&mut rng, b * h * t * d));
        let mut want = cache.clone();
        for bi in 0..b {
            for hi in 0..h {
                for ti in 0..t {
                    for j in 0..d {
                        let row = c.starts[bi] as usize + ti;
                        want[((bi * h + hi) * smax + row) * d + j] =
                            new[((bi * h + hi) * t + ti) * d + j];
                    }
                }
            }
        }
        let shapes = ([b, h, smax, d], [b, h, t, d]);
        let got = run_write(&cache, &new, &c.starts, shapes.0, shapes.1);
        assert_eq!(widen(&got), widen(&want), "{c:?}: i64 positions");
        let starts32: Vec<i32> = c.starts.iter().map(|&p| p as i32).collect();
        let got = run_write(&cache, &new, &starts32, shapes.0, shapes.1);
        assert_eq!(widen(&got), widen(&want), "{c:?}: i32 positions");
    }
}

#[test]
fn kv_cache_write_replaces_only_the_block_f32() {
    check_write::<f32>("kv_cache_write_replaces_only_the_block_f32");
}

#[test]
fn kv_cache_write_replaces_only_the_block_f64() {
    check_write::<f64>("kv_cache_write_replaces_only_the_block_f64");
}
