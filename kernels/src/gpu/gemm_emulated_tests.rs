//! The tiled GEMM checked without a GPU: the builder's own launches, run by the CPU emulation
//! of `gemm.cu` (`gemm_emulation.rs`), against kiln's CPU matmul and, bit for bit, against the
//! kernel's summation order written as a plain loop. Shapes cross the tile edges (m and n not
//! multiples of 64, k not a multiple of 16, k shorter than a chunk), with every transpose,
//! batch > 1 (padded, interleaved, and a B shared by every batch), accumulation and a bf16 C.
//! Operands lie in buffers exactly as long as they span, at offsets that are not 16-byte
//! aligned; every gap holds NaN, so a read of a gap turns sums NaN, and C's gaps must keep
//! their sentinel bits.

use half::bf16;
use rand::rngs::StdRng;

use super::emulation::{run, Memory};
use super::*;
use crate::matmul::{matmul_reference, Transpose};
use crate::testing::{self, assert_close};
use crate::view::{TensorView, TensorViewMut};
use crate::Buffer;

/// How an operand's matrices lie: padded (each its own block, rows 3 elements longer),
/// interleaved (row r of every matrix side by side, as attention heads are), or, for B,
/// shared (one matrix for every batch: stride 0).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Layout {
    Padded,
    Interleaved,
    Shared,
}

/// One operand as stored: matrices of `rows x cols`, rows `ld` apart, matrices `stride`
/// apart, from element `first` of its slot (3: offsets that are not 16-byte aligned).
#[derive(Clone, Copy, Debug)]
struct Stored {
    rows: u64,
    cols: u64,
    ld: u64,
    stride: u64,
    first: u64,
}

impl Stored {
    fn new(rows: u64, cols: u64, batch: u64, layout: Layout) -> Stored {
        let (ld, stride) = match layout {
            Layout::Padded => (cols + 3, rows * (cols + 3) + 5),
            Layout::Interleaved => (batch * cols, cols),
            Layout::Shared => (cols, 0),
        };
        let first = 3;
        Stored {
            rows,
            cols,
            ld,
            stride,
            first,
        }
    }

    /// The element index in its slot of batch `t`'s (r, c).
    fn index(&self, t: u64, r: u64, c: u64) -> usize {
        (self.first + t * self.stride + r * self.ld + c) as usize
    }

    /// Elements of the slot: exactly up to the last element.
    fn len(&self, batch: u64) -> usize {
        self.index(batch - 1, self.rows - 1, self.cols - 1) + 1
    }
}

/// The raw bits of a quiet NaN of `dtype` with `payload`: 0 in the gaps of A and B, 1 in C's
/// gaps and in an overwritten C (a NaN no sum produces: a NaN sum's payload is 0).
fn nan_bits(dtype: GemmDType, payload: u32) -> u32 {
    match dtype {
        GemmDType::F32 => 0x7fc0_0000 | payload,
        GemmDType::BF16 => 0x7fc0 | payload,
    }
}

/// A slot of `len` elements of `dtype`, each of bits `fill`.
fn slot(len: usize, dtype: GemmDType, fill: u32) -> Vec<u8> {
    match dtype {
        GemmDType::F32 => fill.to_le_bytes().repeat(len),
        GemmDType::BF16 => (fill as u16).to_le_bytes().repeat(len),
    }
}

fn at(slot: u32, stored: &Stored, dtype: GemmDType) -> Addr {
    let offset = stored.first * dtype.size_bytes();
    Addr { slot, offset }
}

/// One product to check.
#[derive(Clone, Copy, Debug)]
struct Case {
    m: u64,
    n: u64,
    k: u64,
    batch: u64,
    layout: Layout,
}

const fn case(m: u64, n: u64, k: u64, batch: u64, layout: Layout) -> Case {
    Case {
        m,
        n,
        k,
        batch,
        layout,
    }
}

const CASES: [Case; 7] = [
    case(1, 1, 1, 1, Layout::Padded),
    case(5, 3, 7, 1, Layout::Padded),
    case(65, 70, 17, 1, Layout::Padded),
    case(64, 64, 32, 1, Layout::Padded),
    case(3, 130, 33, 2, Layout::Padded),
    case(70, 9, 40, 3, Layout::Interleaved),
    case(33, 66, 20, 2, Layout::Shared),
];

/// (A and B, C, accumulate): every combination `Gemm` defines.
const MODES: [(GemmDType, GemmDType, bool); 6] = [
    (GemmDType::F32, GemmDType::F32, false),
    (GemmDType::F32, GemmDType::F32, true),
    (GemmDType::BF16, GemmDType::F32, false),
    (GemmDType::BF16, GemmDType::F32, true),
    (GemmDType::BF16, GemmDType::BF16, false),
    (GemmDType::BF16, GemmDType::BF16, true),
];

/// One product in emulated device memory (slots: A, B, C) and the values it holds: A, B and C
/// before the launch, each as f32 (what the kernel reads) in (batch, row, column) order of
/// its stored matrices.
struct Product {
    case: Case,
    transpose: Transpose,
    mode: (GemmDType, GemmDType, bool),
    stored: [Stored; 3],
    memory: Memory,
    values: [Vec<f32>; 3],
}

impl Product {
    fn new(
        rng: &mut StdRng,
        case: Case,
        transpose: Transpose,
        mode: (GemmDType, GemmDType, bool),
    ) -> Product {
        let Case {
            m,
            n,
            k,
            batch,
            layout,
        } = case;
        let (dtype, out, accumulate) = mode;
        let own = match layout {
            Layout::Shared => Layout::Padded, // only B is shared
            other => other,
        };
        let (a_rows, a_cols) = if transpose.a { (k, m) } else { (m, k) };
        let (b_rows, b_cols) = if transpose.b { (n, k) } else { (k, n) };
        let stored = [
            Stored::new(a_rows, a_cols, batch, own),
            Stored::new(b_rows, b_cols, batch, layout),
            Stored::new(m, n, batch, own),
        ];
        let dtypes = [dtype, dtype, out];
        let fills = [nan_bits(dtype, 0), nan_bits(dtype, 0), nan_bits(out, 1)];
        let mut product = Product {
            case,
            transpose,
            mode,
            stored,
            memory: Memory(
                (0..3)
                    .map(|s| slot(stored[s].len(batch), dtypes[s], fills[s]))
                    .collect(),
            ),
            values: Default::default(),
        };
        // C is read only when accumulating; otherwise it holds NaN.
        let filled = if accumulate { 3 } else { 2 };
        for (operand, stored) in stored.iter().enumerate().take(filled) {
            let count = (product.batches(operand) * stored.rows * stored.cols) as usize;
            let values = testing::to_f32(&testing::signed(rng, count));
            product.values[operand] = vec![f32::NAN; count];
            for (i, value) in values.into_iter().enumerate() {
                product.set(operand, i, value);
            }
        }
        product
    }

    /// Matrices of an operand: one for a shared B.
    fn batches(&self, operand: usize) -> u64 {
        match (operand, self.case.layout) {
            (1, Layout::Shared) => 1,
            _ => self.case.batch,
        }
    }

    fn dtype(&self, operand: usize) -> GemmDType {
        if operand == 2 {
            self.mode.1
        } else {
            self.mode.0
        }
    }

    /// Sets element `i` (in (batch, row, column) order) of `operand` to `value`, rounded to
    /// the operand's dtype.
    fn set(&mut self, operand: usize, i: usize, value: f32) {
        let (stored, dtype) = (self.stored[operand], self.dtype(operand));
        let value = match dtype {
            GemmDType::F32 => value,
            GemmDType::BF16 => bf16::from_f32(value).to_f32(),
        };
        let (rows, cols) = (stored.rows as usize, stored.cols as usize);
        let (t, r, c) = (i / (rows * cols), i / cols % rows, i % cols);
        self.values[operand][i] = value;
        let index = stored.index(t as u64, r as u64, c as u64) as i64 - stored.first as i64;
        self.memory
            .store(at(operand as u32, &stored, dtype), index, dtype, value);
    }

    fn gemm(&self) -> Gemm {
        let Case { m, n, k, batch, .. } = self.case;
        let (dtype, out, accumulate) = self.mode;
        let [a, b, c] = self.stored;
        Gemm {
            dtype,
            out,
            a: at(0, &a, dtype),
            b: at(1, &b, dtype),
            c: at(2, &c, out),
            m,
            n,
            k,
            batch,
            transpose_a: self.transpose.a,
            transpose_b: self.transpose.b,
            lda: a.ld,
            ldb: b.ld,
            ldc: c.ld,
            stride_a: a.stride,
            stride_b: b.stride,
            stride_c: c.stride,
            accumulate,
        }
    }

    /// Runs the builder's launch on the emulation: C in (batch, row, column) order, as f32.
    /// Panics if an element of C's slot that is no element of C lost its sentinel.
    fn run(&mut self) -> Vec<f32> {
        let Launch::Kernel(kernel) = tiled(&self.gemm()).unwrap() else {
            panic!("the tiled GEMM is one kernel");
        };
        run(&kernel, &mut self.memory);
        let (c, out) = (self.stored[2], self.mode.1);
        let Case { m, n, batch, .. } = self.case;
        let mut written = vec![false; c.len(batch)];
        let mut got = Vec::new();
        for t in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let index = c.index(t, i, j);
                    written[index] = true;
                    got.push(
                        self.memory
                            .load(at(2, &c, out), index as i64 - c.first as i64, out),
                    );
                }
            }
        }
        let slot = Addr { slot: 2, offset: 0 };
        for (index, _) in written.iter().enumerate().filter(|(_, &w)| !w) {
            let bits = self.memory.bits(slot, index as i64, out);
            assert_eq!(
                bits,
                nan_bits(out, 1),
                "C's gap at element {index} was written"
            );
        }
        got
    }

    /// op(A)[t, i, p] and op(B)[t, p, j], as the kernel reads them.
    fn operands(&self, t: u64, i: u64, p: u64, j: u64) -> (f32, f32) {
        let value = |operand: usize, t: u64, r: u64, c: u64| {
            let stored = self.stored[operand];
            self.values[operand][((t * stored.rows + r) * stored.cols + c) as usize]
        };
        let b_batch = t.min(self.batches(1) - 1);
        let a = match self.transpose.a {
            true => value(0, t, p, i),
            false => value(0, t, i, p),
        };
        let b = match self.transpose.b {
            true => value(1, b_batch, j, p),
            false => value(1, b_batch, p, j),
        };
        (a, b)
    }

    /// C before the launch, where accumulated, plus `sum`, as written to C's dtype.
    fn finish(&self, index: usize, sum: f32) -> f32 {
        let sum = if self.mode.2 {
            sum + self.values[2][index]
        } else {
            sum
        };
        match self.mode.1 {
            GemmDType::F32 => sum,
            GemmDType::BF16 => bf16::from_f32(sum).to_f32(),
        }
    }

    /// `gemm.cu`'s summation order as a plain loop: one fused multiply-add chain over p.
    fn chained(&self) -> Vec<f32> {
        let Case { m, n, k, batch, .. } = self.case;
        let mut out = Vec::new();
        for t in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    let sum = (0..k).fold(0f32, |sum, p| {
                        let (a, b) = self.operands(t, i, p, j);
                        a.mul_add(b, sum)
                    });
                    out.push(self.finish(out.len(), sum));
                }
            }
        }
        out
    }

    /// kiln's CPU matmul (`matmul_reference`: a plain f32 sum in increasing p), plus C where
    /// accumulated, as written to C's dtype.
    fn reference(&self) -> Vec<f32> {
        let Case { m, n, batch, .. } = self.case;
        let shape = |operand: usize| {
            let stored = self.stored[operand];
            let matrix = [stored.rows as usize, stored.cols as usize];
            match (operand, self.case.layout) {
                (1, Layout::Shared) => matrix.to_vec(),
                _ => [&[batch as usize][..], &matrix].concat(),
            }
        };
        let mut out = vec![f32::NAN; (batch * m * n) as usize];
        let mut view =
            TensorViewMut::contiguous(&mut out, [batch as usize, m as usize, n as usize]).unwrap();
        let buffer = |values: &[f32]| match self.mode.0 {
            GemmDType::F32 => Buffer::from_vec(values.to_vec()),
            GemmDType::BF16 => {
                Buffer::from_vec(values.iter().map(|&x| bf16::from_f32(x)).collect())
            }
        };
        let (a, b) = (buffer(&self.values[0]), buffer(&self.values[1]));
        let a = TensorView::contiguous(a.data(), shape(0)).unwrap();
        let b = TensorView::contiguous(b.data(), shape(1)).unwrap();
        matmul_reference(&a, &b, &mut view, self.transpose).unwrap();
        out.iter()
            .enumerate()
            .map(|(index, &sum)| self.finish(index, sum))
            .collect()
    }
}

const TRANSPOSES: [Transpose; 4] = [
    Transpose { a: false, b: false },
    Transpose { a: true, b: false },
    Transpose { a: false, b: true },
    Transpose { a: true, b: true },
];

/// Every element has the chain's bits, or is NaN where the chain is (a NaN's payload is not
/// part of the contract).
#[track_caller]
fn assert_chained(what: &str, got: &[f32], chained: &[f32]) {
    assert_eq!(got.len(), chained.len(), "{what}");
    for (index, (&g, &w)) in got.iter().zip(chained).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(
            same,
            "{what}: element {index}: got {g}, the chain gives {w}"
        );
    }
}

fn widen(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| f64::from(x)).collect()
}

#[test]
fn the_kernel_sums_in_its_order_and_matches_the_cpu_matmul() {
    let mut rng = testing::rng("the_kernel_sums_in_its_order_and_matches_the_cpu_matmul");
    for case in CASES {
        for transpose in TRANSPOSES {
            for mode in MODES {
                let what = format!("{case:?}, {transpose:?}, {mode:?}");
                let mut product = Product::new(&mut rng, case, transpose, mode);
                let got = product.run();
                assert_chained(&what, &got, &product.chained());
                // The chain fuses its multiply-adds, the reference does not; a bf16 C may
                // round the two sums to neighbouring values.
                let rtol = match mode.1 {
                    GemmDType::F32 => 1e-5,
                    GemmDType::BF16 => 1.0 / 128.0,
                };
                let want = widen(&product.reference());
                assert_close(&what, &widen(&got), &want, rtol, 1e-5);
            }
        }
    }
}

#[test]
fn nan_and_inf_reach_the_sums_as_in_a_plain_loop() {
    let mut rng = testing::rng("nan_and_inf_reach_the_sums_as_in_a_plain_loop");
    for mode in MODES {
        let case = case(5, 6, 20, 1, Layout::Padded);
        let mut product = Product::new(&mut rng, case, TRANSPOSES[0], mode);
        let (k, n) = (case.k as usize, case.n as usize);
        // A NaN in row 1 of A; +Inf in row 17 of B at column 4, met by a 0 in row 2 of A (NaN:
        // no product is skipped) and by a negative value in row 3 (-Inf); past the first chunk.
        product.set(0, k + 3, f32::NAN);
        product.set(1, 17 * n + 4, f32::INFINITY);
        product.set(0, 2 * k + 17, 0.0);
        product.set(0, 3 * k + 17, -0.5);
        product.set(0, 4 * k + 17, 0.25);
        let got = product.run();
        assert_chained(&format!("{mode:?}"), &got, &product.chained());
        assert!(got[n..2 * n].iter().all(|x| x.is_nan()), "{mode:?}: row 1");
        assert!(got[2 * n + 4].is_nan(), "{mode:?}: 0 · Inf");
        assert_eq!(got[3 * n + 4], f32::NEG_INFINITY, "{mode:?}");
        assert_eq!(got[4 * n + 4], f32::INFINITY, "{mode:?}");
        let mut finite = got
            .iter()
            .enumerate()
            .filter(|&(i, _)| i / n != 1 && i % n != 4);
        assert!(finite.all(|(_, x)| x.is_finite()), "{mode:?}: {got:?}");
    }
}
