//! Rejection tests of the KV cache kernels: every error names the operand at fault, and a
//! refused write leaves the cache as it was.

use super::*;

#[track_caller]
fn assert_names(err: &Error, operand: &str) {
    let message = err.to_string();
    assert!(message.contains(&format!("`{operand}`")), "{message}");
}

fn len(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Non-zero, varied data: the cache's content must survive a refused write.
fn data(n: usize) -> Vec<f32> {
    (0..n).map(|i| 0.25 + i as f32 * 0.5).collect()
}

/// Calls `kv_cache_write` on an f32 cache `[2,2,5,3]` with the given `new` and positions;
/// returns the error and checks the cache was left untouched.
fn write_error(new_shape: &[usize], positions: TensorView<'_>) -> Error {
    let cache_shape = [2, 2, 5, 3];
    let before = data(len(&cache_shape));
    let mut cache = before.clone();
    let new = data(len(new_shape));
    let err = kv_cache_write(
        &mut TensorViewMut::contiguous(&mut cache, cache_shape).unwrap(),
        &TensorView::contiguous(&new, new_shape).unwrap(),
        &positions,
        None,
    )
    .unwrap_err();
    assert_eq!(cache, before, "a refused write changed the cache: {err}");
    err
}

#[test]
fn kv_cache_write_rejects_positions_out_of_range() {
    let new = [2, 2, 2, 3];
    // Smax = 5 and T = 2: starts must lie in 0..=3.
    for (starts, at, value) in [([0i64, 4], 1, 4), ([-1, 0], 0, -1), ([9, 1], 0, 9)] {
        let err = write_error(&new, TensorView::contiguous(&starts[..], [2]).unwrap());
        assert!(
            matches!(err, Error::IndexOutOfRange { at: a, value: v, bound: 4, .. } if a == at && v == value),
            "{err}"
        );
        assert_names(&err, "positions");
    }
    let starts = [i32::MIN, 0];
    let err = write_error(&new, TensorView::contiguous(&starts[..], [2]).unwrap());
    assert!(matches!(err, Error::IndexOutOfRange { .. }), "{err}");
}

#[test]
fn kv_cache_write_rejects_bad_operands() {
    let starts = [0i64, 1];
    let positions = || TensorView::contiguous(&starts[..], [2]).unwrap();
    let shape_of = |err: Error, operand: &str| {
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert_names(&err, operand);
    };
    // More new rows than the cache holds; wrong heads; wrong rank.
    shape_of(write_error(&[2, 2, 6, 3], positions()), "new");
    shape_of(write_error(&[2, 1, 2, 3], positions()), "new");
    shape_of(write_error(&[2, 2, 3], positions()), "new");
    // positions of the wrong length, and of a float dtype.
    shape_of(
        write_error(
            &[2, 2, 1, 3],
            TensorView::contiguous(&starts[..1], [1]).unwrap(),
        ),
        "positions",
    );
    let float_starts = [0f32, 1.0];
    let err = write_error(
        &[2, 2, 1, 3],
        TensorView::contiguous(&float_starts[..], [2]).unwrap(),
    );
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(&err, "positions");

    // new of another dtype than the cache.
    let mut cache = data(2 * 2 * 5 * 3);
    let new64 = vec![0.5f64; 2 * 2 * 3];
    let err = kv_cache_write(
        &mut TensorViewMut::contiguous(&mut cache, [2, 2, 5, 3]).unwrap(),
        &TensorView::contiguous(&new64, [2, 2, 1, 3]).unwrap(),
        &positions(),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(&err, "new");

    // A bf16 cache takes bf16 rows (callers round f32 rows first), not f32 ones.
    let mut cache16 = vec![half::bf16::ONE; 2 * 2 * 5 * 3];
    let new32 = vec![0.5f32; 2 * 2 * 3];
    let err = kv_cache_write(
        &mut TensorViewMut::contiguous(&mut cache16, [2, 2, 5, 3]).unwrap(),
        &TensorView::contiguous(&new32, [2, 2, 1, 3]).unwrap(),
        &positions(),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(&err, "new");

    // A strided cache (heads and batch swapped).
    let err = kv_cache_write(
        &mut TensorViewMut::new(&mut cache, [2, 2, 5, 3], &[15, 30, 3, 1], 0).unwrap(),
        &TensorView::contiguous(&data(12), [2, 2, 1, 3]).unwrap(),
        &positions(),
        None,
    )
    .unwrap_err();
    assert!(matches!(err, Error::NotContiguous { .. }), "{err}");
    assert_names(&err, "cache");
}

/// Shapes of one cached attention call.
struct Shapes<'a> {
    q: &'a [usize],
    k: &'a [usize],
    v: &'a [usize],
    probs: &'a [usize],
    out: &'a [usize],
}

/// A valid call: B = 2, Hq = 4, Hkv = 2, T = 2, Smax = 5, D = 3.
const GOOD: Shapes<'static> = Shapes {
    q: &[2, 4, 2, 3],
    k: &[2, 2, 5, 3],
    v: &[2, 2, 5, 3],
    probs: &[2, 4, 2, 5],
    out: &[2, 2, 4, 3],
};

fn attention_error(shapes: Shapes<'_>, positions: &[i64]) -> Error {
    let (q, k, v) = (
        data(len(shapes.q)),
        data(len(shapes.k)),
        data(len(shapes.v)),
    );
    let (mut probs, mut out) = (data(len(shapes.probs)), data(len(shapes.out)));
    cached_attention(
        &TensorView::contiguous(&q, shapes.q).unwrap(),
        &TensorView::contiguous(&k, shapes.k).unwrap(),
        &TensorView::contiguous(&v, shapes.v).unwrap(),
        (
            &TensorView::contiguous(positions, [positions.len()]).unwrap(),
            None,
        ),
        0.5,
        &mut TensorViewMut::contiguous(&mut probs, shapes.probs).unwrap(),
        &mut TensorViewMut::contiguous(&mut out, shapes.out).unwrap(),
    )
    .unwrap_err()
}

#[test]
fn cached_attention_rejects_positions_out_of_range() {
    // Smax = 5 and T = 2: the last query of a row starting at 4 would sit at 5.
    for (starts, at, value) in [([1i64, 4], 1, 4), ([-3, 0], 0, -3)] {
        let err = attention_error(GOOD, &starts);
        assert!(
            matches!(err, Error::IndexOutOfRange { at: a, value: v, bound: 4, .. } if a == at && v == value),
            "{err}"
        );
        assert_names(&err, "positions");
    }
}

#[test]
fn cached_attention_rejects_bad_shapes() {
    let starts = [0i64, 3];
    let shape_of = |shapes: Shapes<'_>, positions: &[i64], operand: &str| {
        let err = attention_error(shapes, positions);
        assert!(matches!(err, Error::Shape { .. }), "{err}");
        assert_names(&err, operand);
    };
    // Hkv = 3 does not divide Hq = 4.
    let k3 = [2, 3, 5, 3];
    shape_of(
        Shapes {
            k: &k3,
            v: &k3,
            ..GOOD
        },
        &starts,
        "k_cache",
    );
    shape_of(
        Shapes {
            k: &[2, 2, 5],
            ..GOOD
        },
        &starts,
        "k_cache",
    );
    shape_of(
        Shapes {
            v: &[2, 2, 4, 3],
            ..GOOD
        },
        &starts,
        "v_cache",
    );
    // Six queries cannot fit five cache rows.
    let q6 = Shapes {
        q: &[2, 4, 6, 3],
        probs: &[2, 4, 6, 5],
        out: &[2, 6, 4, 3],
        ..GOOD
    };
    shape_of(q6, &starts, "q");
    shape_of(
        Shapes {
            probs: &[2, 4, 2, 4],
            ..GOOD
        },
        &starts,
        "probs",
    );
    // out must be BTHD, not BHTD.
    shape_of(
        Shapes {
            out: &[2, 4, 2, 3],
            ..GOOD
        },
        &starts,
        "out",
    );
    shape_of(GOOD, &starts[..1], "positions");
}

#[test]
fn cached_attention_rejects_bad_dtypes() {
    let q = data(2 * 4 * 2 * 3);
    let cache = data(2 * 2 * 5 * 3);
    let cache64 = vec![0.5f64; cache.len()];
    let (mut probs, mut out) = (data(2 * 4 * 2 * 5), data(2 * 2 * 4 * 3));
    let starts = [0i32, 2];
    let err = cached_attention(
        &TensorView::contiguous(&q, GOOD.q).unwrap(),
        &TensorView::contiguous(&cache, GOOD.k).unwrap(),
        &TensorView::contiguous(&cache64, GOOD.v).unwrap(),
        (&TensorView::contiguous(&starts[..], [2]).unwrap(), None),
        0.5,
        &mut TensorViewMut::contiguous(&mut probs, GOOD.probs).unwrap(),
        &mut TensorViewMut::contiguous(&mut out, GOOD.out).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::DType { .. }), "{err}");
    assert_names(&err, "v_cache");

    let q16 = vec![half::bf16::ONE; q.len()];
    let cache16 = vec![half::bf16::ONE; cache.len()];
    let (mut probs16, mut out16) = (
        vec![half::bf16::ZERO; probs.len()],
        vec![half::bf16::ZERO; out.len()],
    );
    let err = cached_attention(
        &TensorView::contiguous(&q16, GOOD.q).unwrap(),
        &TensorView::contiguous(&cache16, GOOD.k).unwrap(),
        &TensorView::contiguous(&cache16, GOOD.v).unwrap(),
        (&TensorView::contiguous(&starts[..], [2]).unwrap(), None),
        0.5,
        &mut TensorViewMut::contiguous(&mut probs16, GOOD.probs).unwrap(),
        &mut TensorViewMut::contiguous(&mut out16, GOOD.out).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::UnsupportedDType { .. }), "{err}");
}
