//! The one op → launches table of the device backends.
//!
//! Every op but the views lowers to kernels of `kiln_kernels::gpu` (f32 activations, i64 ids
//! and positions), the vendor GEMM (MatMul) or device copies. Only `Contiguous` and `MatMul`
//! take strided operands; every other op names the operand that is not contiguous. Ops whose
//! results hold no element launch nothing (a grid of zero blocks is not a launch).

use kiln_ir::{DType, Op};
use kiln_kernels::gpu::optim::AdamWHyper;
use kiln_kernels::gpu::{self, Addr, Launch};

use super::DeviceTensor;
use crate::error::{Error, Result};

mod activation;
mod attention;
mod indexed;
pub(crate) mod linear;
mod matmul;
mod norm;
#[cfg(test)]
mod tests;

/// Choices among validated implementations (DESIGN.md's evidence rule: a candidate becomes the
/// default only with measured evidence), for [`CudaExecutable::with_options`]
/// (crate::cuda::CudaExecutable::with_options); the default is the measured best.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LowerOptions {
    /// Fused linears (`Op::Linear`) of at most this many rows run the skinny kernel
    /// (`kernels/cuda/linear.cu`), larger ones the vendor GEMM; 0 sends all to the GEMM. A
    /// rounded linear (more rows than [`kiln_ir::UNROUNDED_LINEAR_MAX_ROWS`]) always takes the
    /// GEMM.
    pub linear_rows: u64,
    /// Split skinny linears finish inside their clusters of blocks, with no reduce launch
    /// (`kernels/cuda/linear_common.cuh`); only where the device has thread block clusters
    /// (sm_90 and later: the CUDA executable clears it elsewhere).
    pub clusters: bool,
    /// GEMMs run on the vendor library (cuBLASLt); off, on kiln's tiled GEMM kernel
    /// (`kernels/cuda/gemm.cu`): the HIP backend's, which has no vendor GEMM.
    pub vendor_gemm: bool,
    /// The tensor-core modules (flash attention, the skinny MMA linears) run their portable
    /// variants (`flash_portable`, `linear_mma_portable`: `kernels/cuda/mma.cuh` emulates
    /// mma.sync, ldmatrix and cp.async), the code the HIP backend runs; on NVIDIA devices
    /// this checks that code against the CPU reference.
    pub portable_mma: bool,
    /// Each vendor GEMM runs the fastest of cuBLASLt's candidate algorithms for it, timed once
    /// on a device and kept in the kernel cache (later binds and processes read the choice, so
    /// they give the same bits); off, the first its heuristic names. On by default: measured
    /// 0.6 to 2.6% faster (BENCHMARKS.md).
    pub tune_gemms: bool,
    /// Beside each cached attention's split of at least `l2_prefetch_min_rows` rows, a launch
    /// on a side stream prefetches into L2 up to this many bytes of the parameters that the
    /// launches after it read (`lower/prefetch.rs`); 0: none (the HIP backend, and CUDA
    /// devices before sm_90). Measured on an H100 with 32 MiB, the default (BENCHMARKS.md,
    /// 2026-12-06, two calls): bf16 decode of 0.5B B=8 0.1 to 0.7%, B=16 3%, B=32 5.6% faster,
    /// 1.5B B=32 2.4%.
    pub l2_prefetch_bytes: u64,
    /// The prefetching side launch waits for the step this many steps (at least 1) before the
    /// split's. 1, the default, forks it after the step before the split (the RoPE and cache
    /// write then, the q/k/v linear with them in its epilogue since); 2 and 3 measured 6 to 9%
    /// slower than none at 8 to 32 rows (BENCHMARKS.md, before that fusion).
    pub l2_prefetch_lead: usize,
    /// Splits of fewer rows fork no prefetch: 8 by default, since one row measured 3% slower
    /// with it (0.5B and 1.5B, lead 1; 0.5B with leads 2 and 3 too).
    pub l2_prefetch_min_rows: u64,
}

impl LowerOptions {
    /// What the HIP backend runs: no vendor GEMM, no clusters, the portable tensor-core code,
    /// no L2 prefetch (Hopper's bulk prefetch).
    pub fn portable() -> Self {
        LowerOptions {
            clusters: false,
            vendor_gemm: false,
            portable_mma: true,
            l2_prefetch_bytes: 0,
            ..LowerOptions::default()
        }
    }
}

impl Default for LowerOptions {
    fn default() -> Self {
        LowerOptions {
            linear_rows: DEFAULT_LINEAR_ROWS,
            clusters: true,
            vendor_gemm: true,
            portable_mma: false,
            tune_gemms: true,
            l2_prefetch_bytes: DEFAULT_L2_PREFETCH_BYTES,
            l2_prefetch_lead: 1,
            l2_prefetch_min_rows: 8,
        }
    }
}

/// The default of [`LowerOptions::l2_prefetch_bytes`]: 32 MiB, a layer's o, gate, up and down
/// and the next layer's q, k and v at 0.5B (29.8 MB); o and gate at 1.5B.
pub(crate) const DEFAULT_L2_PREFETCH_BYTES: u64 = 32 << 20;

/// The default of [`LowerOptions::linear_rows`]: every row count the skinny kernels take
/// (BENCHMARKS.md). Against cuBLASLt they won on the H200 at 1 row (CUDA cores; 0.5B decode
/// 1.61 vs 1.85 ms), 2 and 8 rows (tensor cores), and on an H100 at 12 and 16 rows (0.5B 1.36
/// vs 1.67, 1.53 vs 1.76 ms; 1.5B 2.63 vs 2.89, 2.79 vs 3.03 ms). Past 16 rows a linear with a
/// SwiGLU or norm epilogue is rounded and takes cuBLASLt anyway; the others on the skinny
/// kernels beat cuBLASLt at 24 and 32 rows (H100, 2026-12-06: 0.5B 1.55 vs 1.69 and 1.71 vs
/// 1.78 ms; 1.5B 2.84 vs 3.09 and 3.11 vs 3.29 ms).
pub(crate) const DEFAULT_LINEAR_ROWS: u64 = kiln_ir::LINEAR_MAX_ROWS as u64;

/// The launches that compute `op`: read `i` (operands by port), overwrite `o` (results by
/// port), scratch in `workspace` (address and bytes; `None` when the plan gives none); kernels
/// that read indices raise the step's `fault` word (an i32) on an invalid one.
/// A result may share its operand's address (in-place results, `Alias::MayOverwrite`).
pub(crate) fn lower_op(
    op: &Op,
    i: &[DeviceTensor],
    o: &[DeviceTensor],
    workspace: Option<(Addr, u64)>,
    fault: Addr,
    options: LowerOptions,
) -> Result<Vec<Launch>> {
    let at = Lowering {
        op: op.unrounded(),
        rounded: matches!(op, Op::Rounded(_)),
        also_rounded: matches!(op, Op::AlsoRounded(_)),
        i,
        o,
        workspace,
        fault,
    };
    if at.rounded && !at.op.roundable() {
        return Err(at.unsupported("has no rounded form".to_string()));
    }
    if at.also_rounded && !at.op.also_roundable() {
        return Err(at.unsupported("has no kernel writing a rounded copy too".to_string()));
    }
    let launches = at.launches(options)?;
    (launches.into_iter())
        .map(|launch| match launch {
            Launch::Gemm(gemm) if !options.vendor_gemm => Ok(gpu::gemm::tiled(&gemm)?),
            Launch::Kernel(mut kernel) if options.portable_mma => {
                kernel.module = portable_module(kernel.module);
                Ok(Launch::Kernel(kernel))
            }
            launch => Ok(launch),
        })
        .collect()
}

/// The portable variant of a tensor-core module (`kiln_kernels::gpu::SOURCES`), or `module`.
fn portable_module(module: &'static str) -> &'static str {
    match module {
        "flash" => "flash_portable",
        "linear_mma" => "linear_mma_portable",
        other => other,
    }
}

impl Lowering<'_> {
    /// The launches of the op (GEMMs for the vendor library, tensor-core modules by their
    /// own names: `lower_op` applies the options).
    fn launches(&self, options: LowerOptions) -> Result<Vec<Launch>> {
        const VIEWS: &str =
            "views are layouts: the result is its operand's buffer with other strides, no kernel";
        match self.op {
            Op::Reshape { .. } | Op::Transpose { .. } | Op::Slice { .. } => {
                Err(self.unsupported(VIEWS.to_string()))
            }
            Op::Contiguous => self.contiguous(),
            Op::MatMul {
                transpose_a,
                transpose_b,
            } => matmul::lower_matmul(self, [*transpose_a, *transpose_b]),
            Op::Linear {
                biases,
                rope_kv: Some(theta),
                ..
            } => linear::lower_linear_rope_kv(self, biases, *theta, options),
            Op::Linear {
                biases,
                swiglu,
                add_rmsnorm,
                rope_kv: None,
            } => linear::lower_linear(self, (biases, *swiglu, *add_rmsnorm), options),
            _ => self.dense(options),
        }
    }
}

/// One op being lowered, with its placed operands, results, workspace and fault word.
struct Lowering<'a> {
    /// The op computed: a `Rounded` op's own op, with `rounded` set.
    op: &'a Op,
    /// Whether the f32 results are written rounded to bf16 (`Op::Rounded`).
    rounded: bool,
    /// Whether they are written as they are and rounded (`Op::AlsoRounded`: the copies after
    /// the op's results).
    also_rounded: bool,
    i: &'a [DeviceTensor],
    o: &'a [DeviceTensor],
    workspace: Option<(Addr, u64)>,
    fault: Addr,
}

const F32: DType = DType::F32;
const I64: DType = DType::I64;

fn size(value: usize) -> u64 {
    value as u64
}

impl Lowering<'_> {
    fn unsupported(&self, reason: String) -> Error {
        Error::Unsupported {
            backend: "cuda",
            op: self.op.to_string(),
            reason,
        }
    }

    fn port<'t>(
        &self,
        list: &'t [DeviceTensor],
        kind: &str,
        port: usize,
        name: &str,
    ) -> Result<&'t DeviceTensor> {
        list.get(port)
            .ok_or_else(|| self.unsupported(format!("{kind} {port} (`{name}`) is missing")))
    }

    /// `tensor` (called `name`) has `dtype`.
    fn expect_dtype(&self, tensor: &DeviceTensor, name: &str, dtypes: &[DType]) -> Result<()> {
        if dtypes.contains(&tensor.dtype) {
            Ok(())
        } else {
            let supported: Vec<String> = dtypes.iter().map(ToString::to_string).collect();
            Err(self.unsupported(format!(
                "`{name}` is {}; the GPU kernels take {}",
                tensor.dtype,
                supported.join(" or ")
            )))
        }
    }

    /// `tensor` (called `name`) is row-major and dense.
    fn expect_contiguous(&self, tensor: &DeviceTensor, name: &str) -> Result<()> {
        if tensor.is_contiguous() {
            Ok(())
        } else {
            Err(self.unsupported(format!(
                "`{name}` is not contiguous (shape {}, strides {:?}); make it contiguous first",
                tensor.shape(),
                tensor.strides()
            )))
        }
    }

    /// Operand `port`, contiguous and of `dtype`.
    fn operand(&self, port: usize, name: &str, dtype: DType) -> Result<&DeviceTensor> {
        let tensor = self.port(self.i, "operand", port, name)?;
        self.expect_dtype(tensor, name, &[dtype])?;
        self.expect_contiguous(tensor, name)?;
        Ok(tensor)
    }

    /// Operand `port`, contiguous and of one of `dtypes`.
    fn operand_of(&self, port: usize, name: &str, dtypes: &[DType]) -> Result<&DeviceTensor> {
        let tensor = self.port(self.i, "operand", port, name)?;
        self.expect_dtype(tensor, name, dtypes)?;
        self.expect_contiguous(tensor, name)?;
        Ok(tensor)
    }

    /// Stored operand `port` (a weight, bias or cache), contiguous, f32 or bf16.
    fn stored(&self, port: usize, name: &str) -> Result<(&DeviceTensor, gpu::Stored)> {
        let tensor = self.port(self.i, "operand", port, name)?;
        self.expect_dtype(tensor, name, &[F32, DType::BF16])?;
        self.expect_contiguous(tensor, name)?;
        let stored = gpu::Stored::of(tensor.dtype).unwrap_or(gpu::Stored::F32);
        Ok((tensor, stored))
    }

    /// Result `port` of an op that may be rounded: contiguous, bf16 when the op is rounded and
    /// the port is one it rounds ([`Op::rounded_results`]), else f32.
    fn rounded_result(&self, port: usize, name: &str) -> Result<(&DeviceTensor, gpu::Stored)> {
        let rounded = self.rounded && self.op.rounded_results().contains(&port);
        let (dtype, stored) = match rounded {
            true => (DType::BF16, gpu::Stored::BF16),
            false => (F32, gpu::Stored::F32),
        };
        Ok((self.result(port, name, dtype)?, stored))
    }

    /// Where the kernel writes result `port` of an op that may be rounded (a port it rounds,
    /// [`Op::rounded_results`]): in f32, rounded to bf16 (`Rounded`), or both (`AlsoRounded`,
    /// whose copy follows the op's results).
    fn result_forms(&self, port: usize, name: &str) -> Result<gpu::Forms> {
        let rounds = self.op.rounded_results();
        let copy = rounds.iter().position(|&p| p == port);
        Ok(match (self.rounded, self.also_rounded, copy) {
            (true, _, Some(_)) => gpu::Forms {
                f32: None,
                rounded: Some(self.result(port, name, DType::BF16)?.addr()),
            },
            (_, true, Some(index)) => {
                let at = self.o.len().saturating_sub(rounds.len()) + index;
                gpu::Forms {
                    f32: Some(self.result(port, name, F32)?.addr()),
                    rounded: Some(self.result(at, name, DType::BF16)?.addr()),
                }
            }
            _ => gpu::Forms::f32(self.result(port, name, F32)?.addr()),
        })
    }

    /// Result `port`, contiguous and of `dtype`.
    fn result(&self, port: usize, name: &str, dtype: DType) -> Result<&DeviceTensor> {
        let tensor = self.port(self.o, "result", port, name)?;
        self.expect_dtype(tensor, name, &[dtype])?;
        self.expect_contiguous(tensor, name)?;
        Ok(tensor)
    }

    /// The workspace's address, checked to hold `bytes`; `fallback` when `bytes` is 0 (the
    /// kernel then reads and writes none of it, but takes a valid pointer).
    fn workspace(&self, bytes: u64, fallback: Addr) -> Result<Addr> {
        if bytes == 0 {
            return Ok(self.workspace.map_or(fallback, |(addr, _)| addr));
        }
        match self.workspace {
            Some((addr, got)) if got >= bytes => Ok(addr),
            other => Err(self.unsupported(format!(
                "needs a workspace of {bytes} bytes, the plan gives {}",
                other.map_or(0, |(_, got)| got)
            ))),
        }
    }

    /// `f32(value)` rounded as the CPU's `T::of`.
    fn f32_attribute(value: f64) -> f32 {
        value as f32
    }

    /// `Contiguous`: a device copy of a dense operand, or the strided copy kernel; rounded (or
    /// also rounded), an f32 operand rounded to bf16 as it is copied.
    fn contiguous(&self) -> Result<Vec<Launch>> {
        let src = self.port(self.i, "operand", 0, "a")?;
        let rounding = self.rounded || self.also_rounded;
        let forms = match rounding {
            true => {
                self.expect_dtype(src, "a", &[F32])?;
                self.result_forms(0, "out")?
            }
            false => {
                let dst = self.port(self.o, "result", 0, "out")?;
                self.expect_dtype(dst, "out", &[src.dtype])?;
                gpu::Forms::f32(dst.addr())
            }
        };
        for port in 0..self.o.len() {
            self.expect_contiguous(self.port(self.o, "result", port, "out")?, "out")?;
        }
        if src.numel() == 0 {
            return Ok(vec![]);
        }
        // A dense operand: a device copy, or a cast; both forms take the strided kernel over
        // one dim.
        let (dims, strides) = match (src.is_contiguous(), forms.f32, forms.rounded) {
            (true, Some(dst), None) => return Ok(copy_unless_same(dst, src.addr(), byte_len(src))),
            (true, None, Some(dst)) => {
                let n = size(src.numel());
                return Ok(vec![gpu::copy::cast_f32_to_bf16(dst, src.addr(), n)]);
            }
            (true, ..) => (vec![src.numel()], vec![1]),
            (false, ..) => collapse(src.dims(), src.strides()),
        };
        if dims.len() > gpu::copy::MAX_COPY_RANK {
            return Err(self.unsupported(format!(
                "`a` (shape {}, strides {:?}) has more than {} dims that do not merge",
                src.shape(),
                src.strides(),
                gpu::copy::MAX_COPY_RANK
            )));
        }
        let launch = match (rounding, forms.f32) {
            (false, Some(dst)) => {
                let bytes = src.dtype.size_bytes();
                gpu::copy::strided_copy(dst, src.addr(), &dims, &strides, bytes)?
            }
            _ => gpu::copy::strided_copy_f32(forms, src.addr(), &dims, &strides)?,
        };
        Ok(vec![launch])
    }

    /// Every op whose operands and results are contiguous.
    fn dense(&self, options: LowerOptions) -> Result<Vec<Launch>> {
        let _ = options;
        // Nothing to compute when no result holds an element.
        if self.o.iter().all(|t| t.numel() == 0) {
            return Ok(vec![]);
        }
        match self.op {
            Op::Add | Op::Mul => {
                let ((a, a_stored), (b, b_stored)) = match self.op {
                    Op::Add => (self.stored(0, "a")?, self.stored(1, "b")?),
                    _ => (
                        (self.operand(0, "a", F32)?, gpu::Stored::F32),
                        (self.operand(1, "b", F32)?, gpu::Stored::F32),
                    ),
                };
                let out = self.result(0, "out", F32)?;
                let (n, b_len) = (size(a.numel()), size(b.numel()));
                if b_len == 0 || n % b_len != 0 {
                    return Err(self.unsupported(format!(
                        "`b` {} is not a suffix of `a` {}",
                        b.shape(),
                        a.shape()
                    )));
                }
                let (a, b) = ((a.addr(), a_stored), (b.addr(), b_stored));
                Ok(vec![match self.op {
                    Op::Add => gpu::elementwise::add(out.addr(), a, b, n, b_len),
                    _ => gpu::elementwise::mul_f32(out.addr(), a.0, b.0, n, b_len),
                }])
            }
            Op::Scale { alpha } => {
                let a = self.operand(0, "a", F32)?;
                let out = self.result(0, "out", F32)?;
                let alpha = Self::f32_attribute(*alpha);
                let n = size(a.numel());
                Ok(vec![gpu::elementwise::scale_f32(
                    out.addr(),
                    a.addr(),
                    alpha,
                    n,
                )])
            }
            Op::SumToShape { .. } => {
                let src = self.operand(0, "a", F32)?;
                let out = self.result(0, "out", F32)?;
                let cols = size(out.numel());
                let rows = size(src.numel()) / cols;
                // The row chunks' partials (see the builder).
                let bytes = gpu::columns::partials_bytes(rows, cols);
                let workspace = self.workspace(bytes, out.addr())?;
                let (out, src) = (out.addr(), src.addr());
                Ok(gpu::elementwise::sum_to_shape_f32(
                    out,
                    src,
                    [rows, cols],
                    workspace,
                )?)
            }
            Op::BroadcastTo { .. } => {
                let src = self.operand(0, "a", F32)?;
                let out = self.result(0, "out", F32)?;
                let (n, src_len) = (size(out.numel()), size(src.numel()));
                if src_len == 0 {
                    return Err(self.unsupported(format!("`a` {} holds no element", src.shape())));
                }
                Ok(vec![gpu::elementwise::broadcast_to_f32(
                    out.addr(),
                    src.addr(),
                    n,
                    src_len,
                )])
            }
            Op::Cast { to } => self.cast(0, *to),
            Op::CastInto => {
                let into = self.port(self.i, "operand", 0, "into")?;
                self.cast(1, into.dtype)
            }
            Op::SwiGlu | Op::SwiGluBackward | Op::Softmax | Op::SoftmaxBackward | Op::Argmax => {
                activation::lower_activation(self)
            }
            Op::RmsNorm { .. }
            | Op::AddRmsNorm { .. }
            | Op::RmsNormBackward { .. }
            | Op::AddRmsNormBackward { .. } => norm::lower_norm(self),
            Op::Rope { .. } | Op::RopeBackward { .. } => norm::lower_rope(self),
            Op::Attention { .. }
            | Op::AttentionBackward { .. }
            | Op::FlashAttention { .. }
            | Op::FlashAttentionBackward { .. }
            | Op::CachedAttention { .. }
            | Op::KvCacheWrite
            | Op::RopeKvWrite { .. } => attention::lower_attention(self),
            Op::Embedding | Op::EmbeddingBackward { .. } => self.embedding(),
            Op::CrossEntropy { .. } | Op::CrossEntropyBackward { .. } => self.cross_entropy(),
            Op::LinearCrossEntropy { .. }
            | Op::LinearCrossEntropyBackward { .. }
            | Op::LinearCrossEntropyGrad { .. } => self.linear_cross_entropy(),
            Op::AdamW(config) | Op::AdamWCopy(config) => {
                let param = self.operand(0, "param", F32)?;
                let (grad, grad_dtype) = self.stored(1, "grad")?;
                let m = self.operand(2, "m", F32)?;
                let v = self.operand(3, "v", F32)?;
                let at = self.op.adamw().map_or(4, |(_, step)| step);
                let step = self.operand(at, "step", I64)?;
                let lr = self.operand(at + 1, "lr", DType::F64)?;
                let scale = match self.i.len() == at + 3 {
                    true => Some(self.operand(at + 2, "grad_scale", F32)?.addr()),
                    false => None,
                };
                let new_param = self.result(0, "param", F32)?;
                let new_m = self.result(1, "m", F32)?;
                let new_v = self.result(2, "v", F32)?;
                // The copy is written whole, wherever it is.
                let copy = match at {
                    5 => Some(self.result(3, "copy", DType::BF16)?.addr()),
                    _ => None,
                };
                // Results not in place start as copies of their operands.
                let mut launches = Vec::new();
                for (from, to) in [(param, new_param), (m, new_m), (v, new_v)] {
                    launches.extend(copy_unless_same(to.addr(), from.addr(), byte_len(from)));
                }
                let hyper = adamw_hyper(config);
                let update = gpu::optim::AdamWUpdate {
                    param: new_param.addr(),
                    m: new_m.addr(),
                    v: new_v.addr(),
                    grad: (grad.addr(), grad_dtype),
                    step: step.addr(),
                    lr: lr.addr(),
                    scale,
                    copy,
                };
                let n = size(param.numel());
                launches.push(gpu::optim::adamw(update, n, hyper));
                Ok(launches)
            }
            &Op::EmbeddingAdamW {
                config, copy, rows, ..
            } => {
                let (ids, grad, base) =
                    (self.op.embedding_update_ports()).expect("an embedding update");
                let at = self.op.adamw().map_or(3, |(_, step)| step);
                let param = self.operand(0, "param", F32)?;
                let m = self.operand(1, "m", F32)?;
                let v = self.operand(2, "v", F32)?;
                let ids = self.operand(ids, "ids", I64)?;
                let grad = grad.map(|g| self.operand(g, "grad", F32)).transpose()?;
                let base = match base {
                    Some(port) => {
                        let (base, stored) = self.stored(port, "base")?;
                        Some((base.addr(), stored))
                    }
                    None => None,
                };
                let [vocab, hidden] = two_dims(self, param, "param")?;
                let tokens = size(ids.numel());
                let (new_param, new_m, new_v) = (
                    self.result(0, "param", F32)?,
                    self.result(1, "m", F32)?,
                    self.result(2, "v", F32)?,
                );
                let new_copy = match copy {
                    true => Some(self.result(3, "copy", DType::BF16)?),
                    false => None,
                };
                // Results not in place start as copies of their operands: the rows the op
                // does not update pass through.
                let mut launches = Vec::new();
                for (from, to) in [(param, new_param), (m, new_m), (v, new_v)] {
                    launches.extend(copy_unless_same(to.addr(), from.addr(), byte_len(from)));
                }
                if let Some(to) = new_copy {
                    let from = self.operand(3, "copy", DType::BF16)?;
                    launches.extend(copy_unless_same(to.addr(), from.addr(), byte_len(from)));
                }
                if vocab * hidden == 0 {
                    return Ok(launches);
                }
                let sizes = [tokens, hidden, vocab];
                let bytes = gpu::embedding::embedding_adamw_workspace_bytes(rows, sizes);
                let update = gpu::embedding::EmbeddingAdamW {
                    param: new_param.addr(),
                    m: new_m.addr(),
                    v: new_v.addr(),
                    copy: new_copy.map(|c| c.addr()),
                    step: self.operand(at, "step", I64)?.addr(),
                    lr: self.operand(at + 1, "lr", DType::F64)?.addr(),
                    ids: ids.addr(),
                    grad_out: grad.map(|g| g.addr()),
                    base,
                    workspace: self.workspace(bytes, new_param.addr())?,
                };
                launches.extend(gpu::embedding::embedding_adamw(
                    update,
                    rows,
                    sizes,
                    adamw_hyper(&config),
                    self.fault,
                )?);
                Ok(launches)
            }
            Op::AllReduce => {
                let buffers = (0..self.i.len())
                    .map(|port| {
                        let x = self.operand(port, "x", F32)?;
                        let y = self.result(port, "y", F32)?;
                        Ok((x.addr(), y.addr(), size(x.numel())))
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(vec![Launch::AllReduce { buffers }])
            }
            Op::ClipGradNorm { max_norm } => {
                let norm = self.result(0, "norm", F32)?.addr();
                let scale = self.result(1, "scale", F32)?.addr();
                let grads = (0..self.i.len())
                    .map(|port| self.operand(port, "grad", F32))
                    .collect::<Result<Vec<_>>>()?;
                let counts: Vec<u64> = grads.iter().map(|g| size(g.numel())).collect();
                let bytes = gpu::optim::clip_workspace_bytes(counts.iter().copied());
                let partials = self.workspace(bytes, norm)?;
                let mut launches = Vec::new();
                let mut at = 0;
                for (grad, &n) in grads.iter().zip(&counts) {
                    let partial = partials.add(at * 8);
                    launches.push(gpu::optim::clip_grad_norm_partial(grad.addr(), n, partial));
                    at += gpu::optim::clip_partials(n);
                }
                launches.push(gpu::optim::clip_grad_norm_finish(
                    partials,
                    at,
                    *max_norm,
                    [norm, scale],
                ));
                Ok(launches)
            }
            Op::MatMul { .. }
            | Op::Rounded(_)
            | Op::AlsoRounded(_)
            | Op::Linear { .. }
            | Op::Contiguous
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::Slice { .. } => unreachable!("lowered by lower_op"),
        }
    }

    /// Operand `port` cast into result 0 (of dtype `to`).
    fn cast(&self, port: usize, to: DType) -> Result<Vec<Launch>> {
        let src = self.port(self.i, "operand", port, "a")?;
        self.expect_dtype(src, "a", &[DType::F32, DType::BF16])?;
        self.expect_contiguous(src, "a")?;
        let out = self.result(0, "out", to)?;
        let n = size(src.numel());
        match (src.dtype, to) {
            (DType::F32, DType::BF16) => {
                Ok(vec![gpu::copy::cast_f32_to_bf16(out.addr(), src.addr(), n)])
            }
            (DType::BF16, DType::F32) => {
                Ok(vec![gpu::copy::cast_bf16_to_f32(out.addr(), src.addr(), n)])
            }
            (from, to) if from == to => Ok(copy_unless_same(out.addr(), src.addr(), byte_len(src))),
            (from, to) => Err(self.unsupported(format!("no cast kernel from {from} to {to}"))),
        }
    }
}

/// The bytes of a tensor's elements.
fn byte_len(tensor: &DeviceTensor) -> u64 {
    size(tensor.numel() * tensor.dtype.size_bytes())
}

/// A device copy, or nothing when the result already is the operand (in place) or empty.
fn copy_unless_same(dst: Addr, src: Addr, bytes: u64) -> Vec<Launch> {
    if dst == src || bytes == 0 {
        vec![]
    } else {
        vec![Launch::Copy { dst, src, bytes }]
    }
}

/// `[rows, cols]` over the last dim (a scalar is one row of one).
fn rows_cols(tensor: &DeviceTensor) -> [u64; 2] {
    let cols = tensor.dims().last().copied().unwrap_or(1);
    let rows = tensor.numel().checked_div(cols).unwrap_or(0);
    [size(rows), size(cols)]
}

/// The two dims of a rank-2 tensor.
fn two_dims(at: &Lowering<'_>, tensor: &DeviceTensor, name: &str) -> Result<[u64; 2]> {
    match *tensor.dims() {
        [a, b] => Ok([size(a), size(b)]),
        _ => Err(at.unsupported(format!("`{name}` {} is not rank 2", tensor.shape()))),
    }
}

/// `dims`/`strides` with dims of size 1 dropped and adjacent dims that are one run of memory
/// merged (the same elements in the same order).
fn collapse(dims: &[usize], strides: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let mut out_dims: Vec<usize> = Vec::new();
    let mut out_strides: Vec<usize> = Vec::new();
    for (&dim, &stride) in dims.iter().zip(strides) {
        if dim == 1 {
            continue;
        }
        match (out_dims.last_mut(), out_strides.last_mut()) {
            (Some(last_dim), Some(last_stride)) if *last_stride == stride * dim => {
                *last_dim *= dim;
                *last_stride = stride;
            }
            _ => {
                out_dims.push(dim);
                out_strides.push(stride);
            }
        }
    }
    (out_dims, out_strides)
}

/// An update's hyper-parameters as its kernels take them.
fn adamw_hyper(config: &kiln_ir::AdamWConfig) -> AdamWHyper {
    AdamWHyper {
        beta1: config.beta1,
        beta2: config.beta2,
        eps: config.eps,
        weight_decay: config.weight_decay,
    }
}
