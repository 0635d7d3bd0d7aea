//! GEMMs on cuBLASLt: a [`Gemm`] descriptor (row-major terms) becomes a prepared matmul —
//! descriptors, layouts and algorithm chosen once, when a program is bound — that is issued
//! with fixed pointers and the device's preallocated workspace, so it can be captured.
//!
//! Row-major `C [m,n] = op(A) · op(B)` is computed as the column-major `Cᵀ [n,m] = op(B)ᵀ ·
//! op(A)ᵀ`: cuBLASLt's first operand is our B (its stored matrix, column-major, is `[n,k]`, or
//! `[k,n]` transposed), its second is our A. Compute type f32 (no TF32), scale type f32; C and
//! D f32, or bf16 (the f32 sums rounded as cuBLASLt writes D).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use kiln_kernels::gpu::{Gemm, GemmDType};

use super::ReleaseErrors;
use crate::error::{Error, Result};

fn error(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device {
        backend: "cuda",
        what: format!("cuBLASLt {what}"),
        reason: format!("{e:?}"),
    }
}

/// A cuBLASLt object of handle type `H`, destroyed exactly once when dropped (cudarc's safe
/// layer does the same for its types). A failed destroy cannot be returned from `Drop`: it is
/// recorded in the device's [`ReleaseErrors`] and reported by the next synchronization.
struct Owned<H: Copy> {
    handle: H,
    destroy: unsafe fn(H) -> std::result::Result<(), lt::CublasError>,
    what: &'static str,
    errors: Arc<ReleaseErrors>,
}

impl<H: Copy> Owned<H> {
    /// Takes ownership of `created` (a fresh handle, or the error that creating it gave).
    fn new(
        created: std::result::Result<H, lt::CublasError>,
        destroy: unsafe fn(H) -> std::result::Result<(), lt::CublasError>,
        what: &'static str,
        errors: &Arc<ReleaseErrors>,
    ) -> Result<Self> {
        let handle = created.map_err(|e| error(what, e))?;
        Ok(Owned {
            handle,
            destroy,
            what,
            errors: errors.clone(),
        })
    }
}

impl<H: Copy> Drop for Owned<H> {
    fn drop(&mut self) {
        // SAFETY: `handle` was created for `destroy` and is destroyed only here.
        if let Err(e) = unsafe { (self.destroy)(self.handle) } {
            self.errors
                .record(format!("destroy the cuBLASLt {}", self.what), e);
        }
    }
}

/// The device's cuBLASLt handle (`cublasLtCreate`).
pub(crate) struct LtHandle {
    handle: Owned<sys::cublasLtHandle_t>,
}

// SAFETY: a cuBLASLt handle may be used from any thread (cuBLASLt's documentation: the handle
// is thread safe for matmul calls); kiln issues each executable's launches from one thread.
unsafe impl Send for LtHandle {}
unsafe impl Sync for LtHandle {}

impl LtHandle {
    /// `cublasLtCreate`: <https://docs.nvidia.com/cuda/cublas/#cublasltcreate>.
    pub fn new(errors: &Arc<ReleaseErrors>) -> Result<Self> {
        let handle = Owned::new(lt::create_handle(), lt::destroy_handle, "handle", errors)?;
        Ok(LtHandle { handle })
    }
}

/// The most candidate algorithms [`prepare`] asks the heuristic for.
pub(crate) const MAX_CANDIDATES: usize = 8;

/// One of cuBLASLt's algorithms for a prepared matmul (an opaque value, valid for its
/// descriptor and layouts).
#[derive(Clone, Copy)]
pub(crate) struct Algo(pub(crate) sys::cublasLtMatmulAlgo_t);

impl Algo {
    /// Its opaque words as bytes (little-endian), as the kernel cache records them.
    pub(crate) fn bytes(&self) -> Vec<u8> {
        self.0
            .data
            .iter()
            .flat_map(|word| word.to_le_bytes())
            .collect()
    }
}

/// cuBLASLt's version (`cublasLtGetVersion`: major · 10000 + minor · 100 + patch).
pub(crate) fn version() -> usize {
    // SAFETY: no arguments; the library is loaded by the handle the device opened first.
    unsafe { sys::cublasLtGetVersion() }
}

/// One matmul, ready to issue: its descriptor and layouts (destroyed on drop), the algorithm
/// chosen for them, its operands' device addresses and the stream it is issued on.
pub struct PreparedGemm {
    desc: Owned<sys::cublasLtMatmulDesc_t>,
    layouts: [Owned<sys::cublasLtMatrixLayout_t>; 3],
    algo: sys::cublasLtMatmulAlgo_t,
    pub a: u64,
    pub b: u64,
    pub c: u64,
    /// 1 when the product is added to C (`Gemm::accumulate`), else 0.
    beta: f32,
}

// SAFETY: the descriptors are plain heap objects of cuBLASLt, used from one thread at a time
// (the executable that owns them).
unsafe impl Send for PreparedGemm {}

impl PreparedGemm {
    /// Issues with `algo` (one of [`prepare`]'s candidates for this matmul) from now on.
    pub(crate) fn set_algo(&mut self, algo: Algo) {
        self.algo = algo.0;
    }

    /// The algorithm it issues with.
    #[cfg(test)]
    pub(crate) fn algo(&self) -> sys::cublasLtMatmulAlgo_t {
        self.algo
    }
}

fn data_type(dtype: GemmDType) -> sys::cudaDataType {
    match dtype {
        GemmDType::F32 => sys::cudaDataType::CUDA_R_32F,
        GemmDType::BF16 => sys::cudaDataType::CUDA_R_16BF,
    }
}

/// `cublasLtMatrixLayoutCreate` for a column-major `rows x cols` matrix with leading
/// dimension `ld`, strided-batched when `batch > 1`.
fn layout(
    errors: &Arc<ReleaseErrors>,
    dtype: sys::cudaDataType,
    [rows, cols, ld]: [u64; 3],
    (batch, stride): (u64, u64),
) -> Result<Owned<sys::cublasLtMatrixLayout_t>> {
    let created = lt::create_matrix_layout(dtype, rows, cols, ld as i64);
    let owned = Owned::new(created, lt::destroy_matrix_layout, "matrix layout", errors)?;
    let layout = owned.handle;
    if batch > 1 {
        let count = batch as i32;
        let stride = stride as i64;
        // SAFETY: attribute buffers of the documented types and sizes.
        unsafe {
            lt::set_matrix_layout_attribute(
                layout,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                &count as *const i32 as *const c_void,
                4,
            )
            .map_err(|e| error("batch count", e))?;
            lt::set_matrix_layout_attribute(
                layout,
                sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                &stride as *const i64 as *const c_void,
                8,
            )
            .map_err(|e| error("batch stride", e))?;
        }
    }
    Ok(owned)
}

/// The largest power of two (at most 256) dividing `pointer`, `ld_bytes` and `stride_bytes`
/// (0 for none).
fn alignment(pointer: u64, ld_bytes: u64, stride_bytes: u64) -> u32 {
    let bits = pointer | ld_bytes | stride_bytes | 256;
    1 << bits.trailing_zeros()
}

/// Prepares `gemm` with resolved pointers `a`, `b`, `c`, for a workspace of
/// `workspace_bytes`: descriptor, layouts and the algorithm cuBLASLt's heuristic puts first
/// (`cublasLtMatmulAlgoGetHeuristic`), with the first `candidates` (at least one) of its
/// algorithms in its order. Whatever was created is destroyed on every error path.
pub(crate) fn prepare(
    handle: &LtHandle,
    gemm: &Gemm,
    (a, b, c): (u64, u64, u64),
    workspace_bytes: usize,
    candidates: usize,
) -> Result<(PreparedGemm, Vec<Algo>)> {
    let errors = &handle.handle.errors;
    let created = lt::create_matmul_desc(
        sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        sys::cudaDataType::CUDA_R_32F,
    );
    let desc = Owned::new(created, lt::destroy_matmul_desc, "matmul desc", errors)?;
    let (op_first, op_second) = (gemm.transpose_b as i32, gemm.transpose_a as i32);
    // SAFETY: attribute buffers of the documented types (cublasOperation_t is an int).
    unsafe {
        lt::set_matmul_desc_attribute(
            desc.handle,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &op_first as *const i32 as *const c_void,
            4,
        )
        .map_err(|e| error("transa", e))?;
        lt::set_matmul_desc_attribute(
            desc.handle,
            sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
            &op_second as *const i32 as *const c_void,
            4,
        )
        .map_err(|e| error("transb", e))?;
    }
    let dtype = data_type(gemm.dtype);
    // Column-major stored shapes: first operand = our B, second = our A.
    let (first_rows, first_cols) = if gemm.transpose_b {
        (gemm.k, gemm.n)
    } else {
        (gemm.n, gemm.k)
    };
    let (second_rows, second_cols) = if gemm.transpose_a {
        (gemm.m, gemm.k)
    } else {
        (gemm.k, gemm.m)
    };
    let layouts = [
        layout(
            errors,
            dtype,
            [first_rows, first_cols, gemm.ldb],
            (gemm.batch, gemm.stride_b),
        )?,
        layout(
            errors,
            dtype,
            [second_rows, second_cols, gemm.lda],
            (gemm.batch, gemm.stride_a),
        )?,
        layout(
            errors,
            data_type(gemm.out),
            [gemm.n, gemm.m, gemm.ldc],
            (gemm.batch, gemm.stride_c),
        )?,
    ];
    let created = lt::create_matmul_pref();
    let pref = Owned::new(
        created,
        lt::destroy_matmul_pref,
        "matmul preference",
        errors,
    )?;
    let ws = workspace_bytes as u64;
    // The alignment every batch's pointer keeps (cuBLASLt assumes 256 bytes unless told):
    // operands at offsets inside a buffer (one head of a group, say) may have less.
    let (size, out) = (gemm.dtype.size_bytes(), gemm.out.size_bytes());
    let batched = |stride: u64, elem: u64| if gemm.batch > 1 { stride * elem } else { 0 };
    let alignments: [u32; 4] = [
        alignment(b, gemm.ldb * size, batched(gemm.stride_b, size)),
        alignment(a, gemm.lda * size, batched(gemm.stride_a, size)),
        alignment(c, gemm.ldc * out, batched(gemm.stride_c, out)),
        alignment(c, gemm.ldc * out, batched(gemm.stride_c, out)),
    ];
    use sys::cublasLtMatmulPreferenceAttributes_t as P;
    let alignment_attributes = [
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
        P::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
    ];
    // SAFETY: documented attribute types (u64, u32).
    let algos = unsafe {
        lt::set_matmul_pref_attribute(
            pref.handle,
            sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            8,
        )
        .map_err(|e| error("workspace preference", e))?;
        for (attribute, bytes) in alignment_attributes.into_iter().zip(alignments) {
            lt::set_matmul_pref_attribute(
                pref.handle,
                attribute,
                &bytes as *const u32 as *const c_void,
                4,
            )
            .map_err(|e| error("alignment preference", e))?;
        }
        let requested = candidates.clamp(1, MAX_CANDIDATES);
        let mut results =
            [std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>(); MAX_CANDIDATES];
        let mut returned = 0;
        sys::cublasLtMatmulAlgoGetHeuristic(
            handle.handle.handle,
            desc.handle,
            layouts[0].handle,
            layouts[1].handle,
            layouts[2].handle,
            layouts[2].handle,
            pref.handle,
            requested as i32,
            results.as_mut_ptr(),
            &mut returned,
        )
        .result()
        .map_err(|e| error(&format!("no algorithm for {gemm:?}"), e))?;
        let usable = results[..(returned.max(0) as usize).min(requested)].iter();
        let algos: Vec<Algo> = (usable.filter(|r| r.state.result().is_ok()))
            .map(|r| Algo(r.algo))
            .collect();
        if algos.is_empty() {
            return Err(Error::Device {
                backend: "cuda",
                what: format!("cuBLASLt: no algorithm for {gemm:?}"),
                reason: "its heuristic returned none".into(),
            });
        }
        algos
    };
    let prepared = PreparedGemm {
        desc,
        layouts,
        algo: algos[0].0,
        a,
        b,
        c,
        beta: f32::from(u8::from(gemm.accumulate)),
    };
    Ok((prepared, algos))
}

/// Issues a prepared GEMM on `stream` with that stream's own `workspace` (address, bytes): a
/// workspace is never shared by GEMMs that may run at once. Capturable: no allocation, fixed
/// pointers (`cublasLtMatmul`: <https://docs.nvidia.com/cuda/cublas/#cublasltmatmul>).
pub(crate) fn issue(
    handle: &LtHandle,
    gemm: &PreparedGemm,
    workspace: (u64, usize),
    stream: sys::cudaStream_t,
) -> Result<()> {
    let (alpha, beta) = (1.0f32, gemm.beta);
    // SAFETY: pointers are device addresses the program's slots own for the executable's
    // life; descriptors were prepared for exactly these shapes.
    unsafe {
        lt::matmul(
            handle.handle.handle,
            gemm.desc.handle,
            &alpha as *const f32 as *const c_void,
            &beta as *const f32 as *const c_void,
            gemm.b as *const c_void,
            gemm.layouts[0].handle,
            gemm.a as *const c_void,
            gemm.layouts[1].handle,
            gemm.c as *const c_void,
            gemm.layouts[2].handle,
            gemm.c as *mut c_void,
            gemm.layouts[2].handle,
            &gemm.algo,
            workspace.0 as *mut c_void,
            workspace.1,
            stream,
        )
        .map_err(|e| error("matmul", e))
    }
}
