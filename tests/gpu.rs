//! The CUDA backend against the CPU reference. Where no CUDA device can be used (CI), each test
//! prints `SKIPPED: <why>` and returns: a skip is not a pass, and these tests only count when
//! run on a GPU machine, where `KILN_REQUIRE_GPU=1` makes a skip fail.
//!
//! 0. Without a device too: every op case below plans, runs on the interpreter and lowers for
//!    the CUDA and HIP backends (the one test here that runs on the CPU machine).
//! 1. Every op, alone in a one-op program, on fresh random inputs of several shapes: the GPU's
//!    results against the reference interpreter (f32 relative error <= 1e-5; bf16 results
//!    <= 1e-2), with every slot poisoned (0xFF bytes, NaN) first, so an element the kernel
//!    does not write fails; and the replayed graph equal to the eager run bit for bit. Then
//!    again with one element of one float input set to NaN, +inf or -inf: every NaN and
//!    infinity of the reference's results is at the same place on the GPU, with the same sign.
//!    Each op runs a third time with the HIP backend's lowering (`LowerOptions::portable`:
//!    kiln's tiled GEMM, the portable tensor-core code), under the same limits.
//! 2. The tiny prefill, decode and train programs of both families, on 1 and 2 streams, eager
//!    and replayed, against the interpreter (relative error <= 1e-5; parameters and moments after
//!    AdamW <= 1e-4; with bf16 GEMM inputs <= 1e-2); replay equal to eager bit for bit; two steps carry their state (caches,
//!    parameters, moments) on the device.
//! 3. Decode replayed at many positions after a prefill equals the full forward; the q/k/v
//!    linear with its RoPE and cache epilogue gives the bits of its unfused ops.
//! 4. The schedulers (`gpu/engine.rs`).
//! 5. The C ABI with device descriptors and a caller's stream (`gpu/c_abi.rs`).
//! 6. A world of one rank through NCCL, in a build with `--features nccl` (`gpu/nccl.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;

use kiln_frontend::model::{forward, random_weights_as, Eager, ModelConfig, Precision};
use kiln_frontend::programs::{build, example_inputs, plan_program, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::{DType, Graph, InputKind, Op, TensorType};
use kiln_kernels::testing;
use kiln_planner::{plan, PlanOptions};
use kiln_runtime::cuda::{CudaDevice, CudaExecutable};
use kiln_runtime::{interpret, LowerOptions, Tensor};
use kiln_runtime::{Backend, RunMode};
use rand::rngs::StdRng;

#[path = "gpu/c_abi.rs"]
mod c_abi;
#[path = "gpu/engine.rs"]
mod engine;
#[path = "gpu/nccl.rs"]
mod nccl;
#[path = "gpu/op_cases.rs"]
mod op_cases;
#[path = "gpu/programs.rs"]
mod programs;

fn device() -> Option<Arc<CudaDevice>> {
    match kiln_runtime::cuda::unavailable() {
        Some(reason) => {
            testing::skip_without_gpu("the CUDA tests", &reason);
            None
        }
        None => Some(CudaDevice::open(0).expect("a usable CUDA device opens")),
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn random(rng: &mut StdRng, ty: &TensorType) -> Tensor {
    let n = ty.shape.numel();
    let values = testing::signed(rng, n);
    match ty.dtype {
        DType::F32 => Tensor::from_vec(testing::to_f32(&values), ty.shape.clone()).unwrap(),
        DType::BF16 => {
            let v: Vec<half::bf16> = values
                .iter()
                .map(|x| <half::bf16 as kiln_kernels::Element>::from_f64(*x))
                .collect();
            Tensor::from_vec(v, ty.shape.clone()).unwrap()
        }
        DType::F16 => {
            let v: Vec<half::f16> = values.iter().map(|&x| half::f16::from_f64(x)).collect();
            Tensor::from_vec(v, ty.shape.clone()).unwrap()
        }
        other => panic!("no random {other}"),
    }
}

/// One operand of a one-op case: a float tensor of this type, or integers below `bound`.
#[derive(Clone)]
pub(crate) enum In {
    F(DType, Vec<usize>),
    /// Random floats bound as a param: a fused linear's weight (which must be one).
    W(DType, Vec<usize>),
    Ids(Vec<usize>, usize),
    /// Positive floats (probabilities, second moments).
    Pos(Vec<usize>),
    /// `[B]` distinct slot ids of a pool of this many, the first a padding row when B > 1.
    Slots(usize, usize),
    Step,
    /// A scalar of this dtype and value (a learning rate, a gradient scale).
    Scalar(DType, f64),
}

pub(crate) fn f(dims: &[usize]) -> In {
    In::F(DType::F32, dims.to_vec())
}

/// Sets one element of one float input (chosen by `rng`) to `value`; says which.
fn inject(rng: &mut StdRng, values: &mut BTreeMap<String, Tensor>, value: f64) -> String {
    let floats: Vec<String> = (values.iter())
        .filter(|(_, t)| t.dtype().is_float() && t.numel() > 0)
        .map(|(name, _)| name.clone())
        .collect();
    let name = &floats[rand::Rng::random_range(rng, 0..floats.len())];
    let tensor = &values[name];
    let at = rand::Rng::random_range(rng, 0..tensor.numel());
    let shape = tensor.shape().clone();
    let replaced = match tensor.dtype() {
        DType::F32 => {
            let mut v = tensor.to_vec::<f32>().unwrap();
            v[at] = value as f32;
            Tensor::from_vec(v, shape).unwrap()
        }
        DType::BF16 => {
            let mut v = tensor.to_vec::<half::bf16>().unwrap();
            v[at] = half::bf16::from_f64(value);
            Tensor::from_vec(v, shape).unwrap()
        }
        DType::F16 => {
            let mut v = tensor.to_vec::<half::f16>().unwrap();
            v[at] = half::f16::from_f64(value);
            Tensor::from_vec(v, shape).unwrap()
        }
        DType::F64 => {
            let mut v = tensor.to_vec::<f64>().unwrap();
            v[at] = value;
            Tensor::from_vec(v, shape).unwrap()
        }
        other => panic!("no special values in {other}"),
    };
    values.insert(name.clone(), replaced);
    format!("{name}[{at}] = {value}")
}

/// The NaNs and infinities of `got` are where `want` has them (infinities with their sign),
/// except that with `may_spread` an element finite in `want` may be NaN in `got` (attention's
/// GEMMs multiply masked keys by 0: kernels/src/gpu/attention.rs); returns the relative error
/// over the elements finite in both. Panics naming the first element that disagrees.
fn special_values_agree(what: &str, got: &[f64], want: &[f64], may_spread: bool) -> f64 {
    for (at, (g, w)) in got.iter().zip(want).enumerate() {
        let agree = match (g.is_nan(), w.is_nan()) {
            (true, true) => true,
            (true, false) => may_spread && w.is_finite(),
            (false, false) => g.is_finite() == w.is_finite() && (g.is_finite() || g == w),
            (false, true) => false,
        };
        assert!(
            agree,
            "{what}: element {at} is {g} on the GPU, {w} on the CPU"
        );
    }
    let (g, w): (Vec<f64>, Vec<f64>) = (got.iter().zip(want))
        .filter(|(g, w)| g.is_finite() && w.is_finite())
        .unzip();
    testing::rel_l2(&g, &w)
}

/// The one-op graph of `op` on `ins` (inputs `in0`, `in1`, ..., results `out0`, ...), fresh
/// random values of its inputs, and its result count.
fn one_op(
    rng: &mut StdRng,
    name: &str,
    (op, ins): (&Op, &[In]),
) -> (Graph, BTreeMap<String, Tensor>, usize) {
    let mut graph = Graph::new(name);
    let mut values = BTreeMap::new();
    let mut operands = Vec::new();
    for (index, input) in ins.iter().enumerate() {
        let input_name = format!("in{index}");
        let kind = match input {
            In::W(..) => InputKind::Param,
            _ => InputKind::Input,
        };
        let (ty, tensor) = match input {
            In::F(dtype, dims) | In::W(dtype, dims) => {
                let ty = TensorType::new(*dtype, dims.as_slice()).unwrap();
                let t = random(rng, &ty);
                (ty, t)
            }
            In::Ids(dims, bound) => {
                let ty = TensorType::new(DType::I64, dims.as_slice()).unwrap();
                let ids = testing::indices(rng, ty.shape.numel(), *bound);
                (ty.clone(), Tensor::from_vec(ids, ty.shape.clone()).unwrap())
            }
            In::Slots(batch, pool) => {
                let ty = TensorType::new(DType::I64, [*batch]).unwrap();
                let mut slots: Vec<i64> = (0..*pool as i64).collect();
                rand::seq::SliceRandom::shuffle(&mut slots[..], rng);
                slots.truncate(*batch);
                if *batch > 1 {
                    slots[0] = kiln_ir::PADDING_SLOT;
                }
                (ty, Tensor::from_vec(slots, [*batch]).unwrap())
            }
            In::Pos(dims) => {
                let ty = TensorType::new(DType::F32, dims.as_slice()).unwrap();
                let v = testing::uniform(rng, ty.shape.numel(), 0.01, 1.0);
                (
                    ty.clone(),
                    Tensor::from_vec(testing::to_f32(&v), ty.shape.clone()).unwrap(),
                )
            }
            In::Step => {
                let ty = TensorType::new(DType::I64, kiln_ir::Shape::scalar()).unwrap();
                (
                    ty,
                    Tensor::from_vec(vec![3i64], kiln_ir::Shape::scalar()).unwrap(),
                )
            }
            In::Scalar(dtype, value) => (
                TensorType::new(*dtype, kiln_ir::Shape::scalar()).unwrap(),
                Tensor::scalar(*value, *dtype),
            ),
        };
        operands.push(graph.input(&input_name, kind, ty).unwrap());
        values.insert(input_name, tensor);
    }
    let results = graph.op(op.clone(), &operands).unwrap();
    for (port, value) in results.iter().enumerate() {
        graph.output(&format!("out{port}"), *value).unwrap();
    }
    (graph, values, results.len())
}

/// Runs `graph` as `planned` on the GPU from `values` and returns its outputs `out0..`.
fn run_on_gpu(
    device: &Arc<CudaDevice>,
    (graph, planned): (&Graph, &kiln_planner::Plan),
    values: &BTreeMap<String, Tensor>,
    (mode, options): (RunMode, LowerOptions),
    results: usize,
) -> Vec<Tensor> {
    let mut exe = CudaExecutable::with_options(device, graph, planned, options).unwrap();
    for (name, tensor) in values {
        exe.set(name, tensor).unwrap();
    }
    exe.run(mode).unwrap();
    (0..results)
        .map(|port| exe.get(&format!("out{port}")).unwrap())
        .collect()
}

/// Builds the one-op graph for `op` on `ins`, runs it on the GPU (eager, then a fresh
/// executable replayed) and on the interpreter; returns the worst relative error. With
/// `special`, one element of one float input is set to it first (see [`inject`]).
fn check_op(
    device: &Arc<CudaDevice>,
    rng: &mut StdRng,
    name: &str,
    (op, ins): (&Op, &[In]),
    special: Option<f64>,
) -> f64 {
    let (graph, mut values, results) = one_op(rng, name, (op, ins));
    let injected = special.map(|value| inject(rng, &mut values, value));
    // Through the GEMM and the flash attention, a special v (forward), q, k or grad_out
    // (backward) reaches masked rows (kernels/src/gpu/attention.rs, kernels/cuda/flash.cu).
    let spreading: &[&str] = match op.unrounded() {
        Op::Attention { .. } | Op::FlashAttention { .. } => &["in2["],
        Op::AttentionBackward { .. } => &["in0[", "in1[", "in4["],
        Op::FlashAttentionBackward { .. } => &["in0[", "in1[", "in5["],
        // Every logit of a row meets its x, every row meets each weight row.
        Op::LinearCrossEntropy { .. } | Op::LinearCrossEntropyBackward { .. } => {
            &["in0[", "in1[", "in3[", "in4["]
        }
        _ => &[],
    };
    let may_spread = (injected.as_deref())
        .is_some_and(|what| spreading.iter().any(|input| what.starts_with(input)));
    let name = &match &injected {
        Some(what) => format!("{name} with {what}"),
        None => name.to_string(),
    };
    let planned = plan(
        &graph,
        &PlanOptions::default(),
        &kiln_runtime::Workspaces::Cuda,
    )
    .unwrap();
    let want = interpret(&graph, &mut values.clone()).unwrap();

    let run = |mode: RunMode, options: LowerOptions| {
        run_on_gpu(
            device,
            (&graph, &planned),
            &values,
            (mode, options),
            results,
        )
    };
    let cuda = case_options(op, LowerOptions::default());
    let eager = run(RunMode::Eager, cuda);
    let replayed = run(RunMode::Graph, cuda);
    // A split linear finishes inside its clusters or by a reduce launch: the same sums in the
    // same order, so the same bits.
    let unclustered = LowerOptions {
        clusters: false,
        ..cuda
    };
    let reduced = matches!(op, Op::Linear { .. }).then(|| run(RunMode::Graph, unclustered));
    // The HIP backend's code on this device: kiln's tiled GEMM for cuBLASLt's, the portable
    // emulation of mma.sync, ldmatrix and cp.async in the tensor-core modules.
    let hip = case_options(op, LowerOptions::portable());
    let portable = run(RunMode::Graph, hip);
    let mut worst = 0.0f64;
    for (port, got) in eager.iter().enumerate() {
        let reference = &want[&format!("out{port}")];
        let w = reference.to_f64_vec().unwrap();
        let error_of = |got: &Tensor, what: &str| {
            let g = got.to_f64_vec().unwrap();
            if special.is_some() {
                special_values_agree(&format!("{name}{what}: out{port}"), &g, &w, may_spread)
            } else {
                assert!(
                    g.iter().all(|v| v.is_finite()),
                    "{name}{what}: out{port} has unwritten (NaN) elements"
                );
                testing::rel_l2(&g, &w)
            }
        };
        // FlashAttention rounds P and dS to bf16 (or f16) for its second products, as the CPU
        // reference does, but from probabilities within a few f32 ulps of the reference's
        // (ex2.approx, another order of the sums): a rounding that falls the other way moves
        // its term by bf16's 2^-8 relative step (f16's 2^-11).
        let limit = match op.unrounded() {
            _ if got.dtype() == DType::BF16 => 1e-2,
            // RoPE's f32 rows within f32 rounding, a rounding to f16 that falls the other way
            // moving an element by f16's 2^-11 relative step.
            _ if got.dtype() == DType::F16 => 1e-3,
            Op::FlashAttention {
                rounding: DType::F16,
                ..
            } => 1e-3,
            Op::FlashAttention { .. } | Op::FlashAttentionBackward { .. } => 4e-3,
            _ => 1e-5,
        };
        let error = error_of(got, "");
        assert!(
            error <= limit,
            "{name}: out{port} relative error {error:e} > {limit:e}"
        );
        let portable_error = error_of(&portable[port], " (portable)");
        assert!(
            portable_error <= limit,
            "{name} (portable): out{port} relative error {portable_error:e} > {limit:e}"
        );
        assert_eq!(
            bits(got),
            bits(&replayed[port]),
            "{name}: replay differs from eager"
        );
        if let Some(reduced) = &reduced {
            let clustered = bits(got) == bits(&reduced[port]);
            assert!(clustered, "{name}: out{port} differs without clusters");
        }
        worst = worst.max(error).max(portable_error);
    }
    worst
}

/// A rounded product is its f32 sum rounded once, also over a long k (the weight gradients'
/// and the LM-head loss's chunks, where cuBLASLt may split k). Every bf16 element rounds a
/// value within the error bound of an f32 sum in any order, `k · 2⁻²⁴ · Σ|a·b|`, of the exact
/// sum (f64: the bf16 products are exact there, the sum's rounding negligible): no wrong
/// sum. And at most 2% of the elements differ from the interpreter's: a split-k reduction in
/// bf16 (cuBLASLt's in-place and output-type schemes) rounds each partial sum and moves most
/// elements, which that loose bound would not see; another order of f32 sums moves about one
/// in a thousand (326 of 344064 at 384×896, k = 2048, on an H100), a sum that nearly cancels
/// by several bf16 steps.
#[test]
fn a_rounded_product_is_its_f32_sum_rounded_once() {
    let Some(device) = device() else { return };
    let mut rng = testing::rng("gpu_rounded_product");
    let bf16 = |v: f64| half::bf16::from_f64(v);
    for &(m, n, k) in &[(384, 896, 2048), (128, 896, 4096), (896, 128, 2048)] {
        let op = Op::Rounded(Box::new(Op::MatMul {
            transpose_a: true,
            transpose_b: false,
        }));
        let ins = [
            In::F(DType::BF16, vec![k, m]),
            In::F(DType::BF16, vec![k, n]),
        ];
        let (graph, values, _) = one_op(&mut rng, "rounded_product", (&op, &ins));
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &kiln_runtime::Workspaces::Cuda,
        )
        .unwrap();
        let want = interpret(&graph, &mut values.clone()).unwrap()["out0"]
            .to_f64_vec()
            .unwrap();
        // The exact sums and the f32 bound of each element (a stored [k, m], b [k, n]).
        let (a, b) = (
            values["in0"].to_f64_vec().unwrap(),
            values["in1"].to_f64_vec().unwrap(),
        );
        let mut exact = vec![(0.0f64, 0.0f64); m * n];
        for l in 0..k {
            for (at, sum) in exact.iter_mut().enumerate() {
                let p = a[l * m + at / n] * b[l * n + at % n];
                sum.0 += p;
                sum.1 += p.abs();
            }
        }
        let bound = k as f64 * f64::from(f32::EPSILON) / 2.0;
        for (what, options) in [
            ("cuBLASLt", LowerOptions::default()),
            ("the tiled GEMM", LowerOptions::portable()),
        ] {
            let run = (RunMode::Eager, options);
            let got = run_on_gpu(&device, (&graph, &planned), &values, run, 1)[0]
                .to_f64_vec()
                .unwrap();
            // g rounds some x in [sum - e, sum + e] iff it lies between the roundings of the
            // ends (rounding is monotone).
            let outside: Vec<usize> = (got.iter().zip(&exact).enumerate())
                .filter(|&(_, (&g, &(sum, magnitude)))| {
                    let (e, g) = (bound * magnitude, bf16(g));
                    !(bf16(sum - e) <= g && g <= bf16(sum + e))
                })
                .map(|(at, _)| at)
                .collect();
            let moved = (got.iter().zip(&want)).filter(|(g, w)| g != w).count();
            println!(
                "rounded product {m}x{n}, k = {k}, {what}: {moved} of {} elements differ from \
                 the interpreter's, {} outside the f32 sums' bound",
                got.len(),
                outside.len()
            );
            if let Some(&at) = outside.first() {
                let (sum, magnitude) = exact[at];
                panic!(
                    "{what} {m}x{n}x{k}: {} elements are no f32 sum rounded once; the first, \
                     ({}, {}), is {} for an exact sum of {sum:e} ± {:e}",
                    outside.len(),
                    at / n,
                    at % n,
                    got[at],
                    bound * magnitude
                );
            }
            assert!(
                moved * 50 <= got.len(),
                "{what} {m}x{n}x{k}: {moved} of {} elements moved (over 2%)",
                got.len()
            );
        }
    }
}

/// The q/k/v linear with the RoPE and cache epilogue (the `linear_rope` fusion) gives the bits
/// of its unfused ops on the device: the skinny linear, then `RopeKvWrite`'s kernel — the same
/// sums in the same order, the same bias adds and the same rotation (rope.cuh) — finished in
/// clusters at one row (0.5B's and 1.5B's layers) and by its reduce at eight rows.
#[test]
fn the_rope_epilogue_gives_the_bits_of_its_unfused_ops() {
    let Some(device) = device() else { return };
    let mut rng = testing::rng("gpu_rope_epilogue");
    let ty = |dtype, dims: &[usize]| TensorType::new(dtype, dims).unwrap();
    for &(b, k, hq, hkv, d) in &[
        (1, 896, 14, 2, 64),
        (8, 896, 14, 2, 64),
        (1, 1536, 12, 2, 128),
    ] {
        let (smax, bf16) = (64, DType::BF16);
        let mut graph = Graph::new("qkv");
        let mut values = BTreeMap::new();
        let mut inputs = BTreeMap::new();
        let specs = [
            ("x", InputKind::Input, ty(DType::F32, &[b, k])),
            ("wq", InputKind::Param, ty(bf16, &[hq * d, k])),
            ("wk", InputKind::Param, ty(bf16, &[hkv * d, k])),
            ("wv", InputKind::Param, ty(bf16, &[hkv * d, k])),
            ("bq", InputKind::Param, ty(bf16, &[hq * d])),
            ("bk", InputKind::Param, ty(bf16, &[hkv * d])),
            ("bv", InputKind::Param, ty(bf16, &[hkv * d])),
            ("k_cache", InputKind::Input, ty(bf16, &[b, hkv, smax, d])),
            ("v_cache", InputKind::Input, ty(bf16, &[b, hkv, smax, d])),
        ];
        for (name, kind, t) in specs {
            values.insert(name.to_string(), random(&mut rng, &t));
            inputs.insert(name, graph.input(name, kind, t).unwrap());
        }
        let positions = graph.input("positions", InputKind::Input, ty(DType::I64, &[b]));
        let positions = positions.unwrap();
        let ids = testing::indices(&mut rng, b, smax);
        values.insert("positions".into(), Tensor::from_vec(ids, [b]).unwrap());
        let view = |graph: &mut Graph, value, dims: &[usize]| {
            let shape = kiln_ir::Shape::new(dims);
            graph.op1(Op::Reshape { shape }, &[value]).unwrap()
        };
        let linear = Op::Linear {
            biases: vec![false, false, true],
            swiglu: false,
            add_rmsnorm: None,
            rope_kv: None,
        };
        let operands = ["x", "wq", "wk", "wv", "bv"].map(|name| inputs[name]);
        let ys = graph.op(linear, &operands).unwrap();
        let q = view(&mut graph, ys[0], &[b, 1, hq, d]);
        let k_new = view(&mut graph, ys[1], &[b, 1, hkv, d]);
        let v = view(&mut graph, ys[2], &[b, hkv, 1, d]);
        let rope_positions = view(&mut graph, positions, &[b, 1]);
        let mut rope_operands = vec![q, k_new, v, inputs["k_cache"], inputs["v_cache"]];
        rope_operands.extend([rope_positions, positions, inputs["bq"], inputs["bk"]]);
        let rope = Op::RopeKvWrite {
            theta: 1e6,
            bias: true,
            staged: None,
        };
        let written = graph.op(rope, &rope_operands).unwrap();
        for (port, value) in written.iter().enumerate() {
            graph.output(&format!("out{port}"), *value).unwrap();
        }
        let fused = kiln_ir::fuse(&graph).unwrap();
        let epilogues = (fused.node_indices())
            .filter(|&n| {
                let kind = fused.node(n).map(|n| &n.kind);
                matches!(
                    kind,
                    Some(kiln_ir::graph::NodeKind::Op(Op::Linear {
                        rope_kv: Some(_),
                        ..
                    }))
                )
            })
            .count();
        assert_eq!(epilogues, 1, "the rule fuses the pair");
        let options = LowerOptions {
            linear_rows: 32,
            ..LowerOptions::default()
        };
        let run = |graph: &Graph| {
            let workspaces = &kiln_runtime::Workspaces::Cuda;
            let planned = plan(graph, &PlanOptions::default(), workspaces).unwrap();
            let run = (RunMode::Graph, options);
            run_on_gpu(&device, (graph, &planned), &values, run, 3)
        };
        let (apart, together) = (run(&graph), run(&fused));
        for (port, (a, t)) in apart.iter().zip(&together).enumerate() {
            assert_eq!(bits(t), bits(a), "B={b} K={k} D={d}: out{port}");
        }
    }
}

/// The lowering options of an op case: fused linears of up to 32 rows on the skinny kernels
/// (the default too; the tiny programs check every linear on cuBLASLt); more rows, and a
/// rounded linear's, take cuBLASLt.
fn case_options(op: &Op, options: LowerOptions) -> LowerOptions {
    match op {
        Op::Linear { .. } => LowerOptions {
            linear_rows: 32,
            ..options
        },
        _ => options,
    }
}

/// What the CPU machine can check of every op case (CI has no GPU): each one-op program
/// plans for the CUDA backend, runs on the interpreter, and lowers for the device (CUDA's and
/// HIP's lowering: kernels of their modules, every address inside its slot). Not the GPU's
/// results: `every_op_matches_the_cpu_reference` below checks those where a GPU exists.
#[test]
fn every_op_case_plans_interprets_and_lowers_without_a_device() {
    let mut rng = testing::rng("gpu_op_cases_on_the_cpu");
    for (name, op, ins) in &op_cases::cases() {
        let (graph, mut values, _) = one_op(&mut rng, name, (op, ins));
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &kiln_runtime::Workspaces::Cuda,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        interpret(&graph, &mut values).unwrap_or_else(|e| panic!("{name}: {e}"));
        for options in [LowerOptions::default(), LowerOptions::portable()] {
            let options = case_options(op, options);
            let lowered = kiln_runtime::lower_for_device(&graph, &planned, options);
            lowered.unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}

#[test]
fn every_op_matches_the_cpu_reference() {
    let Some(device) = device() else { return };
    let mut rng = testing::rng("gpu_ops");
    // KILN_GPU_CASES=text keeps the cases whose name contains `text` (a device call that
    // checks one kernel family); unset, every case runs. The kept cases draw their random
    // inputs from the one stream in order, so they get other values than in the full run.
    let only = std::env::var("KILN_GPU_CASES").ok();
    let cases: Vec<_> = op_cases::cases()
        .into_iter()
        .filter(|(name, ..)| only.as_deref().is_none_or(|text| name.contains(text)))
        .collect();
    if let Some(text) = &only {
        println!("KILN_GPU_CASES={text}: {} cases", cases.len());
        assert!(!cases.is_empty(), "no op case's name contains {text:?}");
    }
    println!("{:<60} {:>12}", "op", "rel. error");
    for (name, op, ins) in &cases {
        let error = check_op(&device, &mut rng, name, (op, ins), None);
        println!("{name:<60} {error:>12.3e}");
    }
    // Every case with each special value, all run before any failure is reported.
    let mut failures = Vec::new();
    for special in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        for (name, op, ins) in &cases {
            let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_op(&device, &mut rng, name, (op, ins), Some(special))
            }));
            if let Err(panic) = checked {
                let text = (panic.downcast_ref::<String>().cloned()).unwrap_or_default();
                failures.push(text);
            }
        }
        println!(
            "{} cases with a {special} input: NaNs and infinities where the CPU has them, {} failures so far",
            cases.len(),
            failures.len()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
