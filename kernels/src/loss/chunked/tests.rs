//! The chunked LM-head loss against the same math in f64 (whole logits), and the chunking's
//! own invariance: any chunk width gives the one-chunk result up to f32 rounding.

use super::*;
use crate::testing::{self, assert_close, rel_l2};
use rand::rngs::StdRng;
use rand::Rng;

const IGNORE: i64 = -100;

struct Case {
    rows: usize,
    hidden: usize,
    vocab: usize,
    x: Vec<f64>,
    w: Vec<f64>,
    targets: Vec<i64>,
    grad_loss: f32,
}

fn case(rng: &mut StdRng, rows: usize, hidden: usize, vocab: usize) -> Case {
    let mut targets = testing::indices(rng, rows, vocab);
    for t in &mut targets {
        if rng.random_range(0..4) == 0 {
            *t = IGNORE;
        }
    }
    targets[0] = (vocab - 1) as i64; // a target in the last, partial chunk
    Case {
        rows,
        hidden,
        vocab,
        x: testing::uniform(rng, rows * hidden, -1.5, 1.5),
        w: testing::uniform(rng, vocab * hidden, -1.5, 1.5),
        targets,
        grad_loss: 0.75,
    }
}

/// The operands in `dtype` (f32 or bf16), as bytes-backed vectors.
enum Stored {
    F32(Vec<f32>),
    Bf16(Vec<bf16>),
}

impl Stored {
    fn of(values: &[f64], dtype: DType) -> Stored {
        match dtype {
            DType::BF16 => Stored::Bf16(values.iter().map(|&v| bf16::from_f64(v)).collect()),
            _ => Stored::F32(values.iter().map(|&v| v as f32).collect()),
        }
    }

    fn view(&self, dims: &[usize]) -> TensorView<'_> {
        match self {
            Stored::F32(v) => TensorView::contiguous(v.as_slice(), dims).unwrap(),
            Stored::Bf16(v) => TensorView::contiguous(v.as_slice(), dims).unwrap(),
        }
    }

    fn view_mut(&mut self, dims: &[usize]) -> TensorViewMut<'_> {
        match self {
            Stored::F32(v) => TensorViewMut::contiguous(v.as_mut_slice(), dims).unwrap(),
            Stored::Bf16(v) => TensorViewMut::contiguous(v.as_mut_slice(), dims).unwrap(),
        }
    }

    fn values(&self) -> Vec<f64> {
        match self {
            Stored::F32(v) => v.iter().map(|&x| f64::from(x)).collect(),
            Stored::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
        }
    }
}

struct Outcome {
    loss: f64,
    lse: Vec<f64>,
    grad_x: Vec<f64>,
    grad_w: Vec<f64>,
}

/// The op pair in `dtype` with chunks of `columns` (the public functions' width when `None`).
fn run(c: &Case, dtype: DType, columns: Option<usize>) -> Result<Outcome> {
    let (x, w) = (Stored::of(&c.x, dtype), Stored::of(&c.w, dtype));
    let (xv, wv) = (x.view(&[c.rows, c.hidden]), w.view(&[c.vocab, c.hidden]));
    let tv = TensorView::contiguous(c.targets.as_slice(), [c.rows])?;
    let (mut loss, mut lse) = ([0f32], vec![0f32; c.rows]);
    let mut loss_v = TensorViewMut::contiguous(&mut loss[..], [0usize; 0])?;
    let mut lse_v = TensorViewMut::contiguous(lse.as_mut_slice(), [c.rows])?;
    match columns {
        Some(n) => forward_in_chunks(&xv, &wv, &tv, IGNORE, (&mut loss_v, &mut lse_v), n)?,
        None => linear_cross_entropy(&xv, &wv, &tv, IGNORE, &mut loss_v, &mut lse_v)?,
    }
    let mut grad_x = Stored::of(&vec![f64::NAN; c.rows * c.hidden], dtype);
    let mut grad_w = Stored::of(&vec![f64::NAN; c.vocab * c.hidden], dtype);
    {
        let lse_v = TensorView::contiguous(lse.as_slice(), [c.rows])?;
        let g = [c.grad_loss];
        let g_v = TensorView::contiguous(&g[..], [0usize; 0])?;
        let mut gx = grad_x.view_mut(&[c.rows, c.hidden]);
        let mut gw = grad_w.view_mut(&[c.vocab, c.hidden]);
        match columns {
            Some(n) => {
                let saved = [&tv, &lse_v, &g_v];
                backward_in_chunks(&xv, &wv, saved, IGNORE, (&mut gx, &mut gw), n)?
            }
            None => linear_cross_entropy_backward(
                &xv, &wv, &tv, &lse_v, &g_v, IGNORE, &mut gx, &mut gw,
            )?,
        }
    }
    Ok(Outcome {
        loss: f64::from(loss[0]),
        lse: lse.iter().map(|&v| f64::from(v)).collect(),
        grad_x: grad_x.values(),
        grad_w: grad_w.values(),
    })
}

/// The contract with whole logits in f64: inputs as `dtype` stores them, dL rounded to
/// `dtype` (bf16) where the GEMMs take it.
fn reference(c: &Case, dtype: DType) -> Outcome {
    let x = Stored::of(&c.x, dtype).values();
    let w = Stored::of(&c.w, dtype).values();
    let (n, h, v) = (c.rows, c.hidden, c.vocab);
    let logits: Vec<f64> = (0..n * v)
        .map(|ij| testing::dot(&x[ij / v * h..][..h], &w[ij % v * h..][..h]))
        .collect();
    let mut lse = vec![0.0; n];
    let (mut total, mut counted) = (0.0, 0.0);
    for i in 0..n {
        let row = &logits[i * v..][..v];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        lse[i] = max + row.iter().map(|l| (l - max).exp()).sum::<f64>().ln();
        if c.targets[i] != IGNORE {
            total += lse[i] - row[c.targets[i] as usize];
            counted += 1.0;
        }
    }
    let scale = f64::from(c.grad_loss) / counted;
    let round = |value: f64| match dtype {
        DType::BF16 => bf16::from_f64(value).to_f64(),
        _ => value,
    };
    let dl: Vec<f64> = (0..n * v)
        .map(|ij| {
            let (i, j) = (ij / v, ij % v);
            match c.targets[i] {
                IGNORE => 0.0,
                t => round(((logits[ij] - lse[i]).exp() - f64::from(t == j as i64)) * scale),
            }
        })
        .collect();
    let mut grad_x = vec![0.0; n * h];
    let mut grad_w = vec![0.0; v * h];
    for i in 0..n {
        for j in 0..v {
            for k in 0..h {
                grad_x[i * h + k] += dl[i * v + j] * w[j * h + k];
                grad_w[j * h + k] += dl[i * v + j] * x[i * h + k];
            }
        }
    }
    Outcome {
        loss: total / counted,
        lse,
        grad_x: grad_x.into_iter().map(round).collect(),
        grad_w: grad_w.into_iter().map(round).collect(),
    }
}

fn max_abs(values: &[f64]) -> f64 {
    values.iter().fold(0.0, |m, v| m.max(v.abs()))
}

#[track_caller]
fn assert_outcome(what: &str, got: &Outcome, want: &Outcome, [rtol, grad_rtol]: [f64; 2]) {
    assert_close(
        &format!("{what} loss"),
        &[got.loss],
        &[want.loss],
        rtol,
        0.0,
    );
    assert_close(&format!("{what} lse"), &got.lse, &want.lse, rtol, rtol);
    for (name, g, w) in [
        ("grad_x", &got.grad_x, &want.grad_x),
        ("grad_w", &got.grad_w, &want.grad_w),
    ] {
        let atol = grad_rtol * max_abs(w);
        assert_close(&format!("{what} {name}"), g, w, grad_rtol, atol);
    }
}

#[test]
fn chunked_f32_equals_whole_logits_within_f32_rounding() {
    let mut rng = testing::rng("chunked_f32_equals_whole_logits");
    for (rows, hidden, vocab) in [(7, 16, 300), (1, 5, 129), (33, 24, 1000)] {
        let c = case(&mut rng, rows, hidden, vocab);
        let want = reference(&c, DType::F32);
        for columns in [128, 256, vocab] {
            let got = run(&c, DType::F32, Some(columns)).unwrap();
            assert_outcome(
                &format!("{rows}x{vocab}/{columns}"),
                &got,
                &want,
                [1e-5, 1e-5],
            );
        }
        let whole = run(&c, DType::F32, None).unwrap();
        assert_outcome("default chunks", &whole, &want, [1e-5, 1e-5]);
    }
}

#[test]
fn chunked_bf16_is_the_rounded_contract() {
    let mut rng = testing::rng("chunked_bf16_is_the_rounded_contract");
    for (rows, hidden, vocab) in [(9, 32, 400), (16, 8, 130)] {
        let c = case(&mut rng, rows, hidden, vocab);
        let want = reference(&c, DType::BF16);
        let one = run(&c, DType::BF16, Some(vocab)).unwrap();
        let chunked = run(&c, DType::BF16, Some(128)).unwrap();
        // Loss and lse see only the inputs' rounding (exact products, f32 sums); the
        // gradients' dL and results are rounded to bf16, where f32 and f64 may round apart.
        assert_outcome("one chunk", &one, &want, [1e-5, 1e-2]);
        assert_outcome("chunks of 128", &chunked, &want, [1e-5, 1e-2]);
        // Against each other: chunking moves f32 sums only.
        let gx = rel_l2(&chunked.grad_x, &one.grad_x);
        assert!(gx < 4e-3, "grad_x chunked vs whole: rel l2 {gx}");
        let gw = rel_l2(&chunked.grad_w, &one.grad_w);
        assert!(gw < 1e-3, "grad_w chunked vs whole: rel l2 {gw}");
    }
}

#[test]
fn no_counted_row_gives_nan_loss_and_zero_gradients() {
    let mut rng = testing::rng("chunked_no_counted_row");
    let mut c = case(&mut rng, 4, 8, 200);
    c.targets = vec![IGNORE; 4];
    let got = run(&c, DType::F32, Some(128)).unwrap();
    assert!(got.loss.is_nan());
    assert!(got.lse.iter().all(|l| l.is_finite()));
    assert!(got.grad_x.iter().chain(&got.grad_w).all(|&g| g == 0.0));
}

#[test]
fn a_nan_or_infinite_logit_makes_its_row_nan_as_on_the_device() {
    let mut rng = testing::rng("chunked_special_values");
    for special in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut c = case(&mut rng, 3, 4, 300);
        c.targets = vec![5, 6, 7];
        c.x[4] = special; // row 1
        let got = run(&c, DType::F32, Some(128)).unwrap();
        assert!(got.lse[1].is_nan(), "{special}: lse {:?}", got.lse);
        assert!(got.lse[0].is_finite() && got.lse[2].is_finite());
        assert!(got.loss.is_nan());
    }
}

#[test]
fn bad_targets_and_dtypes_are_refused() {
    let mut rng = testing::rng("chunked_refusals");
    let mut c = case(&mut rng, 3, 4, 130);
    c.targets[1] = 130;
    let error = run(&c, DType::F32, Some(128)).err().unwrap().to_string();
    assert!(error.contains("targets"), "{error}");
    c.targets[1] = -1;
    assert!(run(&c, DType::F32, None).is_err());

    let x = vec![0.5f32; 6];
    let w = vec![bf16::ONE; 12];
    let t = [0i64, 1];
    let (mut loss, mut lse) = ([0f32], [0f32; 2]);
    let error = linear_cross_entropy(
        &TensorView::contiguous(x.as_slice(), [2, 3]).unwrap(),
        &TensorView::contiguous(w.as_slice(), [4, 3]).unwrap(),
        &TensorView::contiguous(&t[..], [2]).unwrap(),
        IGNORE,
        &mut TensorViewMut::contiguous(&mut loss[..], [0usize; 0]).unwrap(),
        &mut TensorViewMut::contiguous(&mut lse[..], [2]).unwrap(),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("weight"), "{error}");
}

#[test]
fn chunk_columns_fit_the_budget() {
    assert_eq!(chunk_columns(2048, 896, 151_936), 8192);
    assert_eq!(chunk_columns(512, 896, 151_936), 18_688);
    assert_eq!(chunk_columns(512, 1536, 151_936), 10_880);
    assert_eq!(chunk_columns(1, 8, 100), 100);
    assert_eq!(chunk_columns(0, 0, 300), 300);
    assert_eq!(chunk_columns(10_000_000, 896, 151_936), 128);
    for (rows, hidden) in [(1, 1), (3, 5000), (700, 896), (2048, 1536), (5000, 64)] {
        let columns = chunk_columns(rows, hidden, 1 << 20);
        assert_eq!(columns % 128, 0);
        assert!(rows.max(hidden) * columns * 4 <= CHUNK_BYTES);
    }
}
