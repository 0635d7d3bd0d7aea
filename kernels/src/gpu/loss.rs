//! Builders of `loss.cu`: cross-entropy (a row pass into scratch, then one block for the mean)
//! and its backward (one block per row); the chunked LM-head loss ([`LinearLoss`]), GEMMs and
//! row kernels over one vocabulary chunk at a time, or with its gradient in one
//! ([`LinearLoss::fused`]) over chunks of whole rows.

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
    /// [`Self::fused`]'s rows per chunk ([`fused_chunk_rows`] unless a test asks for more
    /// chunks).
    pub chunk_rows: u64,
}

/// The most bytes of f32 logits one row chunk of [`LinearLoss::fused`] takes: 1024 rows of
/// Qwen2's 151 936 columns (two chunks at 2048 tokens), where the vocabulary chunks of the
/// loss and its backward take 64 MiB.
pub const FUSED_LOGITS_BYTES: u64 = 640 << 20;

/// Rows per chunk of [`LinearLoss::fused`]: as few chunks as keep each chunk's logits within
/// [`FUSED_LOGITS_BYTES`], of equal rows but the last.
pub fn fused_chunk_rows(rows: u64, vocab: u64) -> u64 {
    let most = (FUSED_LOGITS_BYTES / (vocab.max(1) * 4)).max(1);
    rows.div_ceil(rows.div_ceil(most).max(1)).max(1)
}

/// [`LinearLoss::fused`]'s operands and results: `x`, `weight`, `targets [N]` (i64), the scalar
/// `grad_loss`; `loss []` (f32), `grad_x` and `grad_weight` of the GEMM dtype.
#[derive(Clone, Copy, Debug)]
pub struct LinearLossGrad {
    pub x: Addr,
    pub weight: Addr,
    pub targets: Addr,
    pub grad_loss: Addr,
    pub loss: Addr,
    pub grad_x: Addr,
    pub grad_weight: Addr,
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
            chunk_rows: fused_chunk_rows(rows, vocab),
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

    /// [`Self::fused`]'s workspace: one row chunk's f32 logits (its gradient written over
    /// them), each row's loss, and `grad_loss / C`.
    pub fn fused_workspace_bytes(&self) -> u64 {
        self.fused_regions().iter().sum()
    }

    fn fused_regions(&self) -> [u64; 3] {
        let aligned = |bytes: u64| bytes.next_multiple_of(SLOT_ALIGN);
        let chunk = self.chunk_rows.min(self.rows);
        [
            aligned(chunk * self.vocab * 4),
            aligned(self.rows * 4),
            aligned(4),
        ]
    }

    /// `loss`, `grad_x` and `grad_weight` in one (`LinearCrossEntropyGrad`; workspace of
    /// [`Self::fused_workspace_bytes`]). For each chunk of [`Self::chunk_rows`] rows: the
    /// logits over the whole vocabulary (one GEMM), each row's loss and its gradient written
    /// over them in the GEMM dtype (`fused_ce_rows_*`), then that gradient's two products: the
    /// chunk's rows of `grad_x`, and `grad_weight`, added to from the second chunk on (a bf16
    /// weight gradient is rounded once per chunk, and on cuBLASLt each later chunk's share may
    /// be rounded before it is added: [`Gemm`]). The rows' mean loss last. A target outside
    /// `0..V` (other than the ignored one) raises the `fault` word.
    pub fn fused(&self, io: &LinearLossGrad, workspace: Addr, fault: Addr) -> Result<Vec<Launch>> {
        let (n, h, v) = (self.rows, self.hidden, self.vocab);
        let [logits_bytes, row_loss_bytes, _] = self.fused_regions();
        let logits = workspace;
        let row_loss = workspace.add(logits_bytes);
        let scale = row_loss.add(row_loss_bytes);
        let size = self.dtype.size_bytes();
        // The gradient's row stride in its own elements: it lies in the rows of f32 logits.
        let ld = v * 4 / size;
        let rows_function = match self.dtype {
            GemmDType::F32 => "fused_ce_rows_f32",
            GemmDType::BF16 => "fused_ce_rows_bf16",
        };
        let mut launches = Vec::new();
        if n > 0 {
            launches.push(self.scale(scale, io.targets, io.grad_loss));
        }
        let chunk_rows = self.chunk_rows.max(1);
        for first in (0..n).step_by(chunk_rows as usize) {
            let rows = chunk_rows.min(n - first);
            let x = io.x.add(first * h * size);
            if v > 0 {
                launches.push(self.rows_logits((x, rows), io.weight, logits, (0, v)));
            }
            let args = vec![
                Arg::Ptr(logits),
                Arg::Ptr(row_loss.add(first * 4)),
                Arg::Ptr(io.targets.add(first * 8)),
                Arg::Ptr(scale),
                size_arg(rows),
                size_arg(v),
                Arg::I64(self.ignore_index),
                Arg::Ptr(fault),
            ];
            launches.push(block_per(MODULE, rows_function, "rows", rows, args)?);
            if h == 0 || v == 0 {
                continue;
            }
            let product = |a, b, c, [m, n, k]: [u64; 3], transpose_a, accumulate| {
                Launch::Gemm(Gemm {
                    dtype: self.dtype,
                    out: self.dtype,
                    a,
                    b,
                    c,
                    m,
                    n,
                    k,
                    batch: 1,
                    transpose_a,
                    transpose_b: false,
                    lda: ld,
                    ldb: h,
                    ldc: h,
                    stride_a: 0,
                    stride_b: 0,
                    stride_c: m * n,
                    accumulate,
                })
            };
            // grad_x[chunk] = dL · weight: [rows, H].
            let grad_x = io.grad_x.add(first * h * size);
            launches.push(product(
                logits,
                io.weight,
                grad_x,
                [rows, h, v],
                false,
                false,
            ));
            // grad_weight (+)= dLᵀ · x[chunk]: [V, H].
            let grad_weight = io.grad_weight;
            launches.push(product(
                logits,
                x,
                grad_weight,
                [v, h, rows],
                true,
                first > 0,
            ));
        }
        let zero = |at: Addr, elements: u64| match self.dtype {
            GemmDType::F32 => super::embedding::zero_f32(at, elements),
            GemmDType::BF16 => super::embedding::zero_bf16(at, elements),
        };
        if n > 0 && h > 0 && v == 0 {
            launches.push(zero(io.grad_x, n * h));
        }
        if n == 0 && h > 0 && v > 0 {
            launches.push(zero(io.grad_weight, v * h));
        }
        launches.push(cross_entropy_mean_f32(
            io.loss,
            row_loss,
            io.targets,
            n,
            self.ignore_index,
        ));
        Ok(launches)
    }

    /// `scale[0] = grad_loss / (rows not ignored)`, one block.
    fn scale(&self, scale: Addr, targets: Addr, grad_loss: Addr) -> Launch {
        let args = vec![
            Arg::Ptr(scale),
            Arg::Ptr(targets),
            Arg::Ptr(grad_loss),
            size_arg(self.rows),
            Arg::I64(self.ignore_index),
        ];
        let block = (BLOCK_THREADS, 1, 1);
        Kernel::launch(MODULE, "chunked_ce_scale_f32", (1, 1, 1), block, 0, args)
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
    fn logits(&self, x: Addr, weight: Addr, logits: Addr, chunk: (u64, u64)) -> Launch {
        self.rows_logits((x, self.rows), weight, logits, chunk)
    }

    /// The logits of `rows` rows of x from `x` on, over a vocabulary chunk.
    fn rows_logits(
        &self,
        (x, rows): (Addr, u64),
        weight: Addr,
        logits: Addr,
        (start, width): (u64, u64),
    ) -> Launch {
        if self.hidden == 0 {
            return super::embedding::zero_f32(logits, rows * width);
        }
        Launch::Gemm(Gemm {
            dtype: self.dtype,
            out: GemmDType::F32,
            a: x,
            b: self.weight_rows(weight, start),
            c: logits,
            m: rows,
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
            stride_c: rows * width,
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
            launches.push(self.scale(r.scale, io.targets, io.grad_loss));
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
