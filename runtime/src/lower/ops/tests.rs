//! Lowering every op on synthetic placements: addresses stay inside the operands', results'
//! and workspace's bytes, in-place results skip their copies, strided operands are refused
//! with the operand named.

use kiln_ir::{AdamWConfig, DType, Layout, Op, Shape, TensorType};
use kiln_kernels::gpu::{Addr, Launch};

use super::{lower_op, LowerOptions};
use crate::error::Error;
use crate::lower::DeviceTensor;
use crate::placed::ValueLayout;
use crate::workspaces::Workspaces;
use kiln_planner::WorkspaceNeeds;

/// The fault word of the step being lowered: a slot of its own.
const FAULT: Addr = Addr {
    slot: 1000,
    offset: 0,
};

/// A contiguous tensor alone in slot `slot`, starting `offset` elements in.
fn placed(slot: u32, offset: usize, ty: &TensorType) -> DeviceTensor {
    let strides = ty.shape.contiguous_strides();
    let layout = ValueLayout {
        dtype: ty.dtype,
        layout: Layout::new(ty.shape.clone(), &strides, offset).unwrap(),
    };
    DeviceTensor {
        base: Addr { slot, offset: 256 },
        layout,
    }
}

fn ty(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims).unwrap()
}

/// Slot and byte range of a tensor's elements.
fn range(t: &DeviceTensor) -> (u32, u64, u64) {
    let start = t.addr().offset;
    (
        t.base.slot,
        start,
        start + (t.numel() * t.dtype.size_bytes()) as u64,
    )
}

/// Whether `[at, at + bytes)` lies inside one of `ranges`.
fn inside(ranges: &[(u32, u64, u64)], at: Addr, bytes: u64) -> bool {
    ranges.iter().any(|&(slot, start, end)| {
        slot == at.slot && at.offset >= start && at.offset + bytes <= end
    })
}

/// Lowers `op` on fresh placements of `operands` (operand k in slot k, results after them,
/// the workspace last) and checks every address of every launch.
fn lower_checked(op: &Op, operands: &[TensorType]) -> Vec<Launch> {
    let results = op.infer(operands).unwrap_or_else(|e| panic!("{op}: {e}"));
    let i: Vec<DeviceTensor> = operands
        .iter()
        .enumerate()
        .map(|(k, t)| placed(k as u32, 3, t))
        .collect();
    let o: Vec<DeviceTensor> = results
        .iter()
        .enumerate()
        .map(|(k, t)| placed((operands.len() + k) as u32, 0, t))
        .collect();
    let workspace_bytes = Workspaces::Cuda.workspace_bytes(op, operands);
    let workspace_slot = (operands.len() + results.len()) as u32;
    let workspace = (workspace_bytes > 0).then_some((
        Addr {
            slot: workspace_slot,
            offset: 512,
        },
        workspace_bytes,
    ));
    let launches = lower_op(op, &i, &o, workspace, FAULT, LowerOptions::default())
        .unwrap_or_else(|e| panic!("{op}: {e}"));
    let mut ranges: Vec<_> = i.iter().chain(&o).map(range).collect();
    if let Some((at, bytes)) = workspace {
        ranges.push((at.slot, at.offset, at.offset + bytes));
    }
    ranges.push((FAULT.slot, FAULT.offset, FAULT.offset + 4));
    for launch in &launches {
        for at in launch.addresses() {
            assert!(
                inside(&ranges, at, 1),
                "{op}: {at:?} of {launch:?} is outside"
            );
        }
        match launch {
            Launch::Copy { dst, src, bytes } => {
                assert!(inside(&ranges, *dst, *bytes), "{op}: copy dst {launch:?}");
                assert!(inside(&ranges, *src, *bytes), "{op}: copy src {launch:?}");
            }
            Launch::Gemm(g) => {
                let size = g.dtype.size_bytes();
                // The last element each operand's description reaches.
                let last = |stride: u64, ld: u64, rows: u64, cols: u64| {
                    ((g.batch - 1) * stride + (rows - 1) * ld + cols - 1) * size
                };
                let (ar, ac) = if g.transpose_a {
                    (g.k, g.m)
                } else {
                    (g.m, g.k)
                };
                let (br, bc) = if g.transpose_b {
                    (g.n, g.k)
                } else {
                    (g.k, g.n)
                };
                assert!(inside(&ranges, g.a, last(g.stride_a, g.lda, ar, ac) + size));
                assert!(inside(&ranges, g.b, last(g.stride_b, g.ldb, br, bc) + size));
                let c_last = ((g.batch - 1) * g.stride_c + (g.m - 1) * g.ldc + g.n - 1) * 4;
                assert!(inside(&ranges, g.c, c_last + 4), "{op}: C of {g:?}");
            }
            Launch::Kernel(_) => {}
            Launch::AllReduce { buffers } => {
                for &(src, dst, n) in buffers {
                    assert!(
                        inside(&ranges, src, n * 4),
                        "{op}: all_reduce src {launch:?}"
                    );
                    assert!(
                        inside(&ranges, dst, n * 4),
                        "{op}: all_reduce dst {launch:?}"
                    );
                }
            }
        }
    }
    launches
}

/// Small sizes from a fixed seed: the same on every run, different across ops.
struct Sizes(u64);

impl Sizes {
    fn next(&mut self, low: usize, high: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        low + (self.0 >> 33) as usize % (high - low + 1)
    }
}

const F32: DType = DType::F32;
const I64: DType = DType::I64;

fn adamw() -> Op {
    Op::AdamW(AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    })
}

#[test]
fn every_op_lowers_inside_its_buffers() {
    let mut sizes = Sizes(7);
    for _ in 0..4 {
        let (b, t, h, d) = (sizes.next(1, 3), sizes.next(1, 5), 4, 2 * sizes.next(1, 8));
        let kv_heads = 2;
        let s = t + sizes.next(0, 4);
        let (rows, hidden, vocab) = (b * t, sizes.next(1, 40), sizes.next(2, 50));
        let x = ty(F32, &[b, t, hidden]);
        let w = ty(F32, &[hidden]);
        let ids = ty(I64, &[b, t]);
        let cases: Vec<(Op, Vec<TensorType>)> = vec![
            (Op::Embedding, vec![ty(F32, &[vocab, hidden]), ids.clone()]),
            (
                Op::EmbeddingBackward { vocab, onto: false },
                vec![ids.clone(), x.clone()],
            ),
            (Op::Add, vec![x.clone(), w.clone()]),
            (Op::Mul, vec![x.clone(), x.clone()]),
            (Op::Scale { alpha: 0.3 }, vec![x.clone()]),
            (
                Op::SumToShape {
                    shape: Shape::new(&[hidden]),
                },
                vec![x.clone()],
            ),
            (
                Op::BroadcastTo {
                    shape: x.shape.clone(),
                },
                vec![w.clone()],
            ),
            (Op::Cast { to: DType::BF16 }, vec![x.clone()]),
            (Op::Cast { to: F32 }, vec![ty(DType::BF16, &[rows, hidden])]),
            (Op::Cast { to: F32 }, vec![x.clone()]),
            (Op::RmsNorm { eps: 1e-6 }, vec![x.clone(), w.clone()]),
            (
                Op::RmsNormBackward { eps: 1e-6 },
                vec![x.clone(), w.clone(), x.clone()],
            ),
            (
                Op::AddRmsNorm { eps: 1e-6 },
                vec![x.clone(), x.clone(), w.clone()],
            ),
            (
                Op::AddRmsNormBackward { eps: 1e-6 },
                vec![x.clone(), w.clone(), x.clone()],
            ),
            (
                Op::AddRmsNormBackward { eps: 1e-6 },
                vec![x.clone(), w.clone(), x.clone(), x.clone()],
            ),
            (
                Op::Rope {
                    theta: 1e4,
                    bias: true,
                },
                vec![ty(F32, &[b, t, h, d]), ids.clone(), ty(F32, &[h * d])],
            ),
            (
                Op::RopeBackward { theta: 1e4 },
                vec![ty(F32, &[b, h, t, d]), ids.clone()],
            ),
            (
                Op::Attention { scale: 0.1 },
                vec![
                    ty(F32, &[b, h, t, d]),
                    ty(F32, &[b, kv_heads, s, d]),
                    ty(F32, &[b, kv_heads, s, d]),
                ],
            ),
            (
                Op::AttentionBackward { scale: 0.1 },
                vec![
                    ty(F32, &[b, h, t, d]),
                    ty(F32, &[b, kv_heads, s, d]),
                    ty(F32, &[b, kv_heads, s, d]),
                    ty(F32, &[b, h, t, s]),
                    ty(F32, &[b, t, h, d]),
                ],
            ),
            (
                Op::CachedAttention { scale: 0.1 },
                vec![
                    ty(F32, &[b, h, t, d]),
                    ty(F32, &[b, kv_heads, s + 3, d]),
                    ty(F32, &[b, kv_heads, s + 3, d]),
                    ty(I64, &[b]),
                ],
            ),
            (
                Op::KvCacheWrite,
                vec![
                    ty(F32, &[b, kv_heads, s + 3, d]),
                    ty(F32, &[b, kv_heads, t, d]),
                    ty(I64, &[b]),
                ],
            ),
            (Op::SwiGlu, vec![x.clone(), x.clone()]),
            (Op::SwiGluBackward, vec![x.clone(), x.clone(), x.clone()]),
            (Op::Softmax, vec![x.clone()]),
            (Op::SoftmaxBackward, vec![x.clone(), x.clone()]),
            (
                Op::CrossEntropy { ignore_index: -100 },
                vec![ty(F32, &[rows, vocab]), ty(I64, &[rows])],
            ),
            (
                Op::CrossEntropyBackward { ignore_index: -100 },
                vec![ty(F32, &[rows, vocab]), ty(I64, &[rows]), ty(F32, &[])],
            ),
            (
                adamw(),
                vec![
                    x.clone(),
                    x.clone(),
                    x.clone(),
                    x.clone(),
                    ty(I64, &[]),
                    ty(DType::F64, &[]),
                ],
            ),
            (
                adamw(),
                vec![
                    x.clone(),
                    x.clone(),
                    x.clone(),
                    x.clone(),
                    ty(I64, &[]),
                    ty(DType::F64, &[]),
                    ty(F32, &[]),
                ],
            ),
            (
                Op::ClipGradNorm { max_norm: 1.0 },
                vec![x.clone(), w.clone(), ty(F32, &[vocab, 3000])],
            ),
            (Op::AllReduce, vec![x.clone(), w.clone()]),
            (Op::Contiguous, vec![x.clone()]),
            (
                Op::MatMul {
                    transpose_a: false,
                    transpose_b: true,
                },
                vec![ty(F32, &[rows, hidden]), ty(F32, &[vocab, hidden])],
            ),
            (
                Op::MatMul {
                    transpose_a: true,
                    transpose_b: false,
                },
                vec![
                    ty(DType::BF16, &[b, hidden, t]),
                    ty(DType::BF16, &[b, hidden, vocab]),
                ],
            ),
        ];
        for (op, operands) in &cases {
            let launches = lower_checked(op, operands);
            assert!(!launches.is_empty(), "{op} launched nothing");
        }
    }
}

#[test]
fn attention_gemms_lie_inside_their_buffers_for_every_head_layout() {
    // [B, Hq, Hkv, T, S, D]: MHA, GQA, MQA, a cached prefix, one row, no query, no head dim.
    let shapes = [
        [2, 3, 3, 4, 4, 8],
        [2, 12, 2, 9, 9, 16],
        [3, 4, 1, 2, 7, 4],
        [1, 1, 1, 1, 1, 1],
        [2, 4, 2, 0, 3, 5],
        [1, 2, 1, 3, 4, 0],
    ];
    for [b, hq, hkv, t, s, d] in shapes {
        let q = ty(F32, &[b, hq, t, d]);
        let kv = ty(F32, &[b, hkv, s, d]);
        let forward = lower_checked(
            &Op::Attention { scale: 0.1 },
            &[q.clone(), kv.clone(), kv.clone()],
        );
        let gemms = forward
            .iter()
            .filter(|l| matches!(l, Launch::Gemm(_)))
            .count();
        // Scores in one GEMM, then one per (batch, kv head) for out.
        let want = if t == 0 || d == 0 { 0 } else { 1 + b * hkv };
        assert_eq!(gemms, want, "forward {b} {hq} {hkv} {t} {s} {d}");
        let backward = [
            q.clone(),
            kv.clone(),
            kv.clone(),
            ty(F32, &[b, hq, t, s]),
            ty(F32, &[b, t, hq, d]),
        ];
        let launches = lower_checked(&Op::AttentionBackward { scale: 0.1 }, &backward);
        let gemms = launches
            .iter()
            .filter(|l| matches!(l, Launch::Gemm(_)))
            .count();
        assert_eq!(
            gemms,
            if t == 0 || d == 0 { 0 } else { 4 },
            "backward {b} {hq} {hkv} {t} {s} {d}"
        );
    }
}

#[test]
fn in_place_results_skip_their_copies() {
    let cache = ty(F32, &[2, 2, 8, 4]);
    let operands = [cache.clone(), ty(F32, &[2, 2, 1, 4]), ty(I64, &[2])];
    let i: Vec<DeviceTensor> = operands
        .iter()
        .enumerate()
        .map(|(k, t)| placed(k as u32, 0, t))
        .collect();
    let fresh = placed(9, 0, &cache);
    let copied = lower_op(
        &Op::KvCacheWrite,
        &i,
        &[fresh],
        None,
        FAULT,
        LowerOptions::default(),
    )
    .unwrap();
    assert!(matches!(copied[0], Launch::Copy { .. }) && copied.len() == 2);
    let in_place = lower_op(
        &Op::KvCacheWrite,
        &i,
        &i[..1],
        None,
        FAULT,
        LowerOptions::default(),
    )
    .unwrap();
    assert_eq!(in_place.len(), 1, "only the new rows: {in_place:?}");
    assert!(matches!(in_place[0], Launch::Kernel(_)));

    let p = ty(F32, &[3, 5]);
    let operands = [
        p.clone(),
        p.clone(),
        p.clone(),
        p.clone(),
        ty(I64, &[]),
        ty(DType::F64, &[]),
    ];
    let i: Vec<DeviceTensor> = operands
        .iter()
        .enumerate()
        .map(|(k, t)| placed(k as u32, 0, t))
        .collect();
    let results = [i[0].clone(), i[2].clone(), i[3].clone()];
    let launches = lower_op(&adamw(), &i, &results, None, FAULT, LowerOptions::default()).unwrap();
    assert_eq!(launches.len(), 1, "no copies in place: {launches:?}");
    let fresh: Vec<DeviceTensor> = (0..3).map(|k| placed(10 + k, 0, &p)).collect();
    let launches = lower_op(&adamw(), &i, &fresh, None, FAULT, LowerOptions::default()).unwrap();
    assert_eq!(
        launches.len(),
        4,
        "three copies then the update: {launches:?}"
    );
}

/// `t` viewed with its last two dims swapped (as a Transpose op's result).
fn transposed(t: &DeviceTensor) -> DeviceTensor {
    let mut view = t.clone();
    let rank = view.rank();
    view.layout.layout = t.transpose(rank - 2, rank - 1).unwrap();
    view
}

#[test]
fn strided_operands_are_refused_by_name_except_by_contiguous_and_matmul() {
    let a = transposed(&placed(0, 0, &ty(F32, &[4, 6])));
    let b = placed(1, 0, &ty(F32, &[4]));
    let out = placed(2, 0, &ty(F32, &[6, 4]));
    let err = lower_op(
        &Op::Add,
        &[a.clone(), b],
        std::slice::from_ref(&out),
        None,
        FAULT,
        LowerOptions::default(),
    )
    .unwrap_err();
    match err {
        Error::Unsupported {
            backend, reason, ..
        } => {
            assert_eq!(backend, "cuda");
            assert!(
                reason.contains("`a`") && reason.contains("[1, 6]"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    // Contiguous runs the strided copy kernel.
    let launches = lower_op(
        &Op::Contiguous,
        std::slice::from_ref(&a),
        &[out],
        None,
        FAULT,
        LowerOptions::default(),
    )
    .unwrap();
    assert!(matches!(&launches[..], [Launch::Kernel(k)] if k.function == "strided_copy_b32"));
    // MatMul flips the transpose flag of a transposed view: a^T [6,4] · w [4,5].
    let w = placed(1, 0, &ty(F32, &[4, 5]));
    let c = placed(2, 0, &ty(F32, &[6, 5]));
    let op = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let launches = lower_op(&op, &[a, w], &[c], None, FAULT, LowerOptions::default()).unwrap();
    match &launches[..] {
        [Launch::Gemm(g)] => {
            assert!(g.transpose_a && !g.transpose_b);
            assert_eq!((g.m, g.n, g.k, g.lda, g.ldb, g.ldc), (6, 5, 4, 6, 5, 5));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn views_have_no_kernel() {
    let a = placed(0, 0, &ty(F32, &[2, 3]));
    let op = Op::Transpose { dim0: 0, dim1: 1 };
    let err = lower_op(
        &op,
        std::slice::from_ref(&a),
        &[transposed(&a)],
        None,
        FAULT,
        LowerOptions::default(),
    );
    assert!(matches!(err, Err(Error::Unsupported { .. })));
}

#[test]
fn linear_takes_the_skinny_kernel_up_to_its_row_limit_and_the_gemm_beyond() {
    let op = Op::Linear {
        biases: vec![false, true],
        swiglu: true,
        add_rmsnorm: None,
        rope_kv: None,
    };
    let lower = |rows: usize, limit: u64| {
        let x = placed(0, 0, &ty(F32, &[rows, 64]));
        let gate = placed(1, 0, &ty(DType::BF16, &[96, 64]));
        let up = placed(2, 0, &ty(DType::BF16, &[96, 64]));
        let bias = placed(3, 0, &ty(DType::BF16, &[96]));
        let out = placed(4, 0, &ty(F32, &[rows, 96]));
        let workspace = Some((Addr { slot: 5, offset: 0 }, 1 << 20));
        let options = LowerOptions {
            linear_rows: limit,
            ..LowerOptions::default()
        };
        lower_op(&op, &[x, gate, up, bias], &[out], workspace, FAULT, options).unwrap()
    };
    let skinny = lower(4, 8);
    assert!(skinny
        .iter()
        .all(|l| matches!(l, Launch::Kernel(k) if k.module.starts_with("linear"))));
    // Beyond the limit: cast x, two GEMMs, the bias, SwiGLU.
    let gemm = lower(12, 8);
    let gemms = gemm.iter().filter(|l| matches!(l, Launch::Gemm(_))).count();
    assert_eq!((gemm.len(), gemms), (5, 2), "{gemm:?}");
    assert_eq!(
        lower(4, 0).len(),
        5,
        "limit 0 sends every linear to the GEMM"
    );
}

#[test]
fn the_norm_epilogue_is_the_reduce_with_split_k_else_the_norm_in_place() {
    let op = Op::Linear {
        biases: vec![true],
        swiglu: false,
        add_rmsnorm: Some(1e-6),
        rope_kv: None,
    };
    let lower = |rows: usize, k: usize, limit: u64| {
        let x = placed(0, 0, &ty(F32, &[rows, k]));
        let w = placed(1, 0, &ty(DType::BF16, &[96, k]));
        let bias = placed(2, 0, &ty(DType::BF16, &[96]));
        let residual = placed(3, 0, &ty(F32, &[rows, 1, 96]));
        let weight = placed(4, 0, &ty(DType::BF16, &[96]));
        let sum = placed(5, 0, &ty(F32, &[rows, 1, 96]));
        let normed = placed(6, 0, &ty(F32, &[rows, 1, 96]));
        let workspace = Some((Addr { slot: 7, offset: 0 }, 1 << 20));
        let options = LowerOptions {
            linear_rows: limit,
            ..LowerOptions::default()
        };
        let operands = [x, w, bias, residual, weight];
        lower_op(&op, &operands, &[sum, normed], workspace, FAULT, options).unwrap()
    };
    let functions = |launches: &[Launch]| -> Vec<&'static str> {
        (launches.iter())
            .map(|l| match l {
                Launch::Kernel(k) => k.function,
                Launch::Gemm(_) => "gemm",
                other => panic!("{other:?}"),
            })
            .collect()
    };
    // k = 4096 splits; k = 64 does not; 12 rows take the GEMM (cast, GEMM, bias, norm).
    let split = lower(1, 4096, 8);
    assert_eq!(
        functions(&split),
        ["linear_r1", "linear_reduce_add_rmsnorm_bf16"]
    );
    assert_eq!(
        functions(&lower(4, 64, 8)),
        ["linear_mma_r8", "add_rmsnorm_f32_bf16"]
    );
    let gemm = lower(12, 64, 8);
    assert_eq!(
        functions(&gemm),
        [
            "cast_f32_to_bf16_vec4",
            "gemm",
            "add_f32_bf16_vec4",
            "add_rmsnorm_f32_bf16"
        ]
    );
    // The reduce writes the sum and the norm (slots 5, 6) and reads the residual (slot 3).
    let Launch::Kernel(reduce) = &split[1] else {
        unreachable!()
    };
    let slots: Vec<u32> = (reduce.args.iter())
        .filter_map(|a| match a {
            kiln_kernels::gpu::Arg::Ptr(at) => Some(at.slot),
            _ => None,
        })
        .collect();
    assert_eq!(slots, [5, 6, 7, 2, 3, 4]);
}
