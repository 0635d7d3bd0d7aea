//! The tensor-core split of the cached attention checked without a GPU: the builder's own
//! launch, run by a CPU emulation of `decode_mma.cu` (every lane of the block's warp with the
//! kernel's index math; `mma.sync.m16n8k16` by the PTX ISA's fragment layouts, as
//! `linear_emulation.rs` emulates it; `ldmatrix.trans` by its own), against partials computed
//! in f64 from the same bf16 caches. Shared memory starts as NaN, partials as a NaN sentinel:
//! a fragment read the kernel never staged, or a partial it should write and does not, fails.

use half::bf16;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::linear::emulation::mma;
use super::*;
use crate::gpu::cache::CacheRows;
use crate::testing;

const WARP: usize = 32;
const PAD: usize = 8; // KILN_DECODE_MMA_PAD
const SENTINEL: u32 = 0x7fc0_0001;

/// The operands of one launch, as the device would hold them.
struct Buffers {
    partials: Vec<f32>,
    q: Vec<f32>,
    k: Vec<u16>,
    v: Vec<u16>,
    positions: Vec<i64>,
    rows: Option<Vec<i64>>,
}

fn int(arg: &Arg) -> i64 {
    match arg {
        Arg::I64(v) => *v,
        other => panic!("expected an i64, got {other:?}"),
    }
}

fn bf16_value(bits: u16) -> f32 {
    bf16::from_bits(bits).to_f32()
}

fn round(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

fn pack(low: f32, high: f32) -> u32 {
    u32::from(bf16::from_f32(low).to_bits()) | (u32::from(bf16::from_f32(high).to_bits()) << 16)
}

/// `kiln_decode_mma_terms`: the three words of a pair, into `part[term][e]`.
fn terms(x0: f32, x1: f32, part: &mut [[u32; 4]; 3], e: usize) {
    let (h0, h1) = (round(x0), round(x1));
    let (r0, r1) = (x0 - h0, x1 - h1);
    let (m0, m1) = (round(r0), round(r1));
    part[0][e] = pack(h0, h1);
    part[1][e] = pack(m0, m1);
    part[2][e] = pack(r0 - m0, r1 - m1);
}

/// The mma of each term of every lane's A fragments, added into `acc`.
fn terms_product(acc: &mut [[f32; 4]; WARP], a: &[[[u32; 4]; 3]; WARP], b: &[[u32; 2]; WARP]) {
    for term in 0..3 {
        let words: [[u32; 4]; WARP] = a.map(|lane| lane[term]);
        mma(&words, b, acc);
    }
}

/// `ldmatrix.x4.trans`: lane l supplies the element index of row l % 8 of matrix l / 8 and
/// receives, of each matrix j, elements (row 2(l % 4), col l / 4) and (row 2(l % 4) + 1,
/// col l / 4) as one word.
fn ldmatrix_x4_trans(shared: &[u16], rows: &[usize; WARP]) -> [[u32; 4]; WARP] {
    std::array::from_fn(|l| {
        std::array::from_fn(|j| {
            let low = shared[rows[8 * j + 2 * (l % 4)] + l / 4];
            let high = shared[rows[8 * j + 2 * (l % 4) + 1] + l / 4];
            u32::from(low) | (u32::from(high) << 16)
        })
    })
}

/// Runs the split launch's every block over `buffers`.
fn run_split(kernel: &Kernel, buffers: &mut Buffers) {
    let d = match kernel.function {
        "cached_attention_split_mma_d64" => 64,
        "cached_attention_split_mma_d128" => 128,
        other => panic!("not the tensor-core split: {other}"),
    };
    assert_eq!(kernel.block, (32, 1, 1));
    let [_, _, _, _, _, _, slots, q_heads, kv_heads, q_len, capacity, scale, _] =
        kernel.args.as_slice()
    else {
        panic!("13 arguments")
    };
    let (slots, q_heads, kv_heads, q_len, capacity) = (
        int(slots),
        int(q_heads) as usize,
        int(kv_heads) as usize,
        int(q_len) as usize,
        int(capacity),
    );
    let Arg::F32(scale) = *scale else {
        panic!("scale")
    };
    let (splits, kv_count, row_count) = kernel.grid;
    for row in 0..row_count as usize {
        for kv in 0..kv_count as usize {
            for split in 0..splits as usize {
                block(
                    buffers,
                    (d, splits as usize, split, kv, row),
                    (slots, q_heads, kv_heads, q_len, capacity, scale),
                );
            }
        }
    }
}

fn block(
    buffers: &mut Buffers,
    (d, splits, split, kv, row): (usize, usize, usize, usize, usize),
    (slots, q_heads, kv_heads, q_len, capacity, scale): (i64, usize, usize, usize, i64, f32),
) {
    let c = if d > 64 { 32 } else { 64 };
    let stride = d + PAD;
    let (b, t_row) = (row / q_len, row % q_len);
    let group = q_heads / kv_heads;
    let slot = match &buffers.rows {
        None => b as i64,
        Some(rows) if rows[b] == -1 => -1,
        Some(rows) if rows[b] < 0 || rows[b] >= slots => -2,
        Some(rows) => rows[b],
    };
    let kv_first = ((slot.max(0) as usize * kv_heads + kv) as i64 * capacity) as usize * d;
    let position = buffers.positions[b];
    let visible = if slot < 0 {
        0
    } else {
        (position + t_row as i64 + 1).clamp(0, capacity)
    };
    let first = (split * c) as i64;
    let count = (visible - first).clamp(0, c as i64) as usize;
    // Shared memory: every row the staging writes, the pads never.
    let nan = bf16::NAN.to_bits();
    let (mut ks, mut vs) = (vec![nan; c * stride], vec![nan; c * stride]);
    for r in 0..c {
        for e in 0..d {
            let at = kv_first + (first as usize + r) * d + e;
            ks[r * stride + e] = if r < count { buffers.k[at] } else { 0 };
            vs[r * stride + e] = if r < count { buffers.v[at] } else { 0 };
        }
    }
    let out = (((b * q_heads + kv * group) * q_len + t_row) * splits + split) * (d + 2);
    let out_stride = q_len * splits * (d + 2);
    if count == 0 {
        for h in 0..group {
            for e in 0..d + 2 {
                buffers.partials[out + h * out_stride + e] =
                    if e == 0 { f32::NEG_INFINITY } else { 0.0 };
            }
        }
        return;
    }
    let head_stride = q_len * d;
    let q_rows = ((b * q_heads + kv * group) * q_len + t_row) * d;
    let q_at = |h: usize, e: usize| -> f32 {
        if h < group {
            buffers.q[q_rows + h * head_stride + e]
        } else {
            0.0
        }
    };
    // S = Q·Kᵀ.
    let mut s = vec![[[0.0f32; 4]; WARP]; c / 8];
    for kk in 0..d / 16 {
        let a: [[[u32; 4]; 3]; WARP] = std::array::from_fn(|lane| {
            let (g, t) = (lane / 4, lane % 4);
            let e = 16 * kk + 2 * t;
            let mut part = [[0u32; 4]; 3];
            terms(q_at(g, e), q_at(g, e + 1), &mut part, 0);
            terms(q_at(g + 8, e), q_at(g + 8, e + 1), &mut part, 1);
            terms(q_at(g, e + 8), q_at(g, e + 9), &mut part, 2);
            terms(q_at(g + 8, e + 8), q_at(g + 8, e + 9), &mut part, 3);
            part
        });
        for (j, tile) in s.iter_mut().enumerate() {
            let words: [[u32; 2]; WARP] = std::array::from_fn(|lane| {
                let (g, t) = (lane / 4, lane % 4);
                let at = (8 * j + g) * stride + 16 * kk + 2 * t;
                let word = |i: usize| u32::from(ks[i]) | (u32::from(ks[i + 1]) << 16);
                [word(at), word(at + 8)]
            });
            terms_product(tile, &a, &words);
        }
    }
    // Scale, mask, the quads' max and sum.
    let mut m = [[f32::NEG_INFINITY; 2]; WARP];
    for (lane, m) in m.iter_mut().enumerate() {
        let t = lane % 4;
        for (j, tile) in s.iter_mut().enumerate() {
            for (i, value) in tile[lane].iter_mut().enumerate() {
                let key = 8 * j + 2 * t + (i & 1);
                *value = if key < count {
                    *value * scale
                } else {
                    f32::NEG_INFINITY
                };
                m[i / 2] = m[i / 2].max(*value);
            }
        }
    }
    let quad = |x: [[f32; 2]; WARP], op: fn(f32, f32) -> f32| {
        let x: [[f32; 2]; WARP] = std::array::from_fn(|l| [0, 1].map(|r| op(x[l][r], x[l ^ 1][r])));
        std::array::from_fn::<[f32; 2], WARP, _>(|l| [0, 1].map(|r| op(x[l][r], x[l ^ 2][r])))
    };
    let m = quad(m, f32::max);
    let mut l = [[0.0f32; 2]; WARP];
    for (lane, l) in l.iter_mut().enumerate() {
        for tile in s.iter_mut() {
            for (i, value) in tile[lane].iter_mut().enumerate() {
                *value = (*value - m[lane][i / 2]).exp();
            }
            l[0] += tile[lane][0] + tile[lane][1];
            l[1] += tile[lane][2] + tile[lane][3];
        }
    }
    let l = quad(l, |x, y| x + y);
    // O = P·V.
    let mut o = vec![[[0.0f32; 4]; WARP]; d / 8];
    for kk in 0..c / 16 {
        let a: [[[u32; 4]; 3]; WARP] = std::array::from_fn(|lane| {
            let mut part = [[0u32; 4]; 3];
            let (p0, p1) = (s[2 * kk][lane], s[2 * kk + 1][lane]);
            terms(p0[0], p0[1], &mut part, 0);
            terms(p0[2], p0[3], &mut part, 1);
            terms(p1[0], p1[1], &mut part, 2);
            terms(p1[2], p1[3], &mut part, 3);
            part
        });
        for n in 0..d / 16 {
            let rows: [usize; WARP] = std::array::from_fn(|lane| {
                let row_in = (lane & 7) + ((lane >> 3) & 1) * 8;
                let col_in = (lane >> 4) * 8;
                (16 * kk + row_in) * stride + 16 * n + col_in
            });
            let bs = ldmatrix_x4_trans(&vs, &rows);
            let first: [[u32; 2]; WARP] = std::array::from_fn(|lane| [bs[lane][0], bs[lane][1]]);
            let second: [[u32; 2]; WARP] = std::array::from_fn(|lane| [bs[lane][2], bs[lane][3]]);
            terms_product(&mut o[2 * n], &a, &first);
            terms_product(&mut o[2 * n + 1], &a, &second);
        }
    }
    for lane in 0..WARP {
        let (g, t) = (lane / 4, lane % 4);
        for (half, head) in [g, g + 8].into_iter().enumerate() {
            if head >= group {
                continue;
            }
            let at = out + head * out_stride;
            if t == 0 {
                buffers.partials[at] = m[lane][half];
                buffers.partials[at + 1] = l[lane][half];
            }
            for (n, tile) in o.iter().enumerate() {
                let e = 8 * n + 2 * t;
                buffers.partials[at + 2 + e] = tile[lane][2 * half];
                buffers.partials[at + 3 + e] = tile[lane][2 * half + 1];
            }
        }
    }
}

/// One case: random q, bf16 caches and positions (own rows, or a pool with a padding row);
/// every partial against f64.
fn check(
    rng: &mut StdRng,
    (batch, q_len, q_heads, kv_heads, d, capacity): (u64, u64, u64, u64, u64, u64),
    pooled: bool,
) {
    let dims = AttentionDims {
        batch,
        q_heads,
        kv_heads,
        q_len,
        kv_len: capacity,
        head_dim: d,
    };
    let slots = if pooled { batch + 2 } else { batch };
    let cache_len = (slots * kv_heads * capacity * d) as usize;
    let bits = |rng: &mut StdRng| -> Vec<u16> {
        let values = testing::signed(rng, cache_len);
        values
            .iter()
            .map(|&v| bf16::from_f64(v).to_bits())
            .collect()
    };
    let (k, v) = (bits(rng), bits(rng));
    let q = testing::to_f32(&testing::signed(
        rng,
        (batch * q_heads * q_len * d) as usize,
    ));
    let positions: Vec<i64> = (0..batch)
        .map(|_| rng.random_range(0..=(capacity - q_len) as i64))
        .collect();
    let rows = pooled.then(|| {
        let mut rows: Vec<i64> = (0..batch as i64).map(|b| (b + 2) % slots as i64).collect();
        rows[0] = -1; // a padding row
        rows
    });
    let splits = key_chunk(d).max(1);
    let splits = capacity.div_ceil(splits);
    let addr = |slot| Addr { slot, offset: 0 };
    let cache_rows = match pooled {
        true => CacheRows::Pool {
            rows: addr(5),
            slots,
        },
        false => CacheRows::Own,
    };
    let launches = cached_attention_f32(
        addr(0),
        addr(1),
        [addr(2), addr(3), addr(4), addr(6)],
        cache_rows,
        (dims, 0.125, Stored::BF16),
        addr(7),
        true,
    )
    .unwrap();
    let Launch::Kernel(split) = &launches[0] else {
        panic!("a kernel")
    };
    let partials_len = (batch * q_heads * q_len * splits * (d + 2)) as usize;
    let mut buffers = Buffers {
        partials: vec![f32::from_bits(SENTINEL); partials_len],
        q,
        k,
        v,
        positions,
        rows,
    };
    run_split(split, &mut buffers);
    // The f64 reference of every partial.
    let (d, group, c) = (
        d as usize,
        (q_heads / kv_heads) as usize,
        key_chunk(d) as usize,
    );
    let mut worst = 0.0f64;
    for b in 0..batch as usize {
        let slot = match &buffers.rows {
            None => Some(b),
            Some(rows) => (rows[b] >= 0).then_some(rows[b] as usize),
        };
        for t in 0..q_len as usize {
            for h in 0..q_heads as usize {
                let kv = h / group;
                let q_row =
                    &buffers.q[((b * q_heads as usize + h) * q_len as usize + t) * d..][..d];
                let visible = slot.map_or(0, |_| buffers.positions[b] as usize + t + 1);
                for split in 0..splits as usize {
                    let at = (((b * q_heads as usize + h) * q_len as usize + t) * splits as usize
                        + split)
                        * (d + 2);
                    let got = &buffers.partials[at..at + d + 2];
                    let keys: Vec<usize> = (split * c..((split + 1) * c).min(visible)).collect();
                    if keys.is_empty() {
                        assert_eq!(got[0], f32::NEG_INFINITY, "empty chunk's m");
                        assert!(
                            got[1..].iter().all(|&x| x == 0.0),
                            "empty chunk's l and acc"
                        );
                        continue;
                    }
                    let base = (slot.unwrap() * kv_heads as usize + kv) * capacity as usize * d;
                    let scores: Vec<f64> = keys
                        .iter()
                        .map(|&key| {
                            let k_row = &buffers.k[base + key * d..][..d];
                            let dot: f64 = (0..d)
                                .map(|e| f64::from(q_row[e]) * f64::from(bf16_value(k_row[e])))
                                .sum();
                            dot * 0.125
                        })
                        .collect();
                    let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let p: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                    let l: f64 = p.iter().sum();
                    let mut want = vec![m, l];
                    want.extend((0..d).map(|e| {
                        keys.iter()
                            .zip(&p)
                            .map(|(&key, p)| {
                                p * f64::from(bf16_value(buffers.v[base + key * d + e]))
                            })
                            .sum::<f64>()
                    }));
                    let got: Vec<f64> = got.iter().map(|&x| f64::from(x)).collect();
                    assert!(
                        got.iter().all(|x| x.is_finite()),
                        "unwritten partial at b={b} t={t} h={h} split={split}"
                    );
                    worst = worst.max(testing::rel_l2(&got, &want));
                }
            }
        }
    }
    assert!(worst < 1e-6, "relative error {worst:e}");
}

#[test]
fn tensor_core_split_matches_f64_partials() {
    let mut rng = StdRng::seed_from_u64(11);
    for case in [
        (3, 1, 14, 2, 64, 300),
        (2, 2, 12, 2, 128, 100),
        (2, 1, 16, 1, 64, 130),
        (3, 2, 4, 4, 128, 70),
        (5, 1, 9, 1, 64, 64),
    ] {
        for pooled in [false, true] {
            check(&mut rng, case, pooled);
        }
    }
}
