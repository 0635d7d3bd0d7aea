//! The one-op cases of `every_op_matches_the_cpu_reference`: every op at several shapes, the
//! bf16 stored-operand variants and the fused linear's kernel paths.

use kiln_ir::{AdamWConfig, DType, EmbeddingRows, Op};

use super::{f, In};

/// (name, op, operands) of every case.
pub(crate) fn cases() -> Vec<(String, Op, Vec<In>)> {
    let adamw = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mm = |a, b| Op::MatMul {
        transpose_a: a,
        transpose_b: b,
    };
    let bf = |dims: &[usize]| In::F(DType::BF16, dims.to_vec());
    let rounded = |op| Op::Rounded(Box::new(op));
    let also_rounded = |op| Op::AlsoRounded(Box::new(op));
    let mut cases: Vec<(String, Op, Vec<In>)> = Vec::new();
    for &(b, t, h) in &[(1, 1, 64), (2, 7, 96), (3, 33, 896)] {
        let n = b * t;
        let s = format!("B={b} T={t} H={h}");
        cases.extend([
            (
                format!("embedding {s}"),
                Op::Embedding,
                vec![f(&[50, h]), In::Ids(vec![b, t], 50)],
            ),
            (
                format!("embedding_backward {s}"),
                Op::EmbeddingBackward {
                    vocab: 50,
                    onto: false,
                },
                vec![In::Ids(vec![b, t], 50), f(&[b, t, h])],
            ),
            // A tied embedding's gradient: the scatter onto the LM head's, f32 or bf16.
            (
                format!("embedding_backward onto {s}"),
                Op::EmbeddingBackward {
                    vocab: 50,
                    onto: true,
                },
                vec![In::Ids(vec![b, t], 50), f(&[b, t, h]), f(&[50, h])],
            ),
            (
                format!("embedding_backward onto bf16 {s}"),
                Op::EmbeddingBackward {
                    vocab: 50,
                    onto: true,
                },
                vec![In::Ids(vec![b, t], 50), f(&[b, t, h]), bf(&[50, h])],
            ),
            (
                format!("matmul NT {s}"),
                mm(false, true),
                vec![f(&[n, h]), f(&[80, h])],
            ),
            (
                format!("matmul NN batched {s}"),
                mm(false, false),
                vec![f(&[b, t, h]), f(&[b, h, 24])],
            ),
            (
                format!("matmul TN {s}"),
                mm(true, false),
                vec![f(&[n, h]), f(&[n, 40])],
            ),
            (
                format!("matmul bf16 NT {s}"),
                mm(false, true),
                vec![bf(&[n, h]), bf(&[72, h])],
            ),
            (
                format!("add bf16 term {s}"),
                Op::Add,
                vec![f(&[b, t, h]), bf(&[b, t, h])],
            ),
            // Mixed precision's sums of two rounded gradients, both read widened.
            (
                format!("add bf16 terms {s}"),
                Op::Add,
                vec![bf(&[b, t, h]), bf(&[b, t, h])],
            ),
            (
                format!("add bf16 first term {s}"),
                Op::Add,
                vec![bf(&[b, t, h]), f(&[h])],
            ),
            (
                format!("rounded_matmul NN {s}"),
                rounded(mm(false, false)),
                vec![bf(&[n, h]), bf(&[h, 24])],
            ),
            (
                format!("rounded_matmul TN {s}"),
                rounded(mm(true, false)),
                vec![bf(&[n, h]), bf(&[n, 40])],
            ),
            (format!("argmax {s}"), Op::Argmax, vec![f(&[b, t, h])]),
            (
                format!("add {s}"),
                Op::Add,
                vec![f(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("add bias {s}"),
                Op::Add,
                vec![f(&[b, t, h]), f(&[h])],
            ),
            // Stored operands in bf16 (bf16 inference): weights, biases, tables.
            (
                format!("embedding bf16 table {s}"),
                Op::Embedding,
                vec![bf(&[50, h]), In::Ids(vec![b, t], 50)],
            ),
            (
                format!("add bf16 bias {s}"),
                Op::Add,
                vec![f(&[b, t, h]), bf(&[h])],
            ),
            (
                format!("rmsnorm bf16 weight {s}"),
                Op::RmsNorm { eps: 1e-6 },
                vec![f(&[b, t, h]), bf(&[h])],
            ),
            (
                format!("add_rmsnorm bf16 weight {s}"),
                Op::AddRmsNorm { eps: 1e-6 },
                vec![f(&[b, t, h]), f(&[b, t, h]), bf(&[h])],
            ),
            // Mixed precision's: the normed rows rounded for the GEMMs they feed.
            (
                format!("rounded_rmsnorm {s}"),
                rounded(Op::RmsNorm { eps: 1e-6 }),
                vec![f(&[b, t, h]), f(&[h])],
            ),
            (
                format!("rounded_add_rmsnorm {s}"),
                rounded(Op::AddRmsNorm { eps: 1e-6 }),
                vec![f(&[b, t, h]), f(&[b, t, h]), f(&[h])],
            ),
            (
                format!("rounded_add_rmsnorm bf16 weight {s}"),
                rounded(Op::AddRmsNorm { eps: 1e-6 }),
                vec![f(&[b, t, h]), f(&[b, t, h]), bf(&[h])],
            ),
            (
                format!("mul {s}"),
                Op::Mul,
                vec![f(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("scale {s}"),
                Op::Scale { alpha: 0.37 },
                vec![f(&[b, t, h])],
            ),
            (
                format!("sum_to_shape {s}"),
                Op::SumToShape { shape: [h].into() },
                vec![f(&[b, t, h])],
            ),
            (
                format!("broadcast_to {s}"),
                Op::BroadcastTo {
                    shape: [b, t, h].into(),
                },
                vec![f(&[h])],
            ),
            (
                format!("cast to bf16 {s}"),
                Op::Cast { to: DType::BF16 },
                vec![f(&[b, t, h])],
            ),
            (
                format!("cast to f32 {s}"),
                Op::Cast { to: DType::F32 },
                vec![bf(&[b, t, h])],
            ),
            // A dense copy rounded, and both ways (the strided ones: v made head-major and its
            // gradient token-major again in the mixed-precision train programs).
            (
                format!("rounded_contiguous {s}"),
                rounded(Op::Contiguous),
                vec![f(&[b, t, h])],
            ),
            (
                format!("also_rounded_contiguous {s}"),
                also_rounded(Op::Contiguous),
                vec![f(&[b, t, h])],
            ),
            (
                format!("rmsnorm {s}"),
                Op::RmsNorm { eps: 1e-6 },
                vec![f(&[b, t, h]), f(&[h])],
            ),
            (
                format!("rmsnorm_backward {s}"),
                Op::RmsNormBackward { eps: 1e-6 },
                vec![f(&[b, t, h]), f(&[h]), f(&[b, t, h])],
            ),
            (
                format!("add_rmsnorm {s}"),
                Op::AddRmsNorm { eps: 1e-6 },
                vec![f(&[b, t, h]), f(&[b, t, h]), f(&[h])],
            ),
            (
                format!("add_rmsnorm_backward {s}"),
                Op::AddRmsNormBackward { eps: 1e-6 },
                vec![f(&[b, t, h]), f(&[h]), f(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("add_rmsnorm_backward no grad_sum {s}"),
                Op::AddRmsNormBackward { eps: 1e-6 },
                vec![f(&[b, t, h]), f(&[h]), f(&[b, t, h])],
            ),
            // Mixed precision's: the input gradient rounded for the GEMMs, and kept in f32 too
            // where the residual stream reads it.
            (
                format!("also_rounded_add_rmsnorm_backward {s}"),
                also_rounded(Op::AddRmsNormBackward { eps: 1e-6 }),
                vec![f(&[b, t, h]), f(&[h]), f(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("rounded_add_rmsnorm_backward {s}"),
                rounded(Op::AddRmsNormBackward { eps: 1e-6 }),
                vec![f(&[b, t, h]), f(&[h]), f(&[b, t, h])],
            ),
            (
                format!("also_rounded_rmsnorm_backward {s}"),
                also_rounded(Op::RmsNormBackward { eps: 1e-6 }),
                vec![f(&[b, t, h]), f(&[h]), f(&[b, t, h])],
            ),
            (
                format!("swiglu {s}"),
                Op::SwiGlu,
                vec![f(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("swiglu_backward {s}"),
                Op::SwiGluBackward,
                vec![f(&[b, t, h]), f(&[b, t, h]), f(&[b, t, h])],
            ),
            // Mixed precision's: a rounded gradient in, results rounded for the next GEMMs.
            (
                format!("swiglu_backward bf16 grad {s}"),
                Op::SwiGluBackward,
                vec![f(&[b, t, h]), f(&[b, t, h]), bf(&[b, t, h])],
            ),
            (
                format!("rounded_swiglu {s}"),
                rounded(Op::SwiGlu),
                vec![f(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("rounded_swiglu_backward {s}"),
                rounded(Op::SwiGluBackward),
                vec![f(&[b, t, h]), f(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("rounded_swiglu_backward bf16 grad {s}"),
                rounded(Op::SwiGluBackward),
                vec![f(&[b, t, h]), f(&[b, t, h]), bf(&[b, t, h])],
            ),
            // `bf16-swiglu`: gate and up are rounded GEMM products, widened as read.
            (
                format!("swiglu bf16 gate and up {s}"),
                Op::SwiGlu,
                vec![bf(&[b, t, h]), bf(&[b, t, h])],
            ),
            (
                format!("rounded_swiglu bf16 gate and up {s}"),
                rounded(Op::SwiGlu),
                vec![bf(&[b, t, h]), bf(&[b, t, h])],
            ),
            (
                format!("swiglu_backward bf16 gate and up {s}"),
                Op::SwiGluBackward,
                vec![bf(&[b, t, h]), bf(&[b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("rounded_swiglu_backward bf16 gate, up and grad {s}"),
                rounded(Op::SwiGluBackward),
                vec![bf(&[b, t, h]), bf(&[b, t, h]), bf(&[b, t, h])],
            ),
            (format!("softmax {s}"), Op::Softmax, vec![f(&[b, t, h])]),
            (
                format!("softmax_backward {s}"),
                Op::SoftmaxBackward,
                vec![In::Pos(vec![b, t, h]), f(&[b, t, h])],
            ),
            (
                format!("cross_entropy {s}"),
                Op::CrossEntropy { ignore_index: -100 },
                vec![f(&[n, h]), In::Ids(vec![n], h)],
            ),
            (
                format!("cross_entropy_backward {s}"),
                Op::CrossEntropyBackward { ignore_index: -100 },
                vec![f(&[n, h]), In::Ids(vec![n], h), f(&[])],
            ),
        ]);
        // AdamW with an f32 gradient and with a bf16 one (mixed precision's rounded weight
        // gradients), plain and clipped; and the update that writes a bf16 copy too.
        let updates = [(DType::F32, ""), (DType::BF16, " bf16 grad")].map(|(grad, kind)| {
            [(Op::AdamW(adamw), ""), (Op::AdamWCopy(adamw), " copy")]
                .map(|(op, copy)| (grad, kind, op, copy))
        });
        for (grad, kind, op, copy) in updates.into_iter().flatten() {
            let operands = |rate: f64| {
                let mut operands = vec![
                    f(&[t, h]),
                    In::F(grad, vec![t, h]),
                    f(&[t, h]),
                    In::Pos(vec![t, h]),
                ];
                if matches!(op, Op::AdamWCopy(_)) {
                    operands.push(bf(&[t, h]));
                }
                operands.extend([In::Step, In::Scalar(DType::F64, rate)]);
                operands
            };
            let mut clipped = operands(3e-3);
            clipped.push(In::Scalar(DType::F32, 0.37));
            cases.extend([
                (format!("adamw{copy}{kind} {s}"), op.clone(), operands(1e-2)),
                (format!("adamw{copy}{kind} clipped {s}"), op, clipped),
            ]);
        }
    }
    // Column sums of many rows, split over chunks of rows (2, 7, 16 and 19 chunks, the last
    // shorter in the second): the bias gradients and the norms' weight gradients.
    for &(rows, h) in &[(300, 896), (1000, 96), (2048, 128), (4096, 896)] {
        let s = format!("rows={rows} H={h}");
        cases.extend([
            (
                format!("sum_to_shape {s}"),
                Op::SumToShape { shape: [h].into() },
                vec![f(&[rows, h])],
            ),
            (
                format!("rmsnorm_backward {s}"),
                Op::RmsNormBackward { eps: 1e-6 },
                vec![f(&[rows, h]), f(&[h]), f(&[rows, h])],
            ),
            (
                format!("add_rmsnorm_backward {s}"),
                Op::AddRmsNormBackward { eps: 1e-6 },
                vec![f(&[rows, h]), f(&[h]), f(&[rows, h]), f(&[rows, h])],
            ),
        ]);
    }
    // Norm rows on each side of their kernels' cut (norm.cu): held in registers up to 2048
    // columns (eight values a thread), the loop past it.
    for &(rows, h) in &[(9, 1000), (3, 2048), (2, 2049), (3, 5000)] {
        let s = format!("rows={rows} H={h}");
        cases.extend([
            (
                format!("rmsnorm {s}"),
                Op::RmsNorm { eps: 1e-6 },
                vec![f(&[rows, h]), f(&[h])],
            ),
            (
                format!("rounded_add_rmsnorm bf16 weight {s}"),
                rounded(Op::AddRmsNorm { eps: 1e-6 }),
                vec![f(&[rows, h]), f(&[rows, h]), bf(&[h])],
            ),
            (
                format!("add_rmsnorm_backward {s}"),
                Op::AddRmsNormBackward { eps: 1e-6 },
                vec![f(&[rows, h]), f(&[h]), f(&[rows, h]), f(&[rows, h])],
            ),
            (
                format!("also_rounded_rmsnorm_backward {s}"),
                also_rounded(Op::RmsNormBackward { eps: 1e-6 }),
                vec![f(&[rows, h]), f(&[h]), f(&[rows, h])],
            ),
        ]);
    }
    // Gradient clipping: one gradient, several of odd sizes, and one split into many partials.
    for grads in [
        vec![f(&[5])],
        vec![f(&[7]), f(&[33, 65]), f(&[2049])],
        vec![f(&[3, 300_001])],
    ] {
        let sizes: Vec<String> = grads
            .iter()
            .map(|g| match g {
                In::F(_, dims) => format!("{dims:?}"),
                _ => unreachable!("gradients are f32"),
            })
            .collect();
        cases.push((
            format!("clip_grad_norm {}", sizes.join(" ")),
            Op::ClipGradNorm { max_norm: 1.0 },
            grads,
        ));
    }
    // More tokens than the embedding backward's window (4096): an id's sum goes on in the
    // next window, in token order.
    for onto in [false, true] {
        let mut operands = vec![In::Ids(vec![2, 4500], 7), f(&[2, 4500, 40])];
        if onto {
            operands.push(bf(&[7, 40]));
        }
        let op = Op::EmbeddingBackward { vocab: 7, onto };
        cases.push((
            format!("embedding_backward onto={onto} [2,4500]"),
            op,
            operands,
        ));
    }
    // An embedding table's update from its scatter (no gradient table), its unnamed rows and
    // its named rows: without a base, onto
    // an f32 or a bf16 one, with a bf16 copy or not; ids naming most rows of a small table and
    // few of a large one; past the scatter's window; a hidden size the vectors do not divide.
    let bases = [None, Some(DType::F32), Some(DType::BF16)];
    let rows = [EmbeddingRows::Unnamed, EmbeddingRows::Named];
    let sizes = [
        (50, 64, vec![2, 7]),
        (3000, 96, vec![3, 33]),
        (7, 40, vec![2, 4500]),
    ];
    let odd = [(11, 3, vec![9])];
    for ((vocab, h, ids), base) in sizes
        .into_iter()
        .chain(odd)
        .flat_map(|s| bases.map(|b| (s.clone(), b)))
    {
        for (copy, rows) in [false, true].into_iter().flat_map(|c| rows.map(|r| (c, r))) {
            let mut operands = vec![f(&[vocab, h]), f(&[vocab, h]), In::Pos(vec![vocab, h])];
            if copy {
                operands.push(bf(&[vocab, h]));
            }
            operands.extend([In::Step, In::Scalar(DType::F64, 1e-2)]);
            operands.push(In::Ids(ids.clone(), vocab));
            if rows == EmbeddingRows::Named {
                let mut grad = ids.clone();
                grad.push(h);
                operands.push(f(&grad));
            }
            operands.extend(base.map(|dtype| In::F(dtype, vec![vocab, h])));
            let op = Op::EmbeddingAdamW {
                config: adamw,
                onto: base.is_some(),
                copy,
                rows,
            };
            let base = base.map_or("none".to_string(), |d| d.to_string());
            cases.push((
                format!(
                    "embedding_adamw rows={rows} base={base} copy={copy} [{vocab},{h}] ids {ids:?}"
                ),
                op,
                operands,
            ));
        }
    }
    // Odd element counts: the scalar kernels (the cases above take the vector ones).
    cases.extend([
        (
            "rounded_swiglu [3,5]".to_string(),
            rounded(Op::SwiGlu),
            vec![f(&[3, 5]), f(&[3, 5])],
        ),
        (
            "rounded_swiglu_backward bf16 grad [3,5]".to_string(),
            rounded(Op::SwiGluBackward),
            vec![f(&[3, 5]), f(&[3, 5]), bf(&[3, 5])],
        ),
        (
            "rounded_swiglu bf16 gate and up [3,5]".to_string(),
            rounded(Op::SwiGlu),
            vec![bf(&[3, 5]), bf(&[3, 5])],
        ),
        (
            "rounded_swiglu_backward bf16 gate, up and grad [3,5]".to_string(),
            rounded(Op::SwiGluBackward),
            vec![bf(&[3, 5]), bf(&[3, 5]), bf(&[3, 5])],
        ),
        (
            "adamw_copy bf16 grad [3,5]".to_string(),
            Op::AdamWCopy(adamw),
            vec![
                f(&[3, 5]),
                bf(&[3, 5]),
                f(&[3, 5]),
                In::Pos(vec![3, 5]),
                bf(&[3, 5]),
                In::Step,
                In::Scalar(DType::F64, 1e-2),
            ],
        ),
        (
            "cast to bf16 [3,5]".to_string(),
            Op::Cast { to: DType::BF16 },
            vec![f(&[3, 5])],
        ),
        (
            "cast to f32 [3,5]".to_string(),
            Op::Cast { to: DType::F32 },
            vec![bf(&[3, 5])],
        ),
        (
            "cast_into bf16 [3,5]".to_string(),
            Op::CastInto,
            vec![bf(&[3, 5]), f(&[3, 5])],
        ),
    ]);
    // D = 6: the cached attention stages its rows element by element (no 16-byte vectors).
    for &(b, t, hq, hkv, d) in &[
        (1, 3, 3, 1, 6),
        (1, 1, 2, 1, 16),
        (2, 5, 4, 2, 32),
        (1, 40, 14, 2, 64),
        (2, 9, 12, 2, 128),
    ] {
        let s = format!("B={b} T={t} Hq={hq} Hkv={hkv} D={d}");
        let smax = t + 6;
        let scale = 1.0 / (d as f64).sqrt();
        cases.extend([
            (
                format!("rope {s}"),
                Op::Rope {
                    theta: 1e6,
                    bias: false,
                },
                vec![f(&[b, t, hq, d]), In::Ids(vec![b, t], 4096)],
            ),
            (
                format!("rope bias {s}"),
                Op::Rope {
                    theta: 1e4,
                    bias: true,
                },
                vec![f(&[b, t, hkv, d]), In::Ids(vec![b, t], 4096), f(&[hkv * d])],
            ),
            (
                format!("rope bf16 bias {s}"),
                Op::Rope {
                    theta: 1e4,
                    bias: true,
                },
                vec![
                    f(&[b, t, hkv, d]),
                    In::Ids(vec![b, t], 4096),
                    bf(&[hkv * d]),
                ],
            ),
            // Mixed precision's q and k, written rounded for FlashAttention.
            (
                format!("rounded_rope {s}"),
                rounded(Op::Rope {
                    theta: 1e6,
                    bias: false,
                }),
                vec![f(&[b, t, hq, d]), In::Ids(vec![b, t], 4096)],
            ),
            (
                format!("rounded_rope bf16 bias {s}"),
                rounded(Op::Rope {
                    theta: 1e4,
                    bias: true,
                }),
                vec![
                    f(&[b, t, hkv, d]),
                    In::Ids(vec![b, t], 4096),
                    bf(&[hkv * d]),
                ],
            ),
            (
                format!("rope_backward {s}"),
                Op::RopeBackward { theta: 1e6 },
                vec![f(&[b, hq, t, d]), In::Ids(vec![b, t], 4096)],
            ),
            (
                format!("rounded_rope_backward {s}"),
                rounded(Op::RopeBackward { theta: 1e6 }),
                vec![f(&[b, hq, t, d]), In::Ids(vec![b, t], 4096)],
            ),
            (
                format!("also_rounded_rope_backward {s}"),
                also_rounded(Op::RopeBackward { theta: 1e6 }),
                vec![f(&[b, hq, t, d]), In::Ids(vec![b, t], 4096)],
            ),
            (
                format!("attention {s}"),
                Op::Attention { scale },
                vec![f(&[b, hq, t, d]), f(&[b, hkv, t, d]), f(&[b, hkv, t, d])],
            ),
            (
                format!("attention_backward {s}"),
                Op::AttentionBackward { scale },
                vec![
                    f(&[b, hq, t, d]),
                    f(&[b, hkv, t, d]),
                    f(&[b, hkv, t, d]),
                    In::Pos(vec![b, hq, t, t]),
                    f(&[b, t, hq, d]),
                ],
            ),
            (
                format!("cached_attention {s}"),
                Op::CachedAttention { scale },
                vec![
                    f(&[b, hq, t, d]),
                    f(&[b, hkv, smax, d]),
                    f(&[b, hkv, smax, d]),
                    In::Ids(vec![b], smax - t + 1),
                ],
            ),
            (
                format!("cached_attention bf16 caches {s}"),
                Op::CachedAttention { scale },
                vec![
                    f(&[b, hq, t, d]),
                    bf(&[b, hkv, smax, d]),
                    bf(&[b, hkv, smax, d]),
                    In::Ids(vec![b], smax - t + 1),
                ],
            ),
            (
                format!("kv_cache_write bf16 cache {s}"),
                Op::KvCacheWrite,
                vec![
                    bf(&[b, hkv, smax, d]),
                    f(&[b, hkv, t, d]),
                    In::Ids(vec![b], smax - t + 1),
                ],
            ),
            (
                format!("kv_cache_write {s}"),
                Op::KvCacheWrite,
                vec![
                    f(&[b, hkv, smax, d]),
                    f(&[b, hkv, t, d]),
                    In::Ids(vec![b], smax - t + 1),
                ],
            ),
            // A pool of b + 3 slots, b of them named.
            (
                format!("cached_attention pooled bf16 caches {s}"),
                Op::CachedAttention { scale },
                vec![
                    f(&[b, hq, t, d]),
                    bf(&[b + 3, hkv, smax, d]),
                    bf(&[b + 3, hkv, smax, d]),
                    In::Ids(vec![b], smax - t + 1),
                    In::Slots(b, b + 3),
                ],
            ),
            (
                format!("kv_cache_write pooled {s}"),
                Op::KvCacheWrite,
                vec![
                    f(&[b + 3, hkv, smax, d]),
                    f(&[b, hkv, t, d]),
                    In::Ids(vec![b], smax - t + 1),
                    In::Slots(b, b + 3),
                ],
            ),
        ]);
        // The fused RoPE + KV-cache write, plain and staged (bf16 inference's prefill: token-major
        // v, f16 rows of q, k and v for FlashAttention beside the caches): bf16 caches and biases
        // in a pool, f32 without biases, and f32 caches with bf16 biases.
        for staged in [None, Some(DType::F16)] {
            let v = match staged {
                Some(_) => f(&[b, t, hkv, d]),
                None => f(&[b, hkv, t, d]),
            };
            let prefix = if staged.is_some() {
                "rope_kv_write staged"
            } else {
                "rope_kv_write"
            };
            let forms = [
                ("pooled bf16 ", 1e6, true, true),
                ("", 1e4, false, false),
                ("bf16 biases ", 1e4, false, true),
            ];
            for (form, theta, pooled, bias) in forms {
                let cache = match pooled {
                    true => bf(&[b + 3, hkv, smax, d]),
                    false => f(&[b, hkv, smax, d]),
                };
                let mut ins = vec![f(&[b, t, hq, d]), f(&[b, t, hkv, d]), v.clone()];
                ins.extend([cache.clone(), cache]);
                ins.extend([In::Ids(vec![b, t], 4096), In::Ids(vec![b], smax - t + 1)]);
                ins.extend(pooled.then(|| In::Slots(b, b + 3)));
                ins.extend(
                    bias.then(|| [bf(&[hq * d]), bf(&[hkv * d])])
                        .into_iter()
                        .flatten(),
                );
                let op = Op::RopeKvWrite {
                    theta,
                    bias,
                    staged,
                };
                cases.push((format!("{prefix} {form}{s}"), op, ins));
            }
        }
    }
    // Cached attention over caches of several key chunks (64 rows for D ≤ 64, 32 for 128):
    // positions anywhere in the cache, so chunks below, at and above each row's position, the
    // last one partial; the models' GQA ratios (Qwen2.5-0.5B 7, DeepSeek-1.5B 6), heads of 16
    // to 128 dims, staged by 16-byte vectors in both dtypes (the D = 6 cases above take the
    // element path); groups of 1 to 16 query heads.
    for &(b, t, hq, hkv, d, smax) in &[
        (3, 1, 14, 2, 64, 300),
        (2, 2, 12, 2, 128, 100),
        (4, 1, 4, 4, 16, 150),
        (2, 3, 8, 1, 32, 200),
        (2, 1, 16, 1, 64, 130),
        (3, 2, 4, 4, 128, 70),
        (5, 1, 9, 1, 64, 64),
        // 16 chunks (the bench's 1024-row cache), and 35: the combine's loads past its first
        // round of 16 chunks.
        (1, 1, 14, 2, 64, 1024),
        (2, 1, 12, 2, 128, 1100),
    ] {
        let s = format!("B={b} T={t} Hq={hq} Hkv={hkv} D={d} Smax={smax}");
        let scale = 1.0 / (d as f64).sqrt();
        for dtype in [DType::F32, DType::BF16] {
            cases.push((
                format!("cached_attention {dtype:?} caches {s}"),
                Op::CachedAttention { scale },
                vec![
                    f(&[b, hq, t, d]),
                    In::F(dtype, vec![b, hkv, smax, d]),
                    In::F(dtype, vec![b, hkv, smax, d]),
                    In::Ids(vec![b], smax - t + 1),
                ],
            ));
        }
    }
    // The LM head with its loss over vocabulary chunks: one chunk, and two (the second
    // partial) where N·V·4 bytes pass the chunk budget; f32 and bf16 operands. The backward
    // takes a random lse: its kernels compute the same function of any operands. Both in one
    // (`linear_cross_entropy_grad`) goes over chunks of rows: one, and two where N·V·4 bytes
    // pass `FUSED_LOGITS_BYTES` (the last case, 600 rows each).
    for &(n, h, v, dtype) in &[
        (1, 8, 50, DType::F32),
        (7, 24, 300, DType::F32),
        (33, 64, 1000, DType::BF16),
        (600, 16, 30_000, DType::F32),
        (300, 32, 60_000, DType::BF16),
        (1200, 16, 151_936, DType::BF16),
    ] {
        let s = format!("N={n} H={h} V={v} {dtype}");
        let operands = || {
            vec![
                In::F(dtype, vec![n, h]),
                In::F(dtype, vec![v, h]),
                In::Ids(vec![n], v),
            ]
        };
        let mut both = operands();
        both.push(f(&[]));
        cases.push((
            format!("linear_cross_entropy_grad {s}"),
            Op::LinearCrossEntropyGrad { ignore_index: -100 },
            both,
        ));
        if v > 100_000 {
            continue; // the vocabulary chunks are checked at the sizes above
        }
        let mut backward = operands();
        backward.extend([f(&[n]), f(&[])]);
        cases.extend([
            (
                format!("linear_cross_entropy {s}"),
                Op::LinearCrossEntropy { ignore_index: -100 },
                operands(),
            ),
            (
                format!("linear_cross_entropy_backward {s}"),
                Op::LinearCrossEntropyBackward { ignore_index: -100 },
                backward,
            ),
        ]);
    }
    // FlashAttention: one and several tiles of 64 rows, T not a multiple of the tile, keys
    // after a prefix (T < S), GQA ratios 1 and > 1, head dims padded (5, 24, 40, 72) and
    // exact (16, 64, 128). The backward takes random out and lse: its kernels compute the same
    // function of any operands. The forward runs in two warp groups below 132 blocks
    // (B·Hq·⌈T/64⌉) and in one from there: the last five cases (168, 132, 168, 144 and 140
    // blocks; head dims 64, 128, 24 padded to 32, 16, and 40 padded to 64).
    for &(b, hq, hkv, t, keys, d) in &[
        (1, 2, 2, 1, 1, 64),
        (1, 3, 1, 2, 9, 5),
        (2, 4, 2, 37, 37, 16),
        (1, 14, 2, 100, 100, 64),
        (1, 6, 6, 70, 133, 24),
        (2, 4, 1, 65, 65, 128),
        (1, 12, 2, 130, 130, 128),
        (1, 4, 2, 50, 50, 40),
        (1, 4, 4, 90, 97, 72),
        (2, 12, 2, 390, 390, 64),
        (1, 12, 2, 700, 760, 128),
        (2, 12, 2, 390, 400, 24),
        (1, 12, 4, 720, 720, 16),
        (1, 14, 7, 600, 620, 40),
    ] {
        let s = format!("B={b} Hq={hq} Hkv={hkv} T={t} S={keys} D={d}");
        let scale = 1.0 / (d as f64).sqrt();
        // q, k, v and grad_out in f32, or given as their bf16 roundings (mixed precision's
        // rounded RoPE and output gradient): read where they are at exact head dims, staged
        // otherwise.
        let operand = |dtype, dims: &[usize]| In::F(dtype, dims.to_vec());
        let qkv = |dtype| {
            let kv = [b, hkv, keys, d];
            vec![
                operand(dtype, &[b, hq, t, d]),
                operand(dtype, &kv),
                operand(dtype, &kv),
            ]
        };
        let backward = |dtype| {
            let mut operands = qkv(dtype);
            let saved = [
                f(&[b, t, hq, d]),
                f(&[b, hq, t]),
                operand(dtype, &[b, t, hq, d]),
            ];
            operands.extend(saved);
            operands
        };
        let flash = |rounding| Op::FlashAttention { scale, rounding };
        cases.extend([
            (
                format!("flash_attention {s}"),
                flash(DType::BF16),
                qkv(DType::F32),
            ),
            (
                format!("flash_attention_backward {s}"),
                Op::FlashAttentionBackward { scale },
                backward(DType::F32),
            ),
            (
                format!("flash_attention bf16 operands {s}"),
                flash(DType::BF16),
                qkv(DType::BF16),
            ),
            // The output rounded for the o GEMM (prefill), and both ways (training, whose
            // backward reads the f32 output).
            (
                format!("rounded_flash_attention {s}"),
                rounded(flash(DType::BF16)),
                qkv(DType::F32),
            ),
            (
                format!("also_rounded_flash_attention bf16 operands {s}"),
                also_rounded(flash(DType::BF16)),
                qkv(DType::BF16),
            ),
            // The forward rounding to f16 (bf16 inference's prefill), its output in f32 and
            // rounded for the o GEMM.
            (
                format!("flash_attention f16 {s}"),
                flash(DType::F16),
                qkv(DType::F32),
            ),
            (
                format!("rounded_flash_attention f16 {s}"),
                rounded(flash(DType::F16)),
                qkv(DType::F32),
            ),
            // Its operands given as f16 rows (the staged RoPE + KV write's): read where they
            // are at exact head dims, copied to the padded rows otherwise.
            (
                format!("rounded_flash_attention f16 operands {s}"),
                rounded(flash(DType::F16)),
                qkv(DType::F16),
            ),
            (
                format!("flash_attention_backward bf16 operands {s}"),
                Op::FlashAttentionBackward { scale },
                backward(DType::BF16),
            ),
        ]);
    }
    // The fused linear: the skinny kernels' row buckets (1 row on CUDA cores, 2 to 32 on
    // tensor cores), split k, k not a multiple of 16, groups, biases, SwiGLU, a bf16 input,
    // and shapes the kernels refuse (33 rows, k not a multiple of 8), which take cuBLASLt.
    type LinearCase<'a> = (usize, usize, &'a [usize], &'a [bool], bool, DType);
    let linear_cases: [LinearCase; 15] = [
        (1, 64, &[40], &[false], false, DType::F32),
        (2, 136, &[24, 40], &[true, false], false, DType::F32),
        (24, 1000, &[56], &[true], false, DType::F32),
        (32, 896, &[112, 112], &[false, false], true, DType::BF16),
        (3, 96, &[56, 8, 8], &[false, false, true], false, DType::F32),
        (8, 128, &[72, 72], &[true, false], true, DType::F32),
        (16, 64, &[24], &[true], false, DType::BF16),
        (
            5,
            896,
            &[896, 128, 128],
            &[false, false, true],
            false,
            DType::F32,
        ),
        (1, 4864, &[896], &[false], false, DType::F32),
        // One row with 3 to 12 splits: finished in clusters (portable and not), a last tile
        // part past the columns.
        (
            1,
            896,
            &[896, 128, 128],
            &[true, true, true],
            false,
            DType::BF16,
        ),
        (1, 896, &[4864, 4864], &[false, false], true, DType::F32),
        (
            1,
            1536,
            &[1536, 256, 256],
            &[true, true, false],
            false,
            DType::F32,
        ),
        (1, 640, &[200, 72], &[false, true], false, DType::F32),
        (33, 64, &[40, 40], &[false, false], true, DType::F32),
        (2, 36, &[20], &[true], false, DType::F32),
    ];
    for (m, k, widths, biases, swiglu, x_dtype) in linear_cases {
        let mut ins = vec![In::F(x_dtype, vec![m, k])];
        ins.extend(widths.iter().map(|&n| In::W(DType::BF16, vec![n, k])));
        let biased = widths.iter().zip(biases).filter(|(_, &b)| b);
        ins.extend(biased.map(|(&n, _)| bf(&[n])));
        let op = Op::Linear {
            biases: biases.to_vec(),
            swiglu,
            add_rmsnorm: None,
            rope_kv: None,
        };
        let name = format!(
            "linear M={m} K={k} N={widths:?} biases={biases:?} swiglu={swiglu} x {x_dtype}"
        );
        cases.push((name, op, ins));
    }
    // The q/k/v linear with the RoPE and cache epilogue, bf16 caches in a pool: one row finished
    // in clusters (0.5B's and 1.5B's layers, k and v biased as the rotation biases them), on
    // tensor cores by linear_reduce_rope (8 rows), one split (y written as the partial sums),
    // two tokens a row (T = 2: v viewed head-major across them), a head of 256 (no cluster
    // finish: a pair may leave its tile), f32 caches and rows past the skinny kernels (the plain
    // linear, then the RopeKvWrite kernel).
    for &(b, t, k, hq, hkv, d, bias, cache_dtype) in &[
        (1, 1, 896, 14, 2, 64, true, DType::BF16),
        (1, 1, 1536, 12, 2, 128, true, DType::BF16),
        (8, 1, 896, 14, 2, 64, true, DType::BF16),
        (3, 1, 64, 4, 2, 16, false, DType::BF16),
        (2, 2, 256, 4, 2, 32, true, DType::BF16),
        (1, 1, 512, 2, 1, 256, false, DType::BF16),
        (2, 1, 128, 4, 2, 32, true, DType::F32),
        (40, 1, 128, 6, 2, 16, true, DType::BF16),
    ] {
        let (m, smax) = (b * t, 40);
        let mut ins = vec![f(&[m, k])];
        ins.extend([hq, hkv, hkv].map(|h| In::W(DType::BF16, vec![h * d, k])));
        ins.extend([hq, hkv].into_iter().filter(|_| bias).map(|h| bf(&[h * d])));
        ins.push(bf(&[hkv * d]));
        let cache = In::F(cache_dtype, vec![b + 3, hkv, smax, d]);
        ins.extend([cache.clone(), cache]);
        ins.extend([In::Ids(vec![b, t], 4096), In::Ids(vec![b], smax - t + 1)]);
        ins.push(In::Slots(b, b + 3));
        let op = Op::Linear {
            biases: vec![bias, bias, true],
            swiglu: false,
            add_rmsnorm: None,
            rope_kv: Some(1e6),
        };
        let name = format!(
            "linear rope_kv B={b} T={t} K={k} Hq={hq} Hkv={hkv} D={d} q/k bias={bias} caches {cache_dtype}"
        );
        cases.push((name, op, ins));
    }
    // The residual add + RMSNorm epilogue: one split and several (the fused reduce, or a
    // cluster finish before the norm past 1024 columns), on CUDA cores and tensor cores, more
    // columns than a block's threads, bf16 and f32 norm weights, and rows past the skinny
    // kernels (the vendor GEMM, then the norm in place).
    let norm_cases: [(usize, usize, usize, bool, DType); 7] = [
        (1, 896, 896, false, DType::BF16),
        (1, 1536, 1536, true, DType::F32), // 12 splits finished in clusters, then the norm
        (1, 4864, 896, true, DType::BF16),
        (8, 4864, 1536, false, DType::F32),
        (3, 128, 64, true, DType::BF16),
        (32, 896, 2100, false, DType::BF16),
        (40, 256, 96, true, DType::F32),
    ];
    for (m, k, n, bias, norm_dtype) in norm_cases {
        let mut ins = vec![f(&[m, k]), In::W(DType::BF16, vec![n, k])];
        ins.extend(bias.then(|| bf(&[n])));
        ins.extend([f(&[m, 1, n]), In::F(norm_dtype, vec![n])]);
        let op = Op::Linear {
            biases: vec![bias],
            swiglu: false,
            add_rmsnorm: Some(1e-6),
            rope_kv: None,
        };
        let name = format!("linear add_rmsnorm M={m} K={k} N={n} bias={bias} weight {norm_dtype}");
        if m > kiln_ir::UNROUNDED_LINEAR_MAX_ROWS {
            // The normed rows rounded for the next linear (prefill), from a bf16 input too.
            let mut bf16_in = ins.clone();
            bf16_in[0] = bf(&[m, k]);
            cases.push((format!("rounded_{name}"), rounded(op.clone()), ins.clone()));
            cases.push((
                format!("rounded_{name} x bf16"),
                rounded(op.clone()),
                bf16_in,
            ));
        }
        cases.push((name, op, ins));
    }
    // The SwiGLU result rounded for the down linear (decode's rows past 16, on cuBLASLt though
    // the skinny kernels take that many; prefill's rows), from f32 and bf16 inputs.
    for (m, k, n, x_dtype) in [
        (24, 128, 72, DType::BF16),
        (33, 64, 40, DType::F32),
        (70, 96, 136, DType::BF16),
    ] {
        let mut ins = vec![In::F(x_dtype, vec![m, k])];
        ins.extend([
            In::W(DType::BF16, vec![n, k]),
            In::W(DType::BF16, vec![n, k]),
        ]);
        let op = Op::Linear {
            biases: vec![false, false],
            swiglu: true,
            add_rmsnorm: None,
            rope_kv: None,
        };
        let name = format!("rounded_linear M={m} K={k} N={n} swiglu x {x_dtype}");
        cases.push((name, rounded(op), ins));
    }
    cases
}
