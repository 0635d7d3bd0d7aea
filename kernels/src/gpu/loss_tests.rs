//! The chunked LM-head loss's launches, and those of the loss with its gradient in one, run on a
//! CPU model (the GEMM as [`Gemm`] defines it, the row kernels of loss.cu, the cast and the
//! zero fill re-stated) against the CPU reference:
//! every GEMM descriptor, chunk offset and workspace region is checked without a GPU; the GPU
//! test (tests/gpu.rs) checks the kernels themselves.

use super::*;
use crate::loss::chunked;
use crate::testing::{self, assert_close};
use crate::view::{TensorView, TensorViewMut};
use half::bf16;

const IGNORE: i64 = -100;
// Slots of the model's memory.
const X: usize = 0;
const W: usize = 1;
const TARGETS: usize = 2;
const LOSS: usize = 3;
const LSE: usize = 4;
const WORK: usize = 5;
const FAULT: usize = 6;
const GRAD_LOSS: usize = 7;
const GRAD_X: usize = 8;
const GRAD_W: usize = 9;

/// The operands and results of both passes, and of both in one, one slot each.
const FORWARD: LinearLossForward = LinearLossForward {
    x: addr(X),
    weight: addr(W),
    targets: addr(TARGETS),
    loss: addr(LOSS),
    lse: addr(LSE),
};
const BACKWARD: LinearLossBackward = LinearLossBackward {
    x: addr(X),
    weight: addr(W),
    targets: addr(TARGETS),
    lse: addr(LSE),
    grad_loss: addr(GRAD_LOSS),
    grad_x: addr(GRAD_X),
    grad_weight: addr(GRAD_W),
};
const FUSED: LinearLossGrad = LinearLossGrad {
    x: addr(X),
    weight: addr(W),
    targets: addr(TARGETS),
    grad_loss: addr(GRAD_LOSS),
    loss: addr(LOSS),
    grad_x: addr(GRAD_X),
    grad_weight: addr(GRAD_W),
};

/// Device memory as bytes, one vector per slot, every byte poisoned first.
struct Memory(Vec<Vec<u8>>);

impl Memory {
    fn bytes(&mut self, at: Addr, element: u64, size: u64) -> &mut [u8] {
        let start = (at.offset + element * size) as usize;
        &mut self.0[at.slot as usize][start..start + size as usize]
    }

    fn f32(&mut self, at: Addr, element: u64) -> f32 {
        f32::from_le_bytes(self.bytes(at, element, 4).try_into().unwrap())
    }

    fn set_f32(&mut self, at: Addr, element: u64, value: f32) {
        self.bytes(at, element, 4)
            .copy_from_slice(&value.to_le_bytes());
    }

    fn i64(&mut self, at: Addr, element: u64) -> i64 {
        i64::from_le_bytes(self.bytes(at, element, 8).try_into().unwrap())
    }

    fn operand(&mut self, dtype: GemmDType, at: Addr, element: u64) -> f32 {
        match dtype {
            GemmDType::F32 => self.f32(at, element),
            GemmDType::BF16 => {
                bf16::from_le_bytes(self.bytes(at, element, 2).try_into().unwrap()).to_f32()
            }
        }
    }

    fn set_operand(&mut self, dtype: GemmDType, at: Addr, element: u64, value: f32) {
        match dtype {
            GemmDType::F32 => self.set_f32(at, element, value),
            GemmDType::BF16 => {
                let bits = bf16::from_f32(value).to_le_bytes();
                self.bytes(at, element, 2).copy_from_slice(&bits);
            }
        }
    }

    fn gemm(&mut self, g: &Gemm) {
        assert_eq!(g.batch, 1);
        for i in 0..g.m {
            for j in 0..g.n {
                let mut sum = 0.0f32;
                for l in 0..g.k {
                    let a = if g.transpose_a {
                        l * g.lda + i
                    } else {
                        i * g.lda + l
                    };
                    let b = if g.transpose_b {
                        j * g.ldb + l
                    } else {
                        l * g.ldb + j
                    };
                    sum += self.operand(g.dtype, g.a, a) * self.operand(g.dtype, g.b, b);
                }
                let c = i * g.ldc + j;
                let prior = match g.accumulate {
                    true => self.operand(g.out, g.c, c),
                    false => 0.0,
                };
                // A bf16 D is the f32 sum rounded as it is written.
                self.set_operand(g.out, g.c, c, sum + prior);
            }
        }
    }

    fn kernel(&mut self, k: &Kernel) {
        let ptr = |i: usize| match k.args[i] {
            Arg::Ptr(at) => at,
            ref other => panic!("argument {i} of {}: {other:?}", k.function),
        };
        let int = |i: usize| match k.args[i] {
            Arg::I64(v) => v,
            ref other => panic!("argument {i} of {}: {other:?}", k.function),
        };
        match k.function {
            "chunked_ce_update_f32" => {
                let (stats, logits, targets) = (ptr(0), ptr(1), ptr(2));
                let [rows, width, first] = [int(3), int(4), int(5)].map(|v| v as u64);
                for r in 0..rows {
                    let row: Vec<f32> = (0..width)
                        .map(|j| self.f32(logits, r * width + j))
                        .collect();
                    // NaN-propagating max, as `kiln_max`.
                    let nan_max = |a: f32, b: f32| {
                        if a.is_nan() || b.is_nan() {
                            f32::NAN
                        } else {
                            a.max(b)
                        }
                    };
                    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| nan_max(m, v));
                    let sum: f32 = match max == f32::NEG_INFINITY {
                        true => 0.0,
                        false => row.iter().map(|&v| (v - max).exp()).sum(),
                    };
                    let prior = match first {
                        0 => (f32::NEG_INFINITY, 0.0),
                        _ => (self.f32(stats, r * 3), self.f32(stats, r * 3 + 1)),
                    };
                    let m = nan_max(prior.0, max);
                    let s = if m == f32::NEG_INFINITY {
                        0.0
                    } else {
                        prior.1 * (prior.0 - m).exp() + sum * (max - m).exp()
                    };
                    self.set_f32(stats, r * 3, m);
                    self.set_f32(stats, r * 3 + 1, s);
                    let column = self.i64(targets, r) - first as i64;
                    if (0..width as i64).contains(&column) {
                        self.set_f32(stats, r * 3 + 2, row[column as usize]);
                    }
                }
            }
            "chunked_ce_finish_f32" => {
                let (row_loss, lse, stats, targets, fault) =
                    (ptr(0), ptr(1), ptr(2), ptr(3), ptr(7));
                let (rows, vocab, ignore) = (int(4) as u64, int(5), int(6));
                for r in 0..rows {
                    let (max, log_sum) = match vocab {
                        0 => (f32::NEG_INFINITY, 0f32.ln()),
                        _ => (self.f32(stats, r * 3), self.f32(stats, r * 3 + 1).ln()),
                    };
                    self.set_f32(lse, r, max + log_sum);
                    let t = self.i64(targets, r);
                    let value = if t == ignore {
                        0.0
                    } else if (0..vocab).contains(&t) {
                        log_sum - (self.f32(stats, r * 3 + 2) - max)
                    } else {
                        self.bytes(fault, 0, 4).copy_from_slice(&1i32.to_le_bytes());
                        f32::NAN
                    };
                    self.set_f32(row_loss, r, value);
                }
            }
            "cross_entropy_mean_f32" => {
                let (loss, row_loss, targets) = (ptr(0), ptr(1), ptr(2));
                let (rows, ignore) = (int(3) as u64, int(4));
                let (mut total, mut counted) = (0.0f32, 0.0f32);
                for r in 0..rows {
                    if self.i64(targets, r) != ignore {
                        total += self.f32(row_loss, r);
                        counted += 1.0;
                    }
                }
                self.set_f32(loss, 0, total / counted);
            }
            "chunked_ce_scale_f32" => {
                let (scale, targets, grad_loss) = (ptr(0), ptr(1), ptr(2));
                let (rows, ignore) = (int(3) as u64, int(4));
                let counted = (0..rows)
                    .filter(|&r| self.i64(targets, r) != ignore)
                    .count();
                let value = self.f32(grad_loss, 0) / counted as f32;
                self.set_f32(scale, 0, value);
            }
            "chunked_ce_grad_f32" | "chunked_ce_grad_bf16" => {
                let dtype = match k.function.ends_with("bf16") {
                    true => GemmDType::BF16,
                    false => GemmDType::F32,
                };
                let (grad, logits, targets, lse, scale) = (ptr(0), ptr(1), ptr(2), ptr(3), ptr(4));
                let [rows, width, first, vocab] =
                    [int(5), int(6), int(7), int(8)].map(|v| v as u64);
                let ignore = int(9);
                for r in 0..rows {
                    let t = self.i64(targets, r);
                    for j in 0..width {
                        let at = r * width + j;
                        let value = if t == ignore {
                            0.0
                        } else if !(0..vocab as i64).contains(&t) {
                            f32::NAN
                        } else {
                            let one_hot = f32::from(u8::from(first + j == t as u64));
                            ((self.f32(logits, at) - self.f32(lse, r)).exp() - one_hot)
                                * self.f32(scale, 0)
                        };
                        self.set_operand(dtype, grad, at, value);
                    }
                }
            }
            "fused_ce_rows_f32" | "fused_ce_rows_bf16" => {
                let dtype = match k.function.ends_with("bf16") {
                    true => GemmDType::BF16,
                    false => GemmDType::F32,
                };
                let (logits, row_loss, targets, scale, fault) =
                    (ptr(0), ptr(1), ptr(2), ptr(3), ptr(7));
                let [rows, vocab] = [int(4), int(5)].map(|v| v as u64);
                let ignore = int(6);
                // The gradient's row r starts where the logits' row r does.
                let ld = vocab * 4 / dtype.size_bytes();
                for r in 0..rows {
                    let row: Vec<f32> = (0..vocab)
                        .map(|j| self.f32(logits, r * vocab + j))
                        .collect();
                    let t = self.i64(targets, r);
                    let fill = match t == ignore || !(0..vocab as i64).contains(&t) {
                        true if t == ignore => Some(0.0),
                        true => {
                            self.bytes(fault, 0, 4).copy_from_slice(&1i32.to_le_bytes());
                            Some(f32::NAN)
                        }
                        false => None,
                    };
                    if let Some(fill) = fill {
                        self.set_f32(row_loss, r, fill);
                        for j in 0..vocab {
                            self.set_operand(dtype, logits, r * ld + j, fill);
                        }
                        continue;
                    }
                    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                    let log_sum = row.iter().map(|&v| (v - max).exp()).sum::<f32>().ln();
                    let lse = max + log_sum;
                    self.set_f32(row_loss, r, log_sum - (row[t as usize] - max));
                    for (j, &v) in row.iter().enumerate() {
                        let one_hot = f32::from(u8::from(j as i64 == t));
                        let value = ((v - lse).exp() - one_hot) * self.f32(scale, 0);
                        self.set_operand(dtype, logits, r * ld + j as u64, value);
                    }
                }
            }
            "cast_f32_to_bf16" | "cast_f32_to_bf16_vec4" => {
                let per_item = if k.function.ends_with("vec4") { 4 } else { 1 };
                let (dst, src, n) = (ptr(0), ptr(1), int(2) as u64 * per_item);
                for i in 0..n {
                    let value = self.f32(src, i);
                    self.set_operand(GemmDType::BF16, dst, i, value);
                }
            }
            "zero_f32" | "zero_bf16" => {
                let dtype = match k.function.ends_with("bf16") {
                    true => GemmDType::BF16,
                    false => GemmDType::F32,
                };
                let (out, n) = (ptr(0), int(1) as u64);
                for i in 0..n {
                    self.set_operand(dtype, out, i, 0.0);
                }
            }
            other => panic!("no model of `{other}`"),
        }
    }

    fn run(&mut self, launches: &[Launch]) {
        for launch in launches {
            match launch {
                Launch::Gemm(g) => self.gemm(g),
                Launch::Kernel(k) => self.kernel(k),
                Launch::Copy { .. } | Launch::AllReduce { .. } => {
                    panic!("no copies or collectives expected: {launch:?}")
                }
            }
        }
    }
}

const fn addr(slot: usize) -> Addr {
    Addr {
        slot: slot as u32,
        offset: 0,
    }
}

fn bytes_of(values: &[f32], dtype: GemmDType) -> Vec<u8> {
    match dtype {
        GemmDType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GemmDType::BF16 => values
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect(),
    }
}

fn values_of(bytes: &[u8], dtype: GemmDType) -> Vec<f64> {
    match dtype {
        GemmDType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes(b.try_into().unwrap())))
            .collect(),
        GemmDType::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes(b.try_into().unwrap()).to_f64())
            .collect(),
    }
}

/// Random operands of `sizes` (the row at `ignored` ignored where there are several rows) in
/// the model's memory, every result and the workspace (`workspace` bytes) poisoned.
struct Case {
    dtype: GemmDType,
    sizes: [usize; 3],
    x: Vec<f32>,
    w: Vec<f32>,
    targets: Vec<i64>,
    memory: Memory,
}

impl Case {
    fn new(
        seed: &str,
        dtype: GemmDType,
        sizes: [usize; 3],
        ignored: usize,
        workspace: u64,
    ) -> Case {
        let [rows, hidden, vocab] = sizes;
        let mut rng = testing::rng(seed);
        let x = testing::to_f32(&testing::uniform(&mut rng, rows * hidden, -1.0, 1.0));
        let w = testing::to_f32(&testing::uniform(&mut rng, vocab * hidden, -1.0, 1.0));
        let mut targets = testing::indices(&mut rng, rows, vocab.max(1));
        if rows > 1 {
            targets[ignored] = IGNORE; // an ignored row among counted ones
        }
        let elem = dtype.size_bytes() as usize;
        let poison = |bytes: usize| vec![0xA5u8; bytes];
        let memory = Memory(vec![
            bytes_of(&x, dtype),
            bytes_of(&w, dtype),
            targets.iter().flat_map(|t| t.to_le_bytes()).collect(),
            poison(4),
            poison(rows * 4),
            poison(workspace as usize),
            vec![0; 4],
            0.5f32.to_le_bytes().to_vec(),
            poison(rows * hidden * elem),
            poison(vocab * hidden * elem),
        ]);
        Case {
            dtype,
            sizes,
            x,
            w,
            targets,
            memory,
        }
    }

    /// The loss (and `lse` where the launches wrote it) and both gradients against the CPU
    /// reference: bf16 gradients within 1e-2 relative for each of `roundings` (the weight
    /// gradient's chunks of the fused loss, rounded each).
    fn check(&mut self, what: &str, lse: bool, [x_roundings, w_roundings]: [f64; 2]) {
        assert_eq!(
            self.memory.0[FAULT],
            vec![0; 4],
            "no target is out of range"
        );
        let dtype = self.dtype;
        let want = reference(dtype, &self.x, &self.w, &self.targets, self.sizes);
        let got = |slot: usize, dtype: GemmDType| values_of(&self.memory.0[slot], dtype);
        let loss = got(LOSS, GemmDType::F32);
        assert_close(&format!("{what} loss"), &loss, &want[0], 1e-5, 0.0);
        if lse {
            let lse = got(LSE, GemmDType::F32);
            assert_close(&format!("{what} lse"), &lse, &want[1], 1e-5, 1e-5);
        }
        for (name, slot, want, roundings) in [
            ("grad_x", GRAD_X, &want[2], x_roundings),
            ("grad_weight", GRAD_W, &want[3], w_roundings),
        ] {
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let rtol = match dtype {
                GemmDType::BF16 => 1e-2 * roundings,
                GemmDType::F32 => 1e-5,
            };
            let got = got(slot, dtype);
            assert_close(&format!("{what} {name}"), &got, want, rtol, rtol * scale);
        }
    }
}

/// The device pipeline (chunks of `columns`) on the model against the CPU reference.
fn check(dtype: GemmDType, sizes: [usize; 3], columns: u64) {
    let mut loss = LinearLoss::new(sizes.map(|d| d as u64), dtype, IGNORE);
    loss.columns = columns;
    let workspace = (loss.forward_workspace_bytes()).max(loss.backward_workspace_bytes());
    let mut case = Case::new("linear_loss_pipeline", dtype, sizes, 0, workspace);
    case.memory
        .run(&loss.forward(&FORWARD, addr(WORK), addr(FAULT)).unwrap());
    case.memory
        .run(&loss.backward(&BACKWARD, addr(WORK), addr(FAULT)).unwrap());
    let [rows, hidden, vocab] = sizes;
    case.check(
        &format!("{dtype:?} {rows}x{hidden}x{vocab} by {columns}"),
        true,
        [1.0, 1.0],
    );
}

/// The fused pipeline (chunks of `chunk_rows` rows) on the model against the CPU reference: the
/// loss, and both gradients within the bf16 rounding of each chunk's share of the weight's.
fn check_fused(dtype: GemmDType, sizes: [usize; 3], chunk_rows: u64) {
    let mut loss = LinearLoss::new(sizes.map(|d| d as u64), dtype, IGNORE);
    loss.chunk_rows = chunk_rows;
    let [rows, hidden, vocab] = sizes;
    let workspace = loss.fused_workspace_bytes();
    let mut case = Case::new("linear_loss_fused", dtype, sizes, rows / 2, workspace);
    case.memory
        .run(&loss.fused(&FUSED, addr(WORK), addr(FAULT)).unwrap());
    let what = format!("fused {dtype:?} {rows}x{hidden}x{vocab} by {chunk_rows} rows");
    let chunks = rows.div_ceil(chunk_rows as usize) as f64;
    case.check(&what, false, [1.0, chunks]);
}

/// The CPU reference's loss, lse, grad_x and grad_weight (its own chunks) on the operands as
/// `dtype` stores them.
fn reference(
    dtype: GemmDType,
    x: &[f32],
    w: &[f32],
    targets: &[i64],
    [rows, hidden, vocab]: [usize; 3],
) -> [Vec<f64>; 4] {
    let stored = |values: &[f32]| values_of(&bytes_of(values, dtype), dtype);
    let (x, w) = (stored(x), stored(w));
    let (mut loss, mut lse) = ([0f32], vec![0f32; rows]);
    let g = [0.5f32];
    let mut run = |x: TensorView<'_>,
                   w: TensorView<'_>,
                   gx: TensorViewMut<'_>,
                   gw: TensorViewMut<'_>| {
        let (mut gx, mut gw) = (gx, gw);
        let t = TensorView::contiguous(targets, [rows]).unwrap();
        let mut loss_v = TensorViewMut::contiguous(&mut loss[..], [0usize; 0]).unwrap();
        let mut lse_v = TensorViewMut::contiguous(lse.as_mut_slice(), [rows]).unwrap();
        chunked::linear_cross_entropy(&x, &w, &t, IGNORE, &mut loss_v, &mut lse_v).unwrap();
        let lse_v = TensorView::contiguous(lse.as_slice(), [rows]).unwrap();
        let g = TensorView::contiguous(&g[..], [0usize; 0]).unwrap();
        chunked::linear_cross_entropy_backward(&x, &w, &t, &lse_v, &g, IGNORE, &mut gx, &mut gw)
            .unwrap();
        (
            f64::from(loss[0]),
            lse.iter().map(|&v| f64::from(v)).collect::<Vec<_>>(),
        )
    };
    let (loss, lse, gx, gw) = match dtype {
        GemmDType::F32 => {
            let to = |v: &[f64]| v.iter().map(|&e| e as f32).collect::<Vec<f32>>();
            let (xs, ws) = (to(&x), to(&w));
            let (mut gx, mut gw) = (vec![0f32; rows * hidden], vec![0f32; vocab * hidden]);
            let (loss, lse) = run(
                TensorView::contiguous(xs.as_slice(), [rows, hidden]).unwrap(),
                TensorView::contiguous(ws.as_slice(), [vocab, hidden]).unwrap(),
                TensorViewMut::contiguous(gx.as_mut_slice(), [rows, hidden]).unwrap(),
                TensorViewMut::contiguous(gw.as_mut_slice(), [vocab, hidden]).unwrap(),
            );
            let wide = |v: Vec<f32>| v.into_iter().map(f64::from).collect::<Vec<f64>>();
            (loss, lse, wide(gx), wide(gw))
        }
        GemmDType::BF16 => {
            let to = |v: &[f64]| v.iter().map(|&e| bf16::from_f64(e)).collect::<Vec<bf16>>();
            let (xs, ws) = (to(&x), to(&w));
            let (mut gx, mut gw) = (
                vec![bf16::ZERO; rows * hidden],
                vec![bf16::ZERO; vocab * hidden],
            );
            let (loss, lse) = run(
                TensorView::contiguous(xs.as_slice(), [rows, hidden]).unwrap(),
                TensorView::contiguous(ws.as_slice(), [vocab, hidden]).unwrap(),
                TensorViewMut::contiguous(gx.as_mut_slice(), [rows, hidden]).unwrap(),
                TensorViewMut::contiguous(gw.as_mut_slice(), [vocab, hidden]).unwrap(),
            );
            let wide = |v: Vec<bf16>| v.into_iter().map(|e| e.to_f64()).collect::<Vec<f64>>();
            (loss, lse, wide(gx), wide(gw))
        }
    };
    [vec![loss], lse, gx, gw]
}

#[test]
fn the_pipeline_on_a_model_of_its_launches_is_the_reference() {
    for dtype in [GemmDType::F32, GemmDType::BF16] {
        check(dtype, [5, 8, 300], 128); // three chunks, the last partial
        check(dtype, [3, 4, 128], 128); // one whole chunk
        check(dtype, [1, 6, 129], 128);
        check(dtype, [4, 3, 40], 40);
    }
}

#[test]
fn the_fused_pipeline_on_a_model_of_its_launches_is_the_reference() {
    for dtype in [GemmDType::F32, GemmDType::BF16] {
        check_fused(dtype, [7, 8, 300], 3); // three chunks, the last partial
        check_fused(dtype, [4, 6, 129], 4); // one chunk, rows of an odd width
        check_fused(dtype, [5, 3, 40], 1);
    }
}

#[test]
fn the_fused_chunks_are_whole_rows_within_the_bound() {
    let loss = LinearLoss::new([2048, 896, 151_936], GemmDType::BF16, IGNORE);
    assert_eq!(loss.chunk_rows, 1024);
    let logits = 1024 * 151_936 * 4;
    assert!(logits <= FUSED_LOGITS_BYTES);
    assert_eq!(loss.fused_workspace_bytes(), logits + 2048 * 4 + 256);
    // 1500 rows: two chunks of 750, not 1104 and 396.
    assert_eq!(fused_chunk_rows(1500, 151_936), 750);
    assert_eq!(fused_chunk_rows(512, 151_936), 512);
    assert_eq!(fused_chunk_rows(3, 0), 3);
    assert_eq!(fused_chunk_rows(0, 10), 1);
}

#[test]
fn workspace_regions_are_one_chunk_and_the_rows_scratch() {
    let loss = LinearLoss::new([2048, 896, 151_936], GemmDType::BF16, IGNORE);
    assert_eq!(loss.columns, 8192);
    let (n, h, c) = (2048u64, 896u64, 8192u64);
    assert_eq!(
        LinearLoss::new([512, 1536, 151_936], GemmDType::BF16, IGNORE).columns,
        10_880
    );
    assert_eq!(loss.forward_workspace_bytes(), n * c * 4 + n * 12 + n * 4);
    assert_eq!(
        loss.backward_workspace_bytes(),
        n * c * 4 + n * c * 2 + n * h * 4 + 256
    );
    let f32_loss = LinearLoss::new([2048, 896, 151_936], GemmDType::F32, IGNORE);
    assert_eq!(f32_loss.backward_workspace_bytes(), n * c * 4 + 256);
    assert!(
        loss.backward_workspace_bytes() < 200 << 20,
        "far below the whole logits (1.16 GiB)"
    );
}

#[test]
fn empty_sizes_launch_only_what_has_elements() {
    for ([rows, hidden, vocab], dtype) in [[0, 4, 300], [3, 0, 300], [3, 4, 0]]
        .into_iter()
        .flat_map(|sizes| [(sizes, GemmDType::F32), (sizes, GemmDType::BF16)])
    {
        let loss = LinearLoss::new([rows, hidden, vocab], dtype, IGNORE);
        let forward = loss.forward(&FORWARD, addr(WORK), addr(FAULT)).unwrap();
        assert!(
            matches!(forward.last(), Some(Launch::Kernel(k)) if k.function == "cross_entropy_mean_f32")
        );
        let fused = loss.fused(&FUSED, addr(WORK), addr(FAULT)).unwrap();
        for launch in &fused {
            if let Launch::Gemm(g) = launch {
                assert!(g.m > 0 && g.n > 0 && g.k > 0, "{launch:?}");
            }
        }
        let backward = loss.backward(&BACKWARD, addr(WORK), addr(FAULT)).unwrap();
        for launch in &backward {
            if let Launch::Gemm(g) = launch {
                assert!(g.m > 0 && g.n > 0 && g.k > 0, "{launch:?}");
            }
        }
        if hidden == 0 {
            assert!(backward.is_empty());
        }
        if rows == 0 {
            // No rows: the weight gradient is an empty sum, zero in its own dtype.
            let elem = dtype.size_bytes() as usize;
            let mut memory = Memory(vec![Vec::new(); GRAD_W + 1]);
            memory.0[WORK] = vec![0xA5; loss.backward_workspace_bytes() as usize];
            memory.0[GRAD_W] = vec![0xA5; (vocab * hidden) as usize * elem];
            memory.run(&backward);
            assert!(memory.0[GRAD_W].iter().all(|&b| b == 0), "{dtype:?}");
        }
    }
}
