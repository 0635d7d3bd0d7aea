//! Batched matrix multiply: a readable reference loop and a fast path on the `gemm` crate.
//!
//! Math: `out[t] = op(a[t]) · op(b[t])` for every batch index `t`, where `op(x)` is `x` or `xᵀ`
//! as [`Transpose`] says, `op(a)` is `[M, K]`, `op(b)` is `[K, N]` and `out[t]` is `[M, N]`:
//!
//! ```text
//! out[t, i, j] = Σ_{p < K} op(a)[t, i, p] · op(b)[t, p, j]
//! ```
//!
//! Layouts (all contiguous row-major):
//! - `a` is `[batch..., M, K]`, or `[batch..., K, M]` when `transpose.a`; rank >= 2.
//! - `b` is `[batch..., K, N]`, or `[batch..., N, K]` when `transpose.b`, with `a`'s batch dims;
//!   or `b` has rank 2 and the one matrix is shared by every batch of `a` (a weight).
//! - `out` is `[batch..., M, N]`.
//!
//! Dtypes: f32·f32 → f32, f64·f64 → f64, bf16·bf16 → f32 (the bf16 values are widened exactly
//! to f32 and the sums run in f32).
//!
//! Invariants:
//! - `out` is overwritten, never read: whatever it held before (NaN included) cannot leak in.
//!   K = 0 gives zeros; M = 0, N = 0 or an empty batch give an empty `out`.
//! - Transposes never copy: they only change the strides handed to the loop or to `gemm`.
//! - The fast path runs `gemm` single-threaded (`Parallelism::None`), so its blocking, and
//!   hence its summation order, depends only on the shapes: the same inputs give the same bits
//!   on every run and at every thread count. It may differ in the last bits from the reference
//!   (gemm blocks the K sum and uses FMA), and, because gemm picks SIMD kernels by CPU
//!   features, between machines.
//! - The fast path needs no allocation of ours; `gemm` itself keeps packing buffers.
//!
//! Autodiff needs no separate backward kernel: for `out = a · b` (2-D), the VJPs are
//! `grad_a = g · bᵀ` and `grad_b = aᵀ · g`, i.e. [`matmul`] with transpose flags.

use half::bf16;
use kiln_ir::{DType, Shape};

use crate::element::{Element, Real};
use crate::error::{Error, Result};
use crate::view::{TensorView, TensorViewMut};

/// Which operands enter the product transposed (their last two dims swapped).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transpose {
    /// Use `aᵀ`: `a` is stored as `[batch..., K, M]`.
    pub a: bool,
    /// Use `bᵀ`: `b` is stored as `[batch..., N, K]`.
    pub b: bool,
}

const OP_REFERENCE: &str = "matmul_reference";
const OP_FAST: &str = "matmul";

/// The sizes of one call, read off validated shapes.
#[derive(Clone, Copy, Debug)]
struct Geometry {
    /// Number of `[M, N]` products: the product of the batch dims (1 without batch dims).
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    /// `b` is one rank-2 matrix used by every batch.
    b_shared: bool,
    transpose: Transpose,
}

impl Geometry {
    /// Validates the shapes of `a`, `b` and `out` against the module's layout rules.
    fn new(
        op: &'static str,
        a: &Shape,
        b: &Shape,
        out: &Shape,
        transpose: Transpose,
    ) -> Result<Self> {
        let shape_error = |operand, expected: String, got: &Shape| Error::Shape {
            op,
            operand,
            expected,
            got: got.clone(),
        };
        let rank = a.rank();
        if rank < 2 {
            return Err(shape_error("a", "rank >= 2".into(), a));
        }
        let (batch_dims, a_matrix) = a.dims().split_at(rank - 2);
        let (m, k) = swap_if(transpose.a, a_matrix[0], a_matrix[1]);

        let b_shared = b.rank() == 2;
        if !b_shared && b.rank() != rank {
            return Err(shape_error("b", format!("rank 2 or {rank} (a's rank)"), b));
        }
        let (b_batch, b_matrix) = b.dims().split_at(b.rank() - 2);
        let (b_k, n) = swap_if(transpose.b, b_matrix[0], b_matrix[1]);
        if b_k != k || (!b_shared && b_batch != batch_dims) {
            let layout = if transpose.b { "[N, K]" } else { "[K, N]" };
            let expected = if b_shared {
                format!("{layout} with K = {k}")
            } else {
                let batch = Shape::new(batch_dims);
                format!("batch dims {batch} then {layout} with K = {k}")
            };
            return Err(shape_error("b", expected, b));
        }

        let out_fits = out.dims().split_last_chunk::<2>() == Some((batch_dims, &[m, n]));
        if !out_fits {
            let batch = Shape::new(batch_dims);
            let expected = format!("batch dims {batch} then [M, N] = [{m}, {n}]");
            return Err(shape_error("out", expected, out));
        }
        Ok(Geometry {
            batch: batch_dims.iter().product(),
            m,
            k,
            n,
            b_shared,
            transpose,
        })
    }

    /// (row, column) strides of `op(a)` inside one stored matrix of `a`.
    fn a_strides(&self) -> (usize, usize) {
        if self.transpose.a {
            (1, self.m) // stored [K, M]
        } else {
            (self.k, 1) // stored [M, K]
        }
    }

    /// (row, column) strides of `op(b)` inside one stored matrix of `b`.
    fn b_strides(&self) -> (usize, usize) {
        if self.transpose.b {
            (1, self.k) // stored [N, K]
        } else {
            (self.n, 1) // stored [K, N]
        }
    }

    /// Elements from one matrix of `b` to the next: 0 when every batch shares it.
    fn b_batch_step(&self) -> usize {
        if self.b_shared {
            0
        } else {
            self.k * self.n
        }
    }

    /// With a shared `b` and an untransposed `a`, the batch of `[M, K]` matrices is one
    /// `[batch·M, K]` matrix (and `out` one `[batch·M, N]`): one big product instead of many.
    fn folded(self) -> Self {
        if self.b_shared && !self.transpose.a {
            Geometry {
                batch: 1,
                m: self.batch * self.m,
                ..self
            }
        } else {
            self
        }
    }
}

/// `(x, y)`, or `(y, x)` when `swap`.
fn swap_if(swap: bool, x: usize, y: usize) -> (usize, usize) {
    if swap {
        (y, x)
    } else {
        (x, y)
    }
}

fn unsupported(op: &'static str, dtype: DType) -> Error {
    Error::UnsupportedDType {
        op,
        dtype,
        supported: "f32, f64, bf16",
    }
}

/// The triple loop of the module doc, inputs of type `A` widened to the sum type `T` one
/// element at a time, and each sum run in increasing `p`.
fn reference_loop<A: Element, T: Real>(a: &[A], b: &[A], out: &mut [T], g: Geometry) {
    let (a_row, a_col) = g.a_strides();
    let (b_row, b_col) = g.b_strides();
    for t in 0..g.batch {
        let a_base = t * g.m * g.k;
        let b_base = t * g.b_batch_step();
        let out_base = t * g.m * g.n;
        for i in 0..g.m {
            for j in 0..g.n {
                let mut sum = T::zero();
                for p in 0..g.k {
                    // Exact: bf16 → f64 → f32 and f32 → f64 → f32 lose nothing.
                    let x = T::of(a[a_base + i * a_row + p * a_col].to_f64());
                    let y = T::of(b[b_base + p * b_row + j * b_col].to_f64());
                    sum += x * y;
                }
                out[out_base + i * g.n + j] = sum;
            }
        }
    }
}

fn reference_typed<A: Element, T: Real>(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    g: Geometry,
) -> Result<()> {
    let a = a.slice::<A>(OP_REFERENCE, "a")?;
    let b = b.slice::<A>(OP_REFERENCE, "b")?;
    let out = out.slice_mut::<T>(OP_REFERENCE, "out")?;
    reference_loop(a, b, out, g);
    Ok(())
}

/// `out = op(a) · op(b)` by the plain triple loop: slow, and the readable definition the fast
/// [`matmul`] is tested against. Products of two bf16 values are exact in f32, so for bf16
/// inputs the only rounding is that of the f32 sum, taken in increasing `p`.
pub fn matmul_reference(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    transpose: Transpose,
) -> Result<()> {
    let g = Geometry::new(OP_REFERENCE, a.shape(), b.shape(), out.shape(), transpose)?;
    match a.dtype() {
        DType::F32 => reference_typed::<f32, f32>(a, b, out, g),
        DType::F64 => reference_typed::<f64, f64>(a, b, out, g),
        DType::BF16 => reference_typed::<bf16, f32>(a, b, out, g),
        other => Err(unsupported(OP_REFERENCE, other)),
    }
}

/// Number of f32 elements of workspace [`matmul`] needs: 0 for f32 and f64; for bf16, room for
/// f32 copies of `a` and `b` (`numel(a) + numel(b)`).
pub fn matmul_workspace_len(
    a_dtype: DType,
    a_shape: &Shape,
    b_shape: &Shape,
    _transpose: Transpose,
) -> usize {
    match a_dtype {
        DType::BF16 => a_shape.numel().saturating_add(b_shape.numel()),
        _ => 0,
    }
}

/// Runs one single-threaded `gemm` per batch (after folding a shared `b`), writing `out`
/// without reading it. `T` must be f32 or f64; `a`, `b`, `out` have the lengths `g` implies.
fn gemm_batches<T: Real>(a: &[T], b: &[T], out: &mut [T], g: Geometry) {
    let g = g.folded();
    let (m, k, n) = (g.m, g.k, g.n);
    if m == 0 || n == 0 {
        return; // `out` is empty.
    }
    if k == 0 {
        out.fill(T::zero()); // Empty sums.
        return;
    }
    let (a_row, a_col) = g.a_strides();
    let (b_row, b_col) = g.b_strides();
    let b_step = g.b_batch_step();
    // Slices are at most isize::MAX bytes long, so every element count and stride fits isize.
    let signed = |x: usize| x as isize;
    for t in 0..g.batch {
        let a_matrix = &a[t * m * k..(t + 1) * m * k];
        let b_matrix = &b[t * b_step..t * b_step + k * n];
        let out_matrix = &mut out[t * m * n..(t + 1) * m * n];
        // SAFETY: the three slices hold exactly one [M, K], [K, N] and [M, N] matrix under the
        // given strides (checked by Geometry::new and the slicing above), `out_matrix` is
        // exclusively borrowed so it aliases neither input, and T is f32 or f64, the types
        // gemm accepts. gemm computes dst := alpha·dst + beta·lhs·rhs; with read_dst = false
        // it never reads dst, so alpha is unused and dst is overwritten with 1·lhs·rhs.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out_matrix.as_mut_ptr(),
                1,
                signed(n),
                false,
                a_matrix.as_ptr(),
                signed(a_col),
                signed(a_row),
                b_matrix.as_ptr(),
                signed(b_col),
                signed(b_row),
                T::zero(),
                T::one(),
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
}

fn fast_typed<T: Real>(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    g: Geometry,
) -> Result<()> {
    let a = a.slice::<T>(OP_FAST, "a")?;
    let b = b.slice::<T>(OP_FAST, "b")?;
    let out = out.slice_mut::<T>(OP_FAST, "out")?;
    gemm_batches(a, b, out, g);
    Ok(())
}

fn fast_bf16(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    g: Geometry,
    workspace: &mut [f32],
) -> Result<()> {
    let needed = matmul_workspace_len(DType::BF16, a.shape(), b.shape(), g.transpose);
    let a = a.slice::<bf16>(OP_FAST, "a")?;
    let b = b.slice::<bf16>(OP_FAST, "b")?;
    let out = out.slice_mut::<f32>(OP_FAST, "out")?;
    let too_small = Error::Workspace {
        op: OP_FAST,
        operand: "workspace",
        needed,
        got: workspace.len(),
    };
    let workspace = workspace.get_mut(..needed).ok_or(too_small)?;
    // Widening is exact, so the f32 gemm sees exactly the bf16 values.
    let (a32, b32) = workspace.split_at_mut(a.len());
    for (wide, &x) in a32.iter_mut().zip(a) {
        *wide = x.to_f32();
    }
    for (wide, &x) in b32.iter_mut().zip(b) {
        *wide = x.to_f32();
    }
    gemm_batches::<f32>(a32, b32, out, g);
    Ok(())
}

/// `out = op(a) · op(b)` on the `gemm` crate, single-threaded and deterministic (module doc).
/// `workspace` needs [`matmul_workspace_len`] f32 elements (none for f32 and f64); bf16 inputs
/// are widened into it before an f32 product.
pub fn matmul(
    a: &TensorView<'_>,
    b: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    transpose: Transpose,
    workspace: &mut [f32],
) -> Result<()> {
    let g = Geometry::new(OP_FAST, a.shape(), b.shape(), out.shape(), transpose)?;
    match a.dtype() {
        DType::F32 => fast_typed::<f32>(a, b, out, g),
        DType::F64 => fast_typed::<f64>(a, b, out, g),
        DType::BF16 => fast_bf16(a, b, out, g, workspace),
        other => Err(unsupported(OP_FAST, other)),
    }
}

#[cfg(test)]
mod tests;
