//! Causal GQA attention on the device: the forward (probs saved) and its backward as
//! cuBLASLt GEMMs around the row kernels of `attention_rows.cu`. (Attention over a KV cache is
//! `decode.rs`.)
//!
//! GQA as GEMMs: the `g = Hq/Hkv` query heads of kv head `j` are contiguous in `q`, `probs`
//! and `grad_q` (`[B,Hq,T,·]`), so for each pair `i = b·Hkv + j` they form one `[g·T, ·]`
//! matrix, `i·g·T·(row length)` elements in; `k`, `v`, `grad_k`, `grad_v` hold pair `i` at
//! `i·S·D`. Most steps are therefore ONE GEMM batched over the `B·Hkv` pairs with uniform
//! strides. Every GEMM writes its C whole (beta = 0) and sums in a fixed order: no atomics.
//!
//! Non-finite operands: a GEMM multiplies every (query, key) pair, masked ones by a
//! probability (or dS) of exactly 0, and `0 · NaN` and `0 · inf` are NaN. So a NaN or
//! infinity in `v` (the forward's P·V), or in `q`, `k` or `grad_out` (the backward's dSᵀ·Q,
//! dS·K and Pᵀ·dO) reaches the rows of the positions that must not see it, where the CPU
//! reference, which sums over the visible pairs only, stays finite — as the same GEMMs do in
//! PyTorch's eager attention. Every NaN of the reference is still a NaN here (none is dropped).

use super::copy::strided_copy;
use super::embedding::zero_f32;
use super::launch::{grid_dim, size_arg, MAX_GRID_X};
use super::{Addr, Arg, Gemm, GemmDType, Kernel, Launch, BLOCK_THREADS, SLOT_ALIGN};
use crate::{Error, Result};

const ROWS_MODULE: &str = "attention_rows";
/// Query rows per block of the row kernels (one warp each; `KILN_ROWS_PER_BLOCK`).
const ROWS_PER_BLOCK: u64 = 8;
const F32_BYTES: u64 = 4;

/// The sizes of one attention call: `q [B,Hq,T,D]`, keys `[B,Hkv,S,D]` (`S` = the cache
/// capacity for cached attention). `Hkv` divides `Hq`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionDims {
    pub batch: u64,
    pub q_heads: u64,
    pub kv_heads: u64,
    pub q_len: u64,
    pub kv_len: u64,
    pub head_dim: u64,
}

impl AttentionDims {
    /// Query heads per kv head.
    fn group(&self) -> u64 {
        self.q_heads / self.kv_heads
    }

    /// Query rows, `B·Hq·T`: the rows of probs.
    fn rows(&self) -> u64 {
        self.batch * self.q_heads * self.q_len
    }

    /// Bytes of one probs-shaped `[B,Hq,T,S]` f32 region of the backward's workspace, rounded
    /// up to [`SLOT_ALIGN`] so the next region starts aligned.
    fn probs_region_bytes(&self) -> u64 {
        (self.rows() * self.kv_len * F32_BYTES).next_multiple_of(SLOT_ALIGN)
    }

    /// Workspace of [`attention_backward_f32`], bytes: dS and the masked probs (each
    /// `[B,Hq,T,S]` f32, rounded up to [`SLOT_ALIGN`]), then `grad_out` as `[B,Hq,T,D]` f32.
    pub fn backward_workspace_bytes(&self) -> u64 {
        2 * self.probs_region_bytes() + self.rows() * self.head_dim * F32_BYTES
    }

    /// The causal forward's rule: `Hkv` divides `Hq`, `T <= S`.
    pub(crate) fn check(&self, function: &'static str) -> Result<()> {
        if self.kv_heads == 0
            || !self.q_heads.is_multiple_of(self.kv_heads)
            || self.q_len > self.kv_len
        {
            return Err(Error::Argument {
                op: function,
                argument: "dims",
                reason: format!(
                    "{self:?}: kv heads must divide query heads and T must not exceed S"
                ),
            });
        }
        Ok(())
    }
}

/// One f32 GEMM in [`Gemm`]'s row-major terms: `[m, n, k]`, `[lda, ldb, ldc]` and batch
/// strides `[a, b, c]` in elements.
#[allow(clippy::too_many_arguments)]
fn gemm(
    [a, b, c]: [Addr; 3],
    [m, n, k]: [u64; 3],
    [transpose_a, transpose_b]: [bool; 2],
    [lda, ldb, ldc]: [u64; 3],
    batch: u64,
    [stride_a, stride_b, stride_c]: [u64; 3],
) -> Launch {
    Launch::Gemm(Gemm {
        dtype: GemmDType::F32,
        out: GemmDType::F32,
        a,
        b,
        c,
        m,
        n,
        k,
        batch,
        transpose_a,
        transpose_b,
        lda,
        ldb,
        ldc,
        stride_a,
        stride_b,
        stride_c,
        accumulate: false,
    })
}

/// `base` moved on by `elements` f32.
fn at_f32(base: Addr, elements: u64) -> Addr {
    base.add(elements * F32_BYTES)
}

/// A row kernel of `attention_rows.cu` over `rows` query rows (`rows > 0`).
fn row_kernel(function: &'static str, rows: u64, args: Vec<Arg>) -> Result<Launch> {
    let blocks = rows.div_ceil(ROWS_PER_BLOCK);
    let grid = (grid_dim(function, "B·Hq·T / 8", blocks, MAX_GRID_X)?, 1, 1);
    Ok(Kernel::launch(
        ROWS_MODULE,
        function,
        grid,
        (BLOCK_THREADS, 1, 1),
        0,
        args,
    ))
}

/// The forward's operands and results: `q [B,Hq,T,D]`, `k`, `v [B,Hkv,S,D]`,
/// `out [B,T,Hq,D]`, `probs [B,Hq,T,S]`.
#[derive(Clone, Copy, Debug)]
pub struct AttentionForward {
    pub q: Addr,
    pub k: Addr,
    pub v: Addr,
    pub out: Addr,
    pub probs: Addr,
}

/// `out` and `probs` (exactly 0 past the causal limit), no workspace:
///
/// 1. scores: for each pair `i`, `probs_i [g·T,S] = q_i [g·T,D] · k_iᵀ` — one GEMM,
///    `m = g·T, n = S, k = D`, `lda = D, ldb = D` (k stored `[S,D]`, transposed), `ldc = S`,
///    batch `B·Hkv` with strides `(g·T·D, S·D, g·T·S)`;
/// 2. `attention_softmax_f32` in place: `softmax(score·scale)` over the visible keys;
/// 3. for each pair `(b, j)`, for its heads `h = j·g + e`:
///    `out[b,:,h,:] [T,D] = P[b,h] [T,S] · v[b,j] [S,D]` — one GEMM per pair batched over `e`,
///    `m = T, n = D, k = S`, `lda = S, ldb = D, ldc = Hq·D` (out's row stride), batch `g` with
///    strides `(T·S, 0, D)`: the heads share v, and head `h+1` starts `D` further in `out`.
pub fn attention_f32(at: AttentionForward, dims: AttentionDims, scale: f32) -> Result<Vec<Launch>> {
    const SOFTMAX: &str = "attention_softmax_f32";
    dims.check("attention_f32")?;
    let AttentionDims {
        batch,
        q_heads,
        kv_heads,
        q_len: t,
        kv_len: s,
        head_dim: d,
    } = dims;
    let (g, rows) = (dims.group(), dims.rows());
    if rows == 0 {
        // No query row: out and probs hold no element (S >= T, and S = 0 means T = 0).
        return Ok(vec![]);
    }
    let mut launches = Vec::new();
    launches.push(if d == 0 {
        // Empty dot products: every score is 0.
        zero_f32(at.probs, rows * s)
    } else {
        gemm(
            [at.q, at.k, at.probs],
            [g * t, s, d],
            [false, true],
            [d, d, s],
            batch * kv_heads,
            [g * t * d, s * d, g * t * s],
        )
    });
    let args = vec![
        Arg::Ptr(at.probs),
        size_arg(rows),
        size_arg(t),
        size_arg(s),
        Arg::F32(scale),
    ];
    launches.push(row_kernel(SOFTMAX, rows, args)?);
    if d == 0 {
        return Ok(launches);
    }
    for b in 0..batch {
        for j in 0..kv_heads {
            let first_head = b * q_heads + j * g;
            launches.push(gemm(
                [
                    at_f32(at.probs, first_head * t * s),
                    at_f32(at.v, (b * kv_heads + j) * s * d),
                    at_f32(at.out, (b * t * q_heads + j * g) * d),
                ],
                [t, d, s],
                [false, false],
                [s, d, q_heads * d],
                g,
                [t * s, 0, d],
            ));
        }
    }
    Ok(launches)
}

/// The backward's operands, results and workspace (f32): `q [B,Hq,T,D]`, `k`, `v [B,Hkv,S,D]`,
/// `probs [B,Hq,T,S]`, `grad_out [B,T,Hq,D]`; `grad_q [B,Hq,T,D]`, `grad_k`, `grad_v
/// [B,Hkv,S,D]`; `workspace` of [`AttentionDims::backward_workspace_bytes`].
#[derive(Clone, Copy, Debug)]
pub struct AttentionBackward {
    pub q: Addr,
    pub k: Addr,
    pub v: Addr,
    pub probs: Addr,
    pub grad_out: Addr,
    pub grad_q: Addr,
    pub grad_k: Addr,
    pub grad_v: Addr,
    pub workspace: Addr,
}

/// `grad_q`, `grad_k`, `grad_v`, reading `probs` only at the visible keys. The workspace holds
/// dS `[B,Hq,T,S]`, the masked probs `Pm [B,Hq,T,S]` and `dOt = grad_out` as `[B,Hq,T,D]`.
/// Per pair `i = b·Hkv + j` (batch `B·Hkv`; strides in elements):
///
/// 1. `dOt = grad_out` transposed to `[B,Hq,T,D]` (the strided copy);
/// 2. `dS_i [g·T,S] = dOt_i [g·T,D] · v_iᵀ` (dP): `m = g·T, n = S, k = D`, `lda = D`,
///    `ldb = D` (v stored `[S,D]`, transposed), `ldc = S`, strides `(g·T·D, S·D, g·T·S)`;
/// 3. `attention_softmax_backward_f32`: `dS = (P·(dP − Σ P·dP))·scale` in place and `Pm = P`,
///    both 0 past the causal limit;
/// 4. `grad_q_i [g·T,D] = dS_i [g·T,S] · k_i [S,D]`: `m = g·T, n = D, k = S`,
///    `lda = S, ldb = D, ldc = D`, strides `(g·T·S, S·D, g·T·D)`;
/// 5. `grad_k_i [S,D] = dS_iᵀ · q_i [g·T,D]`: `m = S, n = D, k = g·T`, A stored `[g·T,S]`
///    (transposed) with `lda = S`, `ldb = D, ldc = D`, strides `(g·T·S, g·T·D, S·D)`;
/// 6. `grad_v_i [S,D] = Pm_iᵀ · dOt_i [g·T,D]`: as 5 with `Pm` and `dOt`.
pub fn attention_backward_f32(
    at: AttentionBackward,
    dims: AttentionDims,
    scale: f32,
) -> Result<Vec<Launch>> {
    const ROWS: &str = "attention_softmax_backward_f32";
    dims.check("attention_backward_f32")?;
    let AttentionDims {
        batch,
        q_heads,
        kv_heads,
        q_len: t,
        kv_len: s,
        head_dim: d,
    } = dims;
    let (g, rows, pairs) = (dims.group(), dims.rows(), batch * kv_heads);
    let kv_elements = pairs * s * d;
    if d == 0 {
        // Every gradient is empty.
        return Ok(vec![]);
    }
    if rows == 0 {
        // No query row: grad_q is empty and grad_k, grad_v are empty sums.
        if kv_elements == 0 {
            return Ok(vec![]);
        }
        return Ok(vec![
            zero_f32(at.grad_k, kv_elements),
            zero_f32(at.grad_v, kv_elements),
        ]);
    }
    let ds = at.workspace;
    let masked_probs = ds.add(dims.probs_region_bytes());
    let grad_out_t = masked_probs.add(dims.probs_region_bytes());
    let (q_group, probs_group, kv_pair) = (g * t * d, g * t * s, s * d);
    // grad_out [B,T,Hq,D] read as [B,Hq,T,D].
    let transposed = [q_heads * t * d, d, q_heads * d, 1].map(|x| x as usize);
    let shape = [batch, q_heads, t, d].map(|x| x as usize);
    let rows_args = vec![
        Arg::Ptr(ds),
        Arg::Ptr(masked_probs),
        Arg::Ptr(at.probs),
        size_arg(rows),
        size_arg(t),
        size_arg(s),
        Arg::F32(scale),
    ];
    Ok(vec![
        strided_copy(grad_out_t, at.grad_out, &shape, &transposed, 4)?,
        gemm(
            [grad_out_t, at.v, ds],
            [g * t, s, d],
            [false, true],
            [d, d, s],
            pairs,
            [q_group, kv_pair, probs_group],
        ),
        row_kernel(ROWS, rows, rows_args)?,
        gemm(
            [ds, at.k, at.grad_q],
            [g * t, d, s],
            [false, false],
            [s, d, d],
            pairs,
            [probs_group, kv_pair, q_group],
        ),
        gemm(
            [ds, at.q, at.grad_k],
            [s, d, g * t],
            [true, false],
            [s, d, d],
            pairs,
            [probs_group, q_group, kv_pair],
        ),
        gemm(
            [masked_probs, grad_out_t, at.grad_v],
            [s, d, g * t],
            [true, false],
            [s, d, d],
            pairs,
            [probs_group, q_group, kv_pair],
        ),
    ])
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
