//! The fused linear layer (`Op::Linear`): the skinny kernel (`kernels/cuda/linear.cu`) for
//! few rows, else the vendor GEMM with the input's cast (none for a bf16 input), the biases,
//! SwiGLU and the residual add + RMSNorm as kernels of their own — the unfused program's
//! launches, in one op. Only that path writes a rounded linear's (`Op::Rounded`) SwiGLU result
//! or normed rows in bf16, so a rounded linear always takes it (its type rule keeps it to more
//! than `kiln_ir::UNROUNDED_LINEAR_MAX_ROWS` rows). With the `rope_kv` epilogue (q, k, v), the
//! skinny kernels finish RoPE and the cache append themselves; elsewhere the plain linear
//! writes q, k and v to scratch and the `RopeKvWrite` kernel takes them.

use kiln_ir::rope_kv::LinearRopeKv;
use kiln_ir::{DType, TensorType};
use kiln_kernels::gpu::linear::{
    skinny_linear, skinny_linear_add_rmsnorm, skinny_linear_rope, LinearGroup, NormEpilogue,
    RopeEpilogue, SkinnyLinear, LINEAR_MAX_ROWS,
};
use kiln_kernels::gpu::{self, cache, Addr, Gemm, GemmDType, Launch, SLOT_ALIGN};

use super::attention::{copied_caches, dims4, pooled_rows};
use super::{size, DeviceTensor, LowerOptions, Lowering, F32};
use crate::error::Result;

/// Sizes of one linear: `x [m,k]`, the groups' widths.
struct Shape {
    m: u64,
    k: u64,
    widths: Vec<u64>,
    x_dtype: DType,
}

impl Shape {
    fn of((x_dtype, x): (DType, &[usize]), weights: &[&[usize]]) -> Shape {
        let dim = |dims: &[usize], i: usize| dims.get(i).map_or(0, |&d| size(d));
        Shape {
            m: dim(x, 0),
            k: dim(x, 1),
            widths: weights.iter().map(|w| dim(w, 0)).collect(),
            x_dtype,
        }
    }

    /// The skinny kernel's spec, at placeholder addresses (its workspace depends on the
    /// shape alone).
    fn skinny(&self, swiglu: bool) -> SkinnyLinear {
        let at = Addr { slot: 0, offset: 0 };
        SkinnyLinear {
            x: at,
            x_dtype: GemmDType::of(self.x_dtype).unwrap_or(GemmDType::F32),
            m: self.m,
            k: self.k,
            ldx: self.k,
            groups: (self.widths.iter())
                .map(|&n| LinearGroup {
                    w: at,
                    bias: None,
                    out: at,
                    n,
                    ldo: n,
                })
                .collect(),
            swiglu,
        }
    }

    /// Bytes of each group's f32 result, each a multiple of the slot alignment.
    fn results_bytes(&self) -> [u64; 3] {
        let bytes = |g: usize| {
            let n = self.widths.get(g).copied().unwrap_or(0);
            (self.m * n * 4).div_ceil(SLOT_ALIGN) * SLOT_ALIGN
        };
        [bytes(0), bytes(1), bytes(2)]
    }

    /// The vendor-GEMM path's scratch: (the input rounded to bf16, the SwiGLU inputs), bytes,
    /// each a multiple of the slot alignment.
    fn gemm_regions(&self, swiglu: bool) -> [u64; 2] {
        let aligned = |bytes: u64| bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
        let rounded = match self.x_dtype {
            DType::F32 => aligned(self.m * self.k * 2),
            _ => 0,
        };
        let widest = self.widths.iter().copied().max().unwrap_or(0);
        let temps = if swiglu {
            2 * aligned(self.m * widest * 4)
        } else {
            0
        };
        [rounded, temps]
    }
}

/// The workspace of a linear over `operands` (either path may run: the larger of the two).
pub(crate) fn workspace_bytes(operands: &[TensorType], groups: usize, swiglu: bool) -> u64 {
    let (Some(x), Some(weights)) = (operands.first(), operands.get(1..=groups)) else {
        return 0;
    };
    let weights: Vec<&[usize]> = weights.iter().map(TensorType::dims).collect();
    let shape = Shape::of((x.dtype, x.dims()), &weights);
    let skinny = shape.skinny(swiglu);
    let skinny_bytes = match (1..=LINEAR_MAX_ROWS).contains(&shape.m) {
        true => skinny.workspace_bytes(),
        false => 0,
    };
    skinny_bytes.max(shape.gemm_regions(swiglu).iter().sum())
}

/// A linear's inputs: `x`, the groups' weights and biases (with their storage).
struct Inputs<'a> {
    x: &'a DeviceTensor,
    weights: Vec<&'a DeviceTensor>,
    bias: Vec<Option<(&'a DeviceTensor, gpu::Stored)>>,
}

impl<'a> Inputs<'a> {
    /// The inputs of a linear of `biases`, and the port after its biases.
    fn of(at: &'a Lowering<'_>, biases: &[bool]) -> Result<(Inputs<'a>, usize)> {
        let groups = biases.len();
        let x = at.port(at.i, "operand", 0, "x")?;
        at.expect_dtype(x, "x", &[F32, DType::BF16])?;
        at.expect_contiguous(x, "x")?;
        let weights = (1..=groups)
            .map(|port| at.operand(port, "weight", DType::BF16))
            .collect::<Result<Vec<_>>>()?;
        let mut bias_port = 1 + groups;
        let mut bias = Vec::with_capacity(groups);
        for &has_bias in biases {
            bias.push(match has_bias {
                true => {
                    bias_port += 1;
                    Some(at.stored(bias_port - 1, "bias")?)
                }
                false => None,
            });
        }
        Ok((Inputs { x, weights, bias }, bias_port))
    }

    fn shape(&self) -> Shape {
        let dims: Vec<&[usize]> = self.weights.iter().map(|w| w.dims()).collect();
        Shape::of((self.x.dtype, self.x.dims()), &dims)
    }

    /// The skinny kernels' spec writing group g to `outs[g]` (SwiGLU: the one output).
    fn skinny(&self, shape: &Shape, swiglu: bool, outs: &[Addr]) -> SkinnyLinear {
        let mut skinny = shape.skinny(swiglu);
        skinny.x = self.x.addr();
        for (g, group) in skinny.groups.iter_mut().enumerate() {
            group.w = self.weights[g].addr();
            group.bias = self.bias[g].map(|(b, _)| b.addr());
            group.out = outs[if swiglu { 0 } else { g }];
        }
        skinny
    }

    /// Whether every bias is bf16 (the skinny kernels' only storage).
    fn bf16_biases(&self) -> bool {
        self.bias
            .iter()
            .flatten()
            .all(|(b, _)| b.dtype == DType::BF16)
    }
}

pub(super) fn lower_linear(
    at: &Lowering<'_>,
    (biases, swiglu, add_rmsnorm): (&[bool], bool, Option<f64>),
    options: LowerOptions,
) -> Result<Vec<Launch>> {
    let groups = biases.len();
    let (inputs, bias_port) = Inputs::of(at, biases)?;
    // With the norm epilogue the product goes to the sum, which the epilogue completes. The
    // SwiGLU result and the normed rows may be rounded.
    let outs = (0..if swiglu { 1 } else { groups })
        .map(|port| at.rounded_result(port, "out"))
        .collect::<Result<Vec<_>>>()?;
    let norm = match add_rmsnorm {
        Some(eps) => {
            let (weight, stored) = at.stored(bias_port + 1, "norm_weight")?;
            let (normed, normed_stored) = at.rounded_result(1, "normed")?;
            let norm = NormEpilogue {
                residual: at.operand(bias_port, "residual", F32)?.addr(),
                weight: weight.addr(),
                stored,
                normed: normed.addr(),
                eps: Lowering::f32_attribute(eps),
            };
            Some((norm, normed_stored))
        }
        None => None,
    };
    let outs: Vec<(Addr, gpu::Stored)> = outs.iter().map(|(t, s)| (t.addr(), *s)).collect();
    let outputs = Outputs {
        outs: &outs,
        swiglu,
        norm,
    };
    plain_linear(at, &inputs, outputs, 0, options)
}

/// Where a plain linear writes: group g's result to `outs[g]` (with SwiGLU the one result; with
/// the norm epilogue the sum, then the normed rows as `norm` says).
struct Outputs<'o> {
    outs: &'o [(Addr, gpu::Stored)],
    swiglu: bool,
    norm: Option<(NormEpilogue, gpu::Stored)>,
}

/// The launches of a linear over `inputs` writing `outputs`, its scratch from `offset` bytes
/// into the op's workspace: the skinny kernels where they take it, else the vendor GEMM with
/// the input's cast, the biases, SwiGLU and the norm as kernels of their own.
fn plain_linear(
    at: &Lowering<'_>,
    inputs: &Inputs<'_>,
    Outputs { outs, swiglu, norm }: Outputs<'_>,
    offset: u64,
    options: LowerOptions,
) -> Result<Vec<Launch>> {
    let x = inputs.x;
    let shape = inputs.shape();
    if shape.m == 0 || shape.widths.contains(&0) {
        return Ok(vec![]);
    }
    let scratch =
        |bytes: u64| -> Result<Addr> { Ok(at.workspace(offset + bytes, x.addr())?.add(offset)) };
    // Group g's result: its output, or with SwiGLU the one output for both.
    let out_of = |g: usize| outs[if swiglu { 0 } else { g }].0;
    let addresses: Vec<Addr> = outs.iter().map(|(a, _)| *a).collect();
    let skinny = inputs.skinny(&shape, swiglu, &addresses);
    // The skinny kernels write f32 results: a rounded linear runs on the vendor GEMM (its type
    // rule gives it more than `UNROUNDED_LINEAR_MAX_ROWS` rows, within `linear_rows` or not).
    if shape.m <= options.linear_rows && !at.rounded && inputs.bf16_biases() && skinny.fits() {
        let bytes = skinny.workspace_bytes();
        let workspace = (bytes > 0).then_some(scratch(bytes)?);
        return Ok(match norm {
            Some((norm, _)) => {
                skinny_linear_add_rmsnorm(&skinny, workspace, norm, options.clusters)?
            }
            None => skinny_linear(&skinny, workspace, options.clusters)?,
        });
    }
    // The vendor GEMM: round x, one GEMM per group, biases, SwiGLU.
    let [rounded_bytes, temp_bytes] = shape.gemm_regions(swiglu);
    let workspace = scratch(rounded_bytes + temp_bytes)?;
    let mut launches = Vec::new();
    let input = match x.dtype {
        DType::F32 => {
            launches.push(gpu::copy::cast_f32_to_bf16(
                workspace,
                x.addr(),
                shape.m * shape.k,
            ));
            workspace
        }
        _ => x.addr(),
    };
    let temps = workspace.add(rounded_bytes);
    for (g, &n) in shape.widths.iter().enumerate() {
        let target = match swiglu {
            true => temps.add(g as u64 * temp_bytes / 2),
            false => out_of(g),
        };
        launches.push(Launch::Gemm(Gemm {
            dtype: GemmDType::BF16,
            out: GemmDType::F32,
            a: input,
            b: inputs.weights[g].addr(),
            c: target,
            m: shape.m,
            n,
            k: shape.k,
            batch: 1,
            transpose_a: false,
            transpose_b: true,
            lda: shape.k,
            ldb: shape.k,
            ldc: n,
            stride_a: 0,
            stride_b: 0,
            stride_c: shape.m * n,
            accumulate: false,
        }));
        if let Some((b, stored)) = inputs.bias[g] {
            let (a, b) = ((target, gpu::Stored::F32), (b.addr(), stored));
            launches.push(gpu::elementwise::add(target, a, b, shape.m * n, n));
        }
    }
    if swiglu {
        let n = shape.widths[0];
        let (gate, up) = (temps, temps.add(temp_bytes / 2));
        launches.push(gpu::elementwise::swiglu(
            (out_of(0), outs[0].1),
            ([gate, up], gpu::Stored::F32),
            shape.m * n,
        ));
    }
    if let Some((norm, normed_stored)) = norm {
        // sum = y + residual over y in place, then its norm.
        launches.push(gpu::norm::add_rmsnorm_f32(
            out_of(0),
            (norm.normed, normed_stored),
            out_of(0),
            norm.residual,
            (norm.weight, norm.stored),
            shape.m,
            shape.widths[0],
            norm.eps,
        )?);
    }
    Ok(launches)
}

/// The workspace of a q/k/v linear with the `rope_kv` epilogue over `operands`: the fused
/// kernels' partial sums, or where they do not run, q, k and v and the plain linear's scratch
/// after them (the larger of the two).
pub(crate) fn rope_kv_workspace_bytes(operands: &[TensorType]) -> u64 {
    let (Some(x), Some(weights)) = (operands.first(), operands.get(1..=3)) else {
        return 0;
    };
    let weights: Vec<&[usize]> = weights.iter().map(TensorType::dims).collect();
    let shape = Shape::of((x.dtype, x.dims()), &weights);
    let fused = match (1..=LINEAR_MAX_ROWS).contains(&shape.m) {
        true => shape.skinny(false).rope_workspace_bytes(),
        false => 0,
    };
    let results: u64 = shape.results_bytes().iter().sum();
    fused.max(results.saturating_add(workspace_bytes(operands, 3, false)))
}

/// A q/k/v linear with the RoPE and cache epilogue (`Linear` with `rope_kv`): the skinny
/// kernels finishing each rotated pair (no q, k or v written apart) where they take the layer
/// (bf16 caches, up to `linear_rows` rows), else the plain linear into the workspace and
/// `RopeKvWrite`'s kernel reading it: the unfused program's launches, in one op. The caches
/// are written in place (copied first when the planner gave a result its own slot).
pub(super) fn lower_linear_rope_kv(
    at: &Lowering<'_>,
    biases: &[bool],
    theta: f64,
    options: LowerOptions,
) -> Result<Vec<Launch>> {
    let (inputs, _) = Inputs::of(at, biases)?;
    let ports = LinearRopeKv::of(biases);
    let (k_cache, cache_stored) = at.stored(ports.k_cache, "k_cache")?;
    let v_cache = at.operand(ports.v_cache, "v_cache", k_cache.dtype)?;
    let rope_positions = at.operand(ports.rope_positions, "rope_positions", DType::I64)?;
    let positions = at.operand(ports.positions, "positions", DType::I64)?;
    let rows = pooled_rows(at, ports.rows, k_cache.dims())?;
    let q_rot = at.result(0, "q_rot", F32)?;
    let k_out = at.result(1, "k_cache", k_cache.dtype)?;
    let v_out = at.result(2, "v_cache", k_cache.dtype)?;
    let [_, _, seq, head_dim] = dims4(at, q_rot.dims(), "q_rot")?;
    let [_, _, capacity, _] = dims4(at, k_cache.dims(), "k_cache")?;
    let mut launches = copied_caches([(k_out, k_cache), (v_out, v_cache)]);
    let shape = inputs.shape();
    if shape.m == 0 {
        return Ok(launches);
    }
    let rope = RopeEpilogue {
        q_rot: q_rot.addr(),
        k_cache: k_out.addr(),
        v_cache: v_out.addr(),
        rope_positions: rope_positions.addr(),
        positions: positions.addr(),
        rows,
        seq,
        capacity,
        head_dim,
        theta: Lowering::f32_attribute(theta),
    };
    let skinny = inputs.skinny(&shape, false, &[q_rot.addr(); 3]);
    let fused = shape.m <= options.linear_rows
        && cache_stored == gpu::Stored::BF16
        && inputs.bf16_biases()
        && skinny.fits();
    if fused {
        let workspace = at.workspace(skinny.rope_workspace_bytes(), q_rot.addr())?;
        let clusters = options.clusters;
        launches.extend(skinny_linear_rope(
            &skinny, workspace, rope, clusters, at.fault,
        )?);
        return Ok(launches);
    }
    // q, k and v at the workspace's front, the linear's scratch after them.
    let [q_bytes, k_bytes, v_bytes] = shape.results_bytes();
    let q = at.workspace(q_bytes + k_bytes + v_bytes, q_rot.addr())?;
    let (k, v) = (q.add(q_bytes), q.add(q_bytes + k_bytes));
    let outs = [q, k, v].map(|addr| (addr, gpu::Stored::F32));
    let offset = q_bytes + k_bytes + v_bytes;
    let outputs = Outputs {
        outs: &outs,
        swiglu: false,
        norm: None,
    };
    launches.extend(plain_linear(at, &inputs, outputs, offset, options)?);
    let (addresses, dims) = rope.unfused(&skinny, [q, k, v]);
    let stored = (cache_stored, cache_stored);
    launches.push(cache::rope_kv_write_f32(
        addresses,
        (dims, rope.theta),
        stored,
        at.fault,
    ));
    Ok(launches)
}
