//! Builders of `loss.cu`: cross-entropy (a row pass into scratch, then one block for the mean)
//! and its backward (one block per row); the chunked LM-head loss ([`LinearLoss`]), GEMMs and
//! row kernels over one vocabulary chunk at a time.

use super::copy::cast_f32_to_bf16;
use super::launch::{block_per, grid_stride, size_arg};
use super::{Addr, Arg, Gemm, GemmDType, Kernel, Launch, BLOCK_THREADS, SLOT_ALIGN};
use crate::Result;

const MODULE: &str = "loss";

/// Per-row losses of `logits [N,V]` against `targets [N]` (i64) into `row_loss` (`N` f32
/// scratch; `rows > 0`). A target outside `0..V` (other than `ignore_index`) raises the
/// `fault` word.
pub fn cross_entropy_rows_f32(
    row_loss: Addr,
    logits: Addr,
    targets: Addr,
    ([rows, vocab], ignore_index): ([u64; 2], i64),
    fault: Addr,
) -> Result<Launch> {
    const FUNCTION: &str = "cross_entropy_rows_f32";
    let args = vec![
        Arg::Ptr(row_loss),
        Arg::Ptr(logits),
        Arg::Ptr(targets),
        size_arg(rows),
        size_arg(vocab),
        Arg::I64(ignore_index),
        Arg::Ptr(fault),
    ];
    block_per(MODULE, FUNCTION, "rows", rows, args)
}

/// `loss [] = Σ counted row losses / count`, one block (`rows` may be 0: NaN, as the CPU).
pub fn cross_entropy_mean_f32(
    loss: Addr,
    row_loss: Addr,
    targets: Addr,
    rows: u64,
    ignore_index: i64,
) -> Launch {
    let args = vec![
        Arg::Ptr(loss),
        Arg::Ptr(row_loss),
        Arg::Ptr(targets),
        size_arg(rows),
        Arg::I64(ignore_index),
    ];
    let block = (BLOCK_THREADS, 1, 1);
    Kernel::launch(MODULE, "cross_entropy_mean_f32", (1, 1, 1), block, 0, args)
}

/// `grad [N,V]` from the logits, targets and the scalar `grad_loss` (`rows > 0`); a target
/// outside `0..V` (other than `ignore_index`) raises the `fault` word.
pub fn cross_entropy_backward_f32(
    grad: Addr,
    [logits, targets, grad_loss]: [Addr; 3],
    ([rows, vocab], ignore_index): ([u64; 2], i64),
    fault: Addr,
) -> Result<Launch> {
    const FUNCTION: &str = "cross_entropy_backward_f32";
    let args = vec![
        Arg::Ptr(grad),
        Arg::Ptr(logits),
        Arg::Ptr(targets),
        Arg::Ptr(grad_loss),
        size_arg(rows),
        size_arg(vocab),
        Arg::I64(ignore_index),
        Arg::Ptr(fault),
    ];
    block_per(MODULE, FUNCTION, "rows", rows, args)
}

/// The chunked LM-head loss (the contract of [`crate::loss::chunked`], whose chunks it takes):
/// `x [N,H]` and `weight [V,H]` of one GEMM dtype, each vocabulary chunk's logits a GEMM into
/// the workspace followed by row kernels; the backward rebuilds them the same way and adds
/// each chunk's share of `grad_x` into one f32 accumulator (the GEMM's beta = 1, chunk after
/// chunk: a fixed order).
#[derive(Clone, Copy, Debug)]
pub struct LinearLoss {
    pub rows: u64,
    pub hidden: u64,
    pub vocab: u64,
    pub dtype: GemmDType,
    pub ignore_index: i64,
    /// Vocabulary columns per chunk ([`crate::loss::chunked::chunk_columns`] unless a test
    /// asks for more chunks).
    pub columns: u64,
}

/// The forward's operands and results: `x`, `weight`, `targets [N]` (i64); `loss []`, `lse
/// [N]` (f32).
#[derive(Clone, Copy, Debug)]
pub struct LinearLossForward {
    pub x: Addr,
    pub weight: Addr,
    pub targets: Addr,
    pub loss: Addr,
    pub lse: Addr,
}

/// The backward's operands and results: `x`, `weight`, `targets`, the forward's `lse` and the
/// scalar `grad_loss`; `grad_x` and `grad_weight` of the GEMM dtype.
#[derive(Clone, Copy, Debug)]
pub struct LinearLossBackward {
    pub x: Addr,
    pub weight: Addr,
    pub targets: Addr,
    pub lse: Addr,
    pub grad_loss: Addr,
    pub grad_x: Addr,
    pub grad_weight: Addr,
}

/// Where the scratch lies in a workspace, in this order (each region [`SLOT_ALIGN`]ed).
struct LossRegions {
    /// One chunk's f32 logits `[N, columns]`.
    logits: Addr,
    /// Forward: (max, sum, target logit) per row, then each row's loss.
    stats: Addr,
    row_loss: Addr,
    /// Backward: the chunk's logit gradient in the GEMM dtype (the logits themselves in f32),
    /// the bf16 `grad_x` accumulator, and `grad_loss / C`.
    grad_logits: Addr,
    grad_x: Addr,
    scale: Addr,
    forward_end: u64,
    backward_end: u64,
}

impl LinearLoss {
    /// `x [rows, hidden]` and `weight [vocab, hidden]` of `dtype`, in the CPU reference's
    /// chunks.
    pub fn new([rows, hidden, vocab]: [u64; 3], dtype: GemmDType, ignore_index: i64) -> Self {
        let columns =
            crate::loss::chunked::chunk_columns(rows as usize, hidden as usize, vocab as usize);
        LinearLoss {
            rows,
            hidden,
            vocab,
            dtype,
            ignore_index,
            columns: columns as u64,
        }
    }

    fn regions(&self, base: Addr) -> LossRegions {
        let (n, h, c) = (self.rows, self.hidden, self.columns);
        let bf16 = self.dtype == GemmDType::BF16;
        let aligned = |bytes: u64| bytes.next_multiple_of(SLOT_ALIGN);
        let logits = aligned(n * c * 4);
        let forward = [logits, aligned(n * 12), aligned(n * 4)];
        let backward = [
            logits,
            if bf16 { aligned(n * c * 2) } else { 0 },
            if bf16 { aligned(n * h * 4) } else { 0 },
            aligned(4),
        ];
        let starts = |sizes: &[u64]| -> Vec<Addr> {
            let mut at = 0;
            sizes
                .iter()
                .map(|size| {
                    let start = base.add(at);
                    at += size;
                    start
                })
                .collect()
        };
        let (f, b) = (starts(&forward), starts(&backward));
        LossRegions {
            logits: f[0],
            stats: f[1],
            row_loss: f[2],
            grad_logits: if bf16 { b[1] } else { b[0] },
            grad_x: b[2],
            scale: b[3],
            forward_end: forward.iter().sum(),
            backward_end: backward.iter().sum(),
        }
    }

    pub fn forward_workspace_bytes(&self) -> u64 {
        self.regions(Addr { slot: 0, offset: 0 }).forward_end
    }

    pub fn backward_workspace_bytes(&self) -> u64 {
        self.regions(Addr { slot: 0, offset: 0 }).backward_end
    }

    /// `(first column, width)` of each chunk.
    fn chunks(&self) -> impl Iterator<Item = (u64, u64)> {
        let (vocab, columns) = (self.vocab, self.columns.max(1));
        (0..vocab.div_ceil(columns)).map(move |i| {
            let start = i * columns;
            (start, columns.min(vocab - start))
        })
    }

    /// `weight`'s rows from `start` on.
    fn weight_rows(&self, weight: Addr, start: u64) -> Addr {
        weight.add(start * self.hidden * self.dtype.size_bytes())
    }

    /// The chunk's logits `x · weight[start..start + width]ᵀ` into the workspace.
    fn logits(&self, x: Addr, weight: Addr, logits: Addr, (start, width): (u64, u64)) -> Launch {
        if self.hidden == 0 {
            return super::embedding::zero_f32(logits, self.rows * width);
        }
        Launch::Gemm(Gemm {
            dtype: self.dtype,
            out: GemmDType::F32,
            a: x,
            b: self.weight_rows(weight, start),
            c: logits,
            m: self.rows,
            n: width,
            k: self.hidden,
            batch: 1,
            transpose_a: false,
            transpose_b: true,
            lda: self.hidden,
            ldb: self.hidden,
            ldc: width,
            stride_a: 0,
            stride_b: 0,
            stride_c: self.rows * width,
            accumulate: false,
        })
    }

    /// `loss` and `lse` (workspace of [`Self::forward_workspace_bytes`]); a target outside
    /// `0..V` (other than the ignored one) raises the `fault` word.
    pub fn forward(
        &self,
        io: &LinearLossForward,
        workspace: Addr,
        fault: Addr,
    ) -> Result<Vec<Launch>> {
        const UPDATE: &str = "chunked_ce_update_f32";
        let r = self.regions(workspace);
        let mut launches = Vec::new();
        if self.rows > 0 {
            for chunk @ (start, width) in self.chunks() {
                launches.push(self.logits(io.x, io.weight, r.logits, chunk));
                let args = vec![
                    Arg::Ptr(r.stats),
                    Arg::Ptr(r.logits),
                    Arg::Ptr(io.targets),
                    size_arg(self.rows),
                    size_arg(width),
                    size_arg(start),
                ];
                launches.push(block_per(MODULE, UPDATE, "rows", self.rows, args)?);
            }
            let args = vec![
                Arg::Ptr(r.row_loss),
                Arg::Ptr(io.lse),
                Arg::Ptr(r.stats),
                Arg::Ptr(io.targets),
                size_arg(self.rows),
                size_arg(self.vocab),
                Arg::I64(self.ignore_index),
                Arg::Ptr(fault),
            ];
            launches.push(grid_stride(
                MODULE,
                "chunked_ce_finish_f32",
                self.rows,
                args,
            ));
        }
        launches.push(cross_entropy_mean_f32(
            io.loss,
            r.row_loss,
            io.targets,
            self.rows,
            self.ignore_index,
        ));
        Ok(launches)
    }

    /// `grad_x` and `grad_weight` (workspace of [`Self::backward_workspace_bytes`]).
    pub fn backward(
        &self,
        io: &LinearLossBackward,
        workspace: Addr,
        fault: Addr,
    ) -> Result<Vec<Launch>> {
        let (n, h, v) = (self.rows, self.hidden, self.vocab);
        if h == 0 {
            return Ok(vec![]); // both gradients are empty
        }
        let r = self.regions(workspace);
        let bf16 = self.dtype == GemmDType::BF16;
        let size = self.dtype.size_bytes();
        let (grad, grad_function) = match bf16 {
            true => (r.grad_logits, "chunked_ce_grad_bf16"),
            false => (r.logits, "chunked_ce_grad_f32"),
        };
        let accumulator = if bf16 { r.grad_x } else { io.grad_x };
        let mut launches = Vec::new();
        if n > 0 {
            let args = vec![
                Arg::Ptr(r.scale),
                Arg::Ptr(io.targets),
                Arg::Ptr(io.grad_loss),
                size_arg(n),
                Arg::I64(self.ignore_index),
            ];
            let block = (BLOCK_THREADS, 1, 1);
            let scale = Kernel::launch(MODULE, "chunked_ce_scale_f32", (1, 1, 1), block, 0, args);
            launches.push(scale);
        }
        for chunk @ (start, width) in self.chunks() {
            let rows_out = io.grad_weight.add(start * h * size);
            if n == 0 {
                launches.push(match bf16 {
                    true => super::embedding::zero_bf16(rows_out, width * h),
                    false => super::embedding::zero_f32(rows_out, width * h),
                });
            } else {
                launches.push(self.logits(io.x, io.weight, r.logits, chunk));
                let args = vec![
                    Arg::Ptr(grad),
                    Arg::Ptr(r.logits),
                    Arg::Ptr(io.targets),
                    Arg::Ptr(io.lse),
                    Arg::Ptr(r.scale),
                    size_arg(n),
                    size_arg(width),
                    size_arg(start),
                    size_arg(v),
                    Arg::I64(self.ignore_index),
                    Arg::Ptr(fault),
                ];
                launches.push(block_per(MODULE, grad_function, "rows", n, args)?);
                // grad_weight[chunk] = dLᵀ · x: [width, H], summed over the N rows in f32
                // and rounded to the GEMM dtype as the GEMM writes it.
                launches.push(Launch::Gemm(Gemm {
                    dtype: self.dtype,
                    out: self.dtype,
                    a: grad,
                    b: io.x,
                    c: rows_out,
                    m: width,
                    n: h,
                    k: n,
                    batch: 1,
                    transpose_a: true,
                    transpose_b: false,
                    lda: width,
                    ldb: h,
                    ldc: h,
                    stride_a: 0,
                    stride_b: 0,
                    stride_c: width * h,
                    accumulate: false,
                }));
                // grad_x (+)= dL · weight[chunk]: [N, H].
                launches.push(Launch::Gemm(Gemm {
                    dtype: self.dtype,
                    out: GemmDType::F32,
                    a: grad,
                    b: self.weight_rows(io.weight, start),
                    c: accumulator,
                    m: n,
                    n: h,
                    k: width,
                    batch: 1,
                    transpose_a: false,
                    transpose_b: false,
                    lda: width,
                    ldb: h,
                    ldc: h,
                    stride_a: 0,
                    stride_b: 0,
                    stride_c: n * h,
                    accumulate: start > 0,
                }));
            }
        }
        if n > 0 && v == 0 {
            launches.push(super::embedding::zero_f32(accumulator, n * h));
        }
        if n > 0 && bf16 {
            launches.push(cast_f32_to_bf16(io.grad_x, accumulator, n * h));
        }
        Ok(launches)
    }
}

#[cfg(test)]
#[path = "loss_tests.rs"]
mod tests;
