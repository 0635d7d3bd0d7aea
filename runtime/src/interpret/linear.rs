//! The CPU reference of the fused [`Op::Linear`](kiln_ir::Op::Linear): exactly its unfused ops,
//! in their order, on the same kernels — the cast of `x` to bf16, each group's bf16 product
//! (f32 accumulation), the bias added as `Add` adds it, SwiGLU — so a fused program equals its
//! unfused one bit for bit on the CPU and the GPU's fused kernels are checked against it.

use kiln_ir::{DType, Op, Shape, TensorType};
use kiln_kernels::matmul::{matmul, matmul_workspace_len, Transpose};
use kiln_kernels::{activation, copy, Error, Result, TensorView, TensorViewMut};

use super::ops::run_op;
use crate::placed::bytes;
use crate::workspaces::Workspaces;
use kiln_planner::WorkspaceNeeds;

/// Bytes of `len` elements of `dtype`, rounded up to 8 (keeping the next region aligned).
fn region(dtype: DType, len: usize) -> usize {
    (len.saturating_mul(dtype.size_bytes()))
        .div_ceil(8)
        .saturating_mul(8)
}

/// The sizes of one call: `x [m,k]`, the groups' widths `n`.
struct Sizes {
    m: usize,
    k: usize,
    widths: Vec<usize>,
    swiglu: bool,
    x_dtype: DType,
}

impl Sizes {
    fn of(x: (DType, &[usize]), weights: &[&[usize]], swiglu: bool) -> Sizes {
        let (x_dtype, x_dims) = x;
        Sizes {
            m: x_dims.first().copied().unwrap_or(0),
            k: x_dims.get(1).copied().unwrap_or(0),
            widths: weights
                .iter()
                .map(|w| w.first().copied().unwrap_or(0))
                .collect(),
            swiglu,
            x_dtype,
        }
    }

    /// (the rounded x, the matmul's widening, a widened bias, the two SwiGLU inputs), bytes.
    fn regions(&self) -> [usize; 4] {
        let widest = self.widths.iter().copied().max().unwrap_or(0);
        let rounded = match self.x_dtype {
            DType::F32 => region(DType::BF16, self.m * self.k),
            _ => 0,
        };
        let widening = matmul_workspace_len(
            DType::BF16,
            &Shape::new(&[self.m, self.k]),
            &Shape::new(&[widest, self.k]),
            Transpose { a: false, b: true },
        );
        let temps = match self.swiglu {
            true => 2 * region(DType::F32, self.m * widest),
            false => 0,
        };
        [
            rounded,
            region(DType::F32, widening),
            region(DType::F32, widest),
            temps,
        ]
    }
}

/// Workspace bytes of a `Linear` over `x` and `weights` (dtype and dims of each).
pub(crate) fn workspace_bytes(x: (DType, &[usize]), weights: &[&[usize]], swiglu: bool) -> u64 {
    Sizes::of(x, weights, swiglu)
        .regions()
        .iter()
        .sum::<usize>() as u64
}

fn split(workspace: &mut [u8], bytes: usize) -> Result<(&mut [u8], &mut [u8])> {
    if workspace.len() < bytes {
        return Err(Error::Workspace {
            op: "linear",
            operand: "workspace",
            needed: bytes,
            got: workspace.len(),
        });
    }
    Ok(workspace.split_at_mut(bytes))
}

fn view<'w>(bytes: &'w mut [u8], dtype: DType, dims: &[usize]) -> Result<TensorViewMut<'w>> {
    let data = bytes::data_mut(bytes, dtype).ok_or(Error::Argument {
        op: "linear",
        argument: "workspace",
        reason: "its bytes are not aligned for its dtype".to_string(),
    })?;
    let len = dims.iter().product::<usize>();
    let data = match data {
        kiln_kernels::DataMut::F32(s) => kiln_kernels::DataMut::F32(&mut s[..len]),
        kiln_kernels::DataMut::BF16(s) => kiln_kernels::DataMut::BF16(&mut s[..len]),
        other => other,
    };
    TensorViewMut::contiguous(data, Shape::new(dims))
}

/// Runs a `Linear` with `biases` and `swiglu` on operands `i` into results `o`.
pub(crate) fn linear(
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    (biases, swiglu): (&[bool], bool),
    workspace: &mut [u8],
) -> Result<()> {
    let groups = biases.len();
    let weights: Vec<&[usize]> = i[1..=groups].iter().map(|w| w.shape().dims()).collect();
    let sizes = Sizes::of((i[0].dtype(), i[0].shape().dims()), &weights, swiglu);
    let [rounded_bytes, widening_bytes, bias_bytes, _] = sizes.regions();
    let (rounded_region, rest) = split(workspace, rounded_bytes)?;
    let (widening_region, rest) = split(rest, widening_bytes)?;
    let (bias_region, temps) = split(rest, bias_bytes)?;
    let x = match sizes.x_dtype {
        DType::F32 => {
            let mut rounded = view(rounded_region, DType::BF16, &[sizes.m, sizes.k])?;
            copy::cast(&i[0], &mut rounded)?;
            rounded.into_view()
        }
        _ => i[0].clone(),
    };
    let widening = match bytes::data_mut(widening_region, DType::F32) {
        Some(kiln_kernels::DataMut::F32(all)) => all,
        _ => &mut [],
    };
    let mut bias_operands = i[1 + groups..].iter();
    let mut swiglu_inputs = Vec::new();
    let mut temps = temps;
    for (group, &has_bias) in biases.iter().enumerate() {
        let n = sizes.widths[group];
        let bias = has_bias.then(|| bias_operands.next()).flatten();
        let scratch = (&mut *widening, &mut *bias_region);
        if swiglu {
            let (here, rest) = split(std::mem::take(&mut temps), region(DType::F32, sizes.m * n))?;
            temps = rest;
            let mut temp = view(here, DType::F32, &[sizes.m, n])?;
            product(&x, &i[1 + group], bias, &mut temp, scratch)?;
            swiglu_inputs.push(temp.into_view());
        } else {
            product(&x, &i[1 + group], bias, &mut o[group], scratch)?;
        }
    }
    if swiglu {
        activation::swiglu(&swiglu_inputs[0], &swiglu_inputs[1], &mut o[0])?;
    }
    Ok(())
}

/// `out = x·wᵀ (+ bias)`, the bias widened into `bias_region` first.
fn product(
    x: &TensorView<'_>,
    w: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    out: &mut TensorViewMut<'_>,
    (widening, bias_region): (&mut [f32], &mut [u8]),
) -> Result<()> {
    matmul(x, w, out, Transpose { a: false, b: true }, widening)?;
    if let Some(bias) = bias {
        let mut widened = view(bias_region, DType::F32, bias.shape().dims())?;
        copy::cast(bias, &mut widened)?;
        add_rows(out, &widened.as_view())?;
    }
    Ok(())
}

/// `out[r, j] += bias[j]`: the sum `Add` computes (`a + b`, one rounding), in place.
fn add_rows(out: &mut TensorViewMut<'_>, bias: &TensorView<'_>) -> Result<()> {
    let bias = bias.slice::<f32>("linear", "bias")?;
    let out = out.slice_mut::<f32>("linear", "out")?;
    for row in out.chunks_exact_mut(bias.len().max(1)) {
        for (o, b) in row.iter_mut().zip(bias) {
            *o += *b;
        }
    }
    Ok(())
}

/// The prologue's and epilogue's scratch in front of the linear's own: the normed x `[M,K]`
/// (with `rmsnorm`) and the product `[M,N]` before the residual add (with `residual`), bytes.
fn fused_regions(x: &[usize], w: &[usize], rmsnorm: bool, residual: bool) -> [usize; 2] {
    let m = x.first().copied().unwrap_or(0);
    let normed = match rmsnorm {
        true => region(DType::F32, x.iter().product()),
        false => 0,
    };
    let y = match residual {
        true => region(DType::F32, m * w.first().copied().unwrap_or(0)),
        false => 0,
    };
    [normed, y]
}

/// The workspace of a `Linear` with `biases` and `swiglu`, its prologue (`rmsnorm`) and
/// epilogue (`residual`) over `operands`: theirs, then the linear's own scratch (or the
/// norm's, when larger).
pub(crate) fn fused_workspace_bytes(
    operands: &[TensorType],
    (biases, swiglu): (&[bool], bool),
    (rmsnorm, residual): (Option<f64>, bool),
) -> u64 {
    let groups = biases.len();
    let (Some(x), Some(weights)) = (operands.first(), operands.get(1..=groups)) else {
        return 0;
    };
    let weights: Vec<&[usize]> = weights.iter().map(TensorType::dims).collect();
    let linear = workspace_bytes((x.dtype, x.dims()), &weights, swiglu);
    let norm = match rmsnorm {
        Some(eps) => {
            let norm_port = 1 + groups + biases.iter().filter(|&&b| b).count();
            let weight = operands.get(norm_port).cloned();
            let operands: Vec<TensorType> =
                [Some(x.clone()), weight].into_iter().flatten().collect();
            Workspaces::Cpu.workspace_bytes(&Op::RmsNorm { eps }, &operands)
        }
        None => 0,
    };
    let [normed, y] = fused_regions(x.dims(), weights[0], rmsnorm.is_some(), residual);
    (normed as u64)
        .saturating_add(y as u64)
        .saturating_add(linear.max(norm))
}

/// Runs a `Linear` with its prologue and epilogue as their unfused ops: `RmsNorm` of x into
/// the workspace's front (with `rmsnorm`), the linear (into the next region with `residual`),
/// then `Add` of the product (viewed as the residual) and the residual into `o`.
pub(crate) fn fused_linear(
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    (biases, swiglu): (&[bool], bool),
    (rmsnorm, residual): (Option<f64>, bool),
    workspace: &mut [u8],
) -> Result<()> {
    let (x_dims, w_dims) = (i[0].shape().dims(), i[1].shape().dims());
    let [normed_bytes, y_bytes] = fused_regions(x_dims, w_dims, rmsnorm.is_some(), residual);
    let (normed_region, rest) = split(workspace, normed_bytes)?;
    let (y_region, rest) = split(rest, y_bytes)?;
    let groups = biases.len();
    let norm_port = 1 + groups + biases.iter().filter(|&&b| b).count();
    let mut operands: Vec<TensorView<'_>> = i[..norm_port].to_vec();
    if let Some(eps) = rmsnorm {
        let mut normed = view(normed_region, DType::F32, i[0].shape().dims())?;
        let norm_operands = [i[0].clone(), i[norm_port].clone()];
        run_op(
            &Op::RmsNorm { eps },
            &norm_operands,
            std::slice::from_mut(&mut normed),
            rest,
        )?;
        operands[0] = normed.into_view();
    }
    if !residual {
        return linear(&operands, o, (biases, swiglu), rest);
    }
    let residual = i.last().expect("the residual is the last operand").clone();
    let mut y = view(y_region, DType::F32, &[x_dims[0], w_dims[0]])?;
    linear(
        &operands,
        std::slice::from_mut(&mut y),
        (biases, false),
        rest,
    )?;
    let y = TensorView::contiguous(y.into_view().data(), residual.shape().clone())?;
    run_op(&Op::Add, &[y, residual], o, rest)
}
