//! The fused linear layer (`Op::Linear`): the skinny kernel (`kernels/cuda/linear.cu`) for
//! few rows, else the vendor GEMM with the input's cast (none for a bf16 input), the biases,
//! SwiGLU and the residual add + RMSNorm as kernels of their own — the unfused program's
//! launches, in one op. Only that path writes a rounded linear's (`Op::Rounded`) SwiGLU result
//! or normed rows in bf16, so a rounded linear always takes it (its type rule keeps it to more
//! than `kiln_ir::UNROUNDED_LINEAR_MAX_ROWS` rows).

use kiln_ir::{DType, TensorType};
use kiln_kernels::gpu::linear::{
    skinny_linear, skinny_linear_add_rmsnorm, LinearGroup, NormEpilogue, SkinnyLinear,
    LINEAR_MAX_ROWS,
};
use kiln_kernels::gpu::{self, Addr, Gemm, GemmDType, Launch, SLOT_ALIGN};

use super::{size, LowerOptions, Lowering, F32};
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

pub(super) fn lower_linear(
    at: &Lowering<'_>,
    (biases, swiglu, add_rmsnorm): (&[bool], bool, Option<f64>),
    options: LowerOptions,
) -> Result<Vec<Launch>> {
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
    // With the norm epilogue the product goes to the sum, which the epilogue completes. The
    // SwiGLU result and the normed rows may be rounded.
    let outs = (0..if swiglu { 1 } else { groups })
        .map(|port| at.rounded_result(port, "out"))
        .collect::<Result<Vec<_>>>()?;
    let (norm, normed_stored) = match add_rmsnorm {
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
            (Some(norm), normed_stored)
        }
        None => (None, gpu::Stored::F32),
    };
    let dims: Vec<&[usize]> = weights.iter().map(|w| w.dims()).collect();
    let shape = Shape::of((x.dtype, x.dims()), &dims);
    if shape.m == 0 || shape.widths.contains(&0) {
        return Ok(vec![]);
    }
    // Group g's result: its output, or with SwiGLU the one output for both.
    let out_of = |g: usize| outs[if swiglu { 0 } else { g }].0.addr();
    let mut skinny = shape.skinny(swiglu);
    skinny.x = x.addr();
    for (g, group) in skinny.groups.iter_mut().enumerate() {
        group.w = weights[g].addr();
        group.bias = bias[g].map(|(b, _)| b.addr());
        group.out = out_of(g);
    }
    let bf16_biases = bias.iter().flatten().all(|(b, _)| b.dtype == DType::BF16);
    // The skinny kernels write f32 results: a rounded linear runs on the vendor GEMM (its type
    // rule gives it more than `UNROUNDED_LINEAR_MAX_ROWS` rows, within `linear_rows` or not).
    if shape.m <= options.linear_rows && !at.rounded && bf16_biases && skinny.fits() {
        let bytes = skinny.workspace_bytes();
        let workspace = (bytes > 0).then_some(at.workspace(bytes, x.addr())?);
        return Ok(match norm {
            Some(norm) => skinny_linear_add_rmsnorm(&skinny, workspace, norm, options.clusters)?,
            None => skinny_linear(&skinny, workspace, options.clusters)?,
        });
    }
    // The vendor GEMM: round x, one GEMM per group, biases, SwiGLU.
    let [rounded_bytes, temp_bytes] = shape.gemm_regions(swiglu);
    let workspace = at.workspace(rounded_bytes + temp_bytes, x.addr())?;
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
            b: weights[g].addr(),
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
        if let Some((b, stored)) = bias[g] {
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
    if let Some(norm) = norm {
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
