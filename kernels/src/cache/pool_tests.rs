//! Tests of pooled caches: each batch row reads and writes its slot of a pool, which is what
//! the unpooled kernels do on a cache made of those slots; every other slot is untouched.

use super::*;
use crate::testing;

const HEADS: usize = 2;
const CAPACITY: usize = 6;
const DIM: usize = 3;
const SLOT: usize = HEADS * CAPACITY * DIM;

fn view<'a, T: Element>(values: &'a [T], dims: &[usize]) -> TensorView<'a> {
    TensorView::contiguous(values, dims).unwrap()
}

/// The cache made of `pool`'s slots `rows`, in that order.
fn gather(pool: &[f64], rows: &[i64]) -> Vec<f64> {
    rows.iter()
        .flat_map(|&r| pool[r as usize * SLOT..(r as usize + 1) * SLOT].to_vec())
        .collect()
}

#[test]
fn a_pooled_write_changes_only_its_rows_slots() {
    let mut rng = testing::rng("a_pooled_write_changes_only_its_rows_slots");
    let slots = 5;
    let pool = testing::signed(&mut rng, slots * SLOT);
    let (rows, positions) = ([3i64, 0], [4i64, 1]);
    let new = testing::signed(&mut rng, 2 * HEADS * 2 * DIM);
    let mut got = pool.clone();
    kv_cache_write(
        &mut TensorViewMut::contiguous(&mut got, [slots, HEADS, CAPACITY, DIM]).unwrap(),
        &view(&new, &[2, HEADS, 2, DIM]),
        &view(&positions, &[2]),
        Some(&view(&rows, &[2])),
    )
    .unwrap();
    let mut own = gather(&pool, &rows);
    kv_cache_write(
        &mut TensorViewMut::contiguous(&mut own, [2, HEADS, CAPACITY, DIM]).unwrap(),
        &view(&new, &[2, HEADS, 2, DIM]),
        &view(&positions, &[2]),
        None,
    )
    .unwrap();
    assert_eq!(gather(&got, &rows), own);
    for slot in [1i64, 2, 4] {
        assert_eq!(gather(&got, &[slot]), gather(&pool, &[slot]), "slot {slot}");
    }
}

#[test]
fn pooled_attention_reads_each_rows_slot() {
    let mut rng = testing::rng("pooled_attention_reads_each_rows_slot");
    let (slots, q_heads) = (4, 4);
    let (k, v) = (
        testing::signed(&mut rng, slots * SLOT),
        testing::signed(&mut rng, slots * SLOT),
    );
    let q = testing::signed(&mut rng, 3 * q_heads * DIM);
    let (rows, positions) = ([2i64, 0, 3], [5i64, 0, 2]);
    let run = |k: &[f64], v: &[f64], cache_rows: usize, pooled: bool| {
        let mut probs = vec![7f64; 3 * q_heads * CAPACITY];
        let mut out = vec![7f64; 3 * q_heads * DIM];
        let cache = [cache_rows, HEADS, CAPACITY, DIM];
        let rows = view(&rows, &[3]);
        cached_attention(
            &view(&q, &[3, q_heads, 1, DIM]),
            &view(k, &cache),
            &view(v, &cache),
            (&view(&positions, &[3]), pooled.then_some(&rows)),
            0.5,
            &mut TensorViewMut::contiguous(&mut probs, [3, q_heads, 1, CAPACITY]).unwrap(),
            &mut TensorViewMut::contiguous(&mut out, [3, 1, q_heads, DIM]).unwrap(),
        )
        .unwrap();
        out
    };
    let want = run(&gather(&k, &rows), &gather(&v, &rows), 3, false);
    assert_eq!(run(&k, &v, slots, true), want);
}

#[test]
fn bad_slots_are_refused_and_change_nothing() {
    let mut rng = testing::rng("bad_slots_are_refused_and_change_nothing");
    let pool = testing::signed(&mut rng, 3 * SLOT);
    let new = testing::signed(&mut rng, 2 * HEADS * DIM);
    let write = |rows: &[i64]| {
        let mut cache = pool.clone();
        let err = kv_cache_write(
            &mut TensorViewMut::contiguous(&mut cache, [3, HEADS, CAPACITY, DIM]).unwrap(),
            &view(&new, &[2, HEADS, 1, DIM]),
            &view(&[0i64, 0], &[2]),
            Some(&view(rows, &[rows.len()])),
        )
        .unwrap_err();
        assert_eq!(cache, pool, "{err}");
        err.to_string()
    };
    let err = write(&[0, 3]);
    assert!(err.contains("`rows`") && err.contains("0..3"), "{err}");
    assert!(write(&[-2, 0]).contains("`rows`"));
    let err = write(&[1, 1]);
    assert!(err.contains("rows 0 and 1 both write slot 1"), "{err}");
    assert!(write(&[1]).contains("`rows`"));
}

#[test]
fn padding_rows_read_and_write_no_slot() {
    let mut rng = testing::rng("padding_rows_read_and_write_no_slot");
    let (slots, q_heads) = (3, 2);
    let pool = testing::signed(&mut rng, slots * SLOT);
    let new = testing::signed(&mut rng, 3 * HEADS * DIM);
    let rows = [PADDING_SLOT, 1, PADDING_SLOT];
    let positions = [2i64, 3, 0];
    let mut cache = pool.clone();
    let dims = [slots, HEADS, CAPACITY, DIM];
    kv_cache_write(
        &mut TensorViewMut::contiguous(&mut cache, dims).unwrap(),
        &view(&new, &[3, HEADS, 1, DIM]),
        &view(&positions, &[3]),
        Some(&view(&rows, &[3])),
    )
    .unwrap();
    for slot in [0i64, 2] {
        assert_eq!(
            gather(&cache, &[slot]),
            gather(&pool, &[slot]),
            "slot {slot}"
        );
    }
    assert_ne!(gather(&cache, &[1]), gather(&pool, &[1]));

    let q = testing::signed(&mut rng, 3 * q_heads * DIM);
    let mut probs = vec![7f64; 3 * q_heads * CAPACITY];
    let mut out = vec![7f64; 3 * q_heads * DIM];
    cached_attention(
        &view(&q, &[3, q_heads, 1, DIM]),
        &view(&cache, &dims),
        &view(&cache, &dims),
        (&view(&positions, &[3]), Some(&view(&rows, &[3]))),
        0.5,
        &mut TensorViewMut::contiguous(&mut probs, [3, q_heads, 1, CAPACITY]).unwrap(),
        &mut TensorViewMut::contiguous(&mut out, [3, 1, q_heads, DIM]).unwrap(),
    )
    .unwrap();
    let row = q_heads * DIM;
    assert!(out[..row].iter().chain(&out[2 * row..]).all(|&x| x == 0.0));
    assert!(out[row..2 * row].iter().all(|&x| x != 0.0 && x.is_finite()));
}
