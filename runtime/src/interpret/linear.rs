//! The CPU reference of the fused [`Op::Linear`](kiln_ir::Op::Linear): exactly its unfused ops,
//! in their order, on the same kernels — the cast of `x` to bf16, each group's bf16 product
//! (f32 accumulation), the bias added as `Add` adds it, SwiGLU — so a fused program equals its
//! unfused one bit for bit on the CPU and the GPU's fused kernels are checked against it.
//! With the `rope_kv` epilogue, the three results go to scratch and `RopeKvWrite`'s own
//! reference takes them (viewed as its q, k and v) from there.

use kiln_ir::rope_kv::LinearRopeKv;
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

/// The workspace of a `Linear` with the `add_rmsnorm` epilogue over `operands`: `y [M,N]`,
/// then the more of the linear's own scratch and the norm's.
pub(crate) fn add_rmsnorm_workspace_bytes(operands: &[TensorType], eps: f64) -> u64 {
    let (Some(x), Some(w), Some(norm)) =
        (operands.first(), operands.get(1), norm_operands(operands))
    else {
        return 0;
    };
    let linear = workspace_bytes((x.dtype, x.dims()), &[w.dims()], false);
    let y = region(DType::F32, norm[0].shape.numel()) as u64;
    let norm = Workspaces::Cpu.workspace_bytes(&Op::AddRmsNorm { eps }, &norm);
    y.saturating_add(linear.max(norm))
}

/// The norm epilogue's operands `(y as the residual's type, residual, norm_weight)`: the last
/// two of a linear's operands.
fn norm_operands(operands: &[TensorType]) -> Option<[TensorType; 3]> {
    let [.., residual, weight] = operands else {
        return None;
    };
    let y = TensorType::new(DType::F32, residual.dims()).ok()?;
    Some([y, residual.clone(), weight.clone()])
}

/// Runs a one-group `Linear` with the `add_rmsnorm{eps}` epilogue: the linear into `y` at the
/// front of the workspace, then `AddRmsNorm` of `y` (viewed as the residual) into `o`.
pub(crate) fn linear_add_rmsnorm(
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    (biases, eps): (&[bool], f64),
    workspace: &mut [u8],
) -> Result<()> {
    let [.., residual, weight] = i else {
        return Err(Error::Argument {
            op: "linear",
            argument: "operands",
            reason: "the add_rmsnorm epilogue takes a residual and a norm weight".to_string(),
        });
    };
    let (m, n) = (i[0].shape().dims()[0], i[1].shape().dims()[0]);
    let (y_region, rest) = split(workspace, region(DType::F32, m * n))?;
    let mut y = view(y_region, DType::F32, &[m, n])?;
    linear(
        &i[..i.len() - 2],
        std::slice::from_mut(&mut y),
        (biases, false),
        rest,
    )?;
    let y = TensorView::contiguous(y.into_view().data(), residual.shape().clone())?;
    let operands = [y, residual.clone(), weight.clone()];
    run_op(&Op::AddRmsNorm { eps }, &operands, o, rest)
}

/// The workspace of a `Linear{biases}` with `rope_kv{theta}` over `operands`: its three
/// results (f32), then the more of the linear's own scratch and `RopeKvWrite`'s.
pub(crate) fn rope_kv_workspace_bytes(operands: &[TensorType], biases: &[bool], theta: f64) -> u64 {
    let ports = LinearRopeKv::of(biases);
    let (Some(x), Some(weights), Some(cache), Some(positions)) = (
        operands.first(),
        operands.get(1..=3),
        operands.get(ports.k_cache),
        operands.get(ports.rope_positions),
    ) else {
        return 0;
    };
    let m = x.dims().first().copied().unwrap_or(0);
    let weights: Vec<&[usize]> = weights.iter().map(TensorType::dims).collect();
    let widths: Vec<usize> = weights
        .iter()
        .map(|w| w.first().copied().unwrap_or(0))
        .collect();
    let results: usize = widths.iter().map(|&n| region(DType::F32, m * n)).sum();
    let linear = workspace_bytes((x.dtype, x.dims()), &weights, false);
    let Some(views) = LinearRopeKv::views(&widths, cache.dims(), positions.dims()) else {
        return 0;
    };
    let mut rope_operands = Vec::with_capacity(operands.len());
    for dims in views {
        let Ok(view) = TensorType::new(DType::F32, dims) else {
            return 0;
        };
        rope_operands.push(view);
    }
    rope_operands.extend_from_slice(&operands[ports.k_cache..]);
    let rope = super::rope_kv::workspace_bytes((theta, false, None), &rope_operands);
    (results as u64).saturating_add(linear.max(rope))
}

/// Runs a `Linear{biases}` with the `rope_kv{theta}` epilogue: the linear into its three
/// results at the front of the workspace, then `RopeKvWrite{theta}` of them (viewed as its q,
/// k and v) and the op's caches and indices into `o`.
pub(crate) fn linear_rope_kv(
    i: &[TensorView<'_>],
    o: &mut [TensorViewMut<'_>],
    (biases, theta): (&[bool], f64),
    workspace: &mut [u8],
) -> Result<()> {
    let ports = LinearRopeKv::of(biases);
    if i.len() <= ports.positions || biases.len() != 3 {
        return Err(Error::Argument {
            op: "linear",
            argument: "operands",
            reason: "the rope_kv epilogue takes three groups, caches and positions".to_string(),
        });
    }
    let m = i[0].shape().dims().first().copied().unwrap_or(0);
    let widths: Vec<usize> = (1..=3).map(|g| i[g].shape().dims()[0]).collect();
    let mut rest = workspace;
    let mut results = Vec::with_capacity(3);
    for &n in &widths {
        let (here, after) = split(rest, region(DType::F32, m * n))?;
        rest = after;
        results.push(view(here, DType::F32, &[m, n])?);
    }
    linear(&i[..ports.k_cache], &mut results, (biases, false), rest)?;
    let views = LinearRopeKv::views(
        &widths,
        i[ports.k_cache].shape().dims(),
        i[ports.rope_positions].shape().dims(),
    )
    .ok_or_else(|| Error::Argument {
        op: "linear",
        argument: "rope_kv",
        reason: "its widths are no whole heads of the caches' head size".to_string(),
    })?;
    let mut operands = Vec::with_capacity(i.len());
    for (result, dims) in results.into_iter().zip(views) {
        operands.push(TensorView::contiguous(
            result.into_view().data(),
            Shape::new(&dims),
        )?);
    }
    operands.extend(i[ports.k_cache..].iter().cloned());
    super::rope_kv::rope_kv_write((theta, false, None), &operands, o, rest)
}
