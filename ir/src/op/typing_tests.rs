//! Type rule tests: for every op, accepted operands with their exact result types, and rejected
//! operands with the error variant, the op and the operand port the error names.

// `&[x.clone()]` reads as the operand list it is; `slice::from_ref(&x)` would not.
#![allow(clippy::cloned_ref_to_slice_refs)]

use crate::{AdamWConfig, DType, EmbeddingRows, Error, Op, Shape, TensorType};

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims).unwrap()
}

fn i64t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::I64, dims).unwrap()
}

fn ty(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims).unwrap()
}

#[track_caller]
fn accepts(op: Op, operands: &[TensorType], results: &[TensorType]) {
    assert_eq!(op.infer(operands), Ok(results.to_vec()), "{op}");
}

/// A `Type` error for operand `port` whose message names the op and the port.
#[track_caller]
fn rejects_operand(op: Op, operands: &[TensorType], port: usize) {
    let err = op.infer(operands).expect_err(&op.to_string());
    match &err {
        Error::Type {
            op: name, port: p, ..
        } => {
            assert_eq!(
                (name.as_str(), *p),
                (op.to_string().as_str(), port),
                "{err}"
            )
        }
        other => panic!("{op}: expected a type error on operand {port}, got {other:?}"),
    }
    let message = err.to_string();
    assert!(message.starts_with(op.name()), "{message}");
    assert!(message.contains(&format!("operand {port} ")), "{message}");
}

/// An `Arity` error whose message names the op and the expected count.
#[track_caller]
fn rejects_arity(op: Op, operands: &[TensorType], expected: &str) {
    let err = op.infer(operands).expect_err(&op.to_string());
    assert!(
        matches!(&err, Error::Arity { op: name, expected: e, got } if *name == op.to_string() && e == expected && *got == operands.len()),
        "{err:?}"
    );
    assert!(err.to_string().starts_with(op.name()), "{err}");
}

/// An `Attribute` error whose message names the op and contains `fragment`.
#[track_caller]
fn rejects_attribute(op: Op, operands: &[TensorType], fragment: &str) {
    let err = op.infer(operands).expect_err(&op.to_string());
    assert!(matches!(&err, Error::Attribute { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.starts_with(op.name()), "{message}");
    assert!(message.contains(fragment), "`{fragment}` not in: {message}");
}

#[test]
fn embedding() {
    let (w, ids) = (f32t(&[10, 4]), i64t(&[2, 3]));
    accepts(
        Op::Embedding,
        &[w.clone(), ids.clone()],
        &[f32t(&[2, 3, 4])],
    );
    rejects_operand(Op::Embedding, &[w.clone(), f32t(&[2, 3])], 1);
    rejects_operand(Op::Embedding, &[f32t(&[10]), ids.clone()], 0);
    rejects_arity(Op::Embedding, &[w], "2");
}

#[test]
fn embedding_backward() {
    let op = || Op::EmbeddingBackward {
        vocab: 10,
        onto: false,
    };
    let ids = i64t(&[2, 3]);
    accepts(op(), &[ids.clone(), f32t(&[2, 3, 4])], &[f32t(&[10, 4])]);
    rejects_operand(op(), &[ids.clone(), f32t(&[2, 5, 4])], 1);
    rejects_operand(op(), &[f32t(&[2, 3]), f32t(&[2, 3, 4])], 0);
    // Onto a base of the result's type, or bf16 (stored), and nothing else.
    let onto = Op::EmbeddingBackward {
        vocab: 10,
        onto: true,
    };
    let grad = f32t(&[2, 3, 4]);
    for base in [f32t(&[10, 4]), ty(DType::BF16, &[10, 4])] {
        let operands = [ids.clone(), grad.clone(), base];
        accepts(onto.clone(), &operands, &[f32t(&[10, 4])]);
    }
    rejects_operand(onto.clone(), &[ids.clone(), grad.clone(), f32t(&[9, 4])], 2);
    rejects_arity(onto, &[ids, grad], "3");
}

fn matmul(transpose_a: bool, transpose_b: bool) -> Op {
    Op::MatMul {
        transpose_a,
        transpose_b,
    }
}

#[test]
fn matmul_transpose_flags_and_bf16() {
    let (a, b) = (f32t(&[2, 3, 4]), f32t(&[2, 4, 5]));
    accepts(matmul(false, false), &[a.clone(), b], &[f32t(&[2, 3, 5])]);
    accepts(
        matmul(true, false),
        &[f32t(&[2, 4, 3]), f32t(&[2, 4, 5])],
        &[f32t(&[2, 3, 5])],
    );
    accepts(
        matmul(false, true),
        &[f32t(&[3, 4]), f32t(&[5, 4])],
        &[f32t(&[3, 5])],
    );
    accepts(
        matmul(true, true),
        &[f32t(&[4, 3]), f32t(&[5, 4])],
        &[f32t(&[3, 5])],
    );
    let bf16 = |dims: &[usize]| ty(DType::BF16, dims);
    accepts(
        matmul(false, false),
        &[bf16(&[3, 4]), bf16(&[4, 5])],
        &[f32t(&[3, 5])],
    );
    // The same operands with the wrong flag: inner dims 4 and 5 disagree.
    rejects_operand(matmul(false, false), &[f32t(&[3, 4]), f32t(&[5, 4])], 1);
    rejects_operand(matmul(false, false), &[f32t(&[3, 4]), bf16(&[4, 5])], 1);
    rejects_operand(matmul(false, false), &[a.clone(), f32t(&[3, 4, 5])], 1);
    rejects_operand(matmul(false, false), &[f32t(&[4]), f32t(&[4])], 0);
    rejects_operand(matmul(false, false), &[i64t(&[3, 4]), i64t(&[4, 5])], 0);
}

#[test]
fn add_and_mul_broadcast_a_suffix() {
    for op in [Op::Add, Op::Mul] {
        let a = f32t(&[2, 3, 4]);
        for b in [&[4][..], &[3, 4], &[2, 3, 4]] {
            accepts(op.clone(), &[a.clone(), f32t(b)], &[a.clone()]);
        }
        rejects_operand(op.clone(), &[a.clone(), f32t(&[3])], 1);
        rejects_operand(op.clone(), &[a.clone(), f32t(&[2, 3])], 1);
        rejects_operand(op.clone(), &[a.clone(), ty(DType::F64, &[4])], 1);
        rejects_operand(op.clone(), &[f32t(&[4]), a.clone()], 1);
        rejects_operand(op, &[i64t(&[4]), i64t(&[4])], 0);
    }
}

#[test]
fn scale_softmax_and_contiguous_keep_the_type() {
    let x = ty(DType::F64, &[2, 5]);
    accepts(Op::Scale { alpha: 0.5 }, &[x.clone()], &[x.clone()]);
    accepts(Op::Softmax, &[x.clone()], &[x.clone()]);
    accepts(Op::Contiguous, &[i64t(&[2, 3])], &[i64t(&[2, 3])]);
    rejects_operand(Op::Scale { alpha: 0.5 }, &[i64t(&[2])], 0);
    rejects_operand(Op::Softmax, &[ty(DType::I32, &[2])], 0);
    rejects_arity(Op::Scale { alpha: 0.5 }, &[x.clone(), x], "1");
    rejects_arity(Op::Contiguous, &[], "1");
}

#[test]
fn sum_to_shape_and_broadcast_to() {
    let sum = || Op::SumToShape {
        shape: Shape::new(&[4]),
    };
    let broadcast = || Op::BroadcastTo {
        shape: Shape::new(&[2, 3, 4]),
    };
    accepts(sum(), &[f32t(&[2, 3, 4])], &[f32t(&[4])]);
    accepts(broadcast(), &[f32t(&[3, 4])], &[f32t(&[2, 3, 4])]);
    rejects_attribute(sum(), &[f32t(&[4, 3])], "[4] is not a suffix of [4,3]");
    rejects_attribute(broadcast(), &[f32t(&[2, 4])], "[2,4] is not a suffix");
    rejects_operand(sum(), &[i64t(&[2, 4])], 0);
    rejects_operand(broadcast(), &[i64t(&[4])], 0);
}

#[test]
fn cast_is_float_to_float() {
    let to_bf16 = || Op::Cast { to: DType::BF16 };
    accepts(to_bf16(), &[f32t(&[2, 3])], &[ty(DType::BF16, &[2, 3])]);
    rejects_operand(to_bf16(), &[i64t(&[2, 3])], 0);
    rejects_operand(Op::Cast { to: DType::I32 }, &[f32t(&[2, 3])], 0);
}

#[test]
fn rmsnorm_and_its_backward() {
    let (x, w) = (f32t(&[2, 4]), f32t(&[4]));
    accepts(
        Op::RmsNorm { eps: 1e-6 },
        &[x.clone(), w.clone()],
        &[x.clone()],
    );
    rejects_operand(Op::RmsNorm { eps: 1e-6 }, &[x.clone(), f32t(&[3])], 1);
    rejects_operand(Op::RmsNorm { eps: 1e-6 }, &[f32t(&[]), w.clone()], 0);
    let backward = || Op::RmsNormBackward { eps: 1e-6 };
    accepts(
        backward(),
        &[x.clone(), w.clone(), x.clone()],
        &[x.clone(), w.clone()],
    );
    rejects_operand(backward(), &[x, w, f32t(&[2, 3])], 2);
}

#[test]
fn add_rmsnorm_and_its_backward_with_3_and_4_operands() {
    let (x, w) = (f32t(&[2, 4]), f32t(&[4]));
    let forward = || Op::AddRmsNorm { eps: 1e-6 };
    accepts(
        forward(),
        &[x.clone(), x.clone(), w.clone()],
        &[x.clone(), x.clone()],
    );
    rejects_operand(forward(), &[x.clone(), f32t(&[1, 4]), w.clone()], 1);
    rejects_operand(forward(), &[x.clone(), x.clone(), f32t(&[2])], 2);
    let backward = || Op::AddRmsNormBackward { eps: 1e-6 };
    let results = [x.clone(), w.clone()];
    accepts(backward(), &[x.clone(), w.clone(), x.clone()], &results);
    accepts(
        backward(),
        &[x.clone(), w.clone(), x.clone(), x.clone()],
        &results,
    );
    rejects_operand(
        backward(),
        &[x.clone(), w.clone(), x.clone(), f32t(&[4])],
        3,
    );
    rejects_arity(backward(), &[x.clone(), w.clone()], "3 or 4");
    rejects_arity(
        backward(),
        &[x.clone(), w, x.clone(), x.clone(), x],
        "3 or 4",
    );
}

fn rope(bias: bool) -> Op {
    Op::Rope {
        theta: 10000.0,
        bias,
    }
}

#[test]
fn rope_with_and_without_bias() {
    let (x, pos) = (f32t(&[1, 3, 2, 4]), i64t(&[1, 3]));
    let out = f32t(&[1, 2, 3, 4]);
    accepts(rope(false), &[x.clone(), pos.clone()], &[out.clone()]);
    accepts(rope(true), &[x.clone(), pos.clone(), f32t(&[8])], &[out]);
    rejects_operand(rope(false), &[f32t(&[1, 3, 2, 5]), pos.clone()], 0);
    rejects_operand(rope(false), &[x.clone(), i64t(&[3])], 1);
    rejects_operand(rope(false), &[x.clone(), f32t(&[1, 3])], 1);
    rejects_operand(rope(true), &[x.clone(), pos.clone(), f32t(&[4])], 2);
    rejects_arity(rope(true), &[x, pos], "3");
}

#[test]
fn rope_backward() {
    let op = || Op::RopeBackward { theta: 10000.0 };
    let grad = f32t(&[1, 2, 3, 4]);
    accepts(op(), &[grad.clone(), i64t(&[1, 3])], &[f32t(&[1, 3, 2, 4])]);
    rejects_operand(op(), &[grad, i64t(&[1, 2])], 1);
}

#[test]
fn attention_with_grouped_query_heads() {
    let op = || Op::Attention { scale: 0.5 };
    let (q, kv) = (f32t(&[1, 4, 3, 8]), f32t(&[1, 2, 5, 8]));
    accepts(
        op(),
        &[q.clone(), kv.clone(), kv.clone()],
        &[f32t(&[1, 3, 4, 8]), f32t(&[1, 4, 3, 5])],
    );
    // 3 kv heads do not divide 4 query heads.
    let three_heads = f32t(&[1, 3, 5, 8]);
    rejects_operand(op(), &[q.clone(), three_heads.clone(), three_heads], 1);
    // S = 2 keys for T = 3 queries.
    let short = f32t(&[1, 2, 2, 8]);
    rejects_operand(op(), &[q.clone(), short.clone(), short], 1);
    let no_heads = f32t(&[1, 0, 5, 8]);
    rejects_operand(op(), &[q.clone(), no_heads.clone(), no_heads], 1);
    rejects_operand(op(), &[q, kv, f32t(&[1, 2, 5, 4])], 2);
}

#[test]
fn attention_backward() {
    let op = || Op::AttentionBackward { scale: 0.5 };
    let (q, kv) = (f32t(&[1, 4, 3, 8]), f32t(&[1, 2, 5, 8]));
    let (probs, grad) = (f32t(&[1, 4, 3, 5]), f32t(&[1, 3, 4, 8]));
    let forward = [q.clone(), kv.clone(), kv.clone()];
    let with = |probs: &TensorType, grad: &TensorType| {
        let mut operands = forward.to_vec();
        operands.extend([probs.clone(), grad.clone()]);
        operands
    };
    accepts(op(), &with(&probs, &grad), &forward);
    rejects_operand(op(), &with(&f32t(&[1, 4, 3, 4]), &grad), 3);
    rejects_operand(op(), &with(&probs, &f32t(&[1, 4, 3, 8])), 4);
}

#[test]
fn flash_attention_keeps_the_log_sum_exp_not_the_probabilities() {
    let op = || Op::FlashAttention {
        scale: 0.5,
        rounding: DType::BF16,
    };
    let (q, kv) = (f32t(&[1, 4, 3, 8]), f32t(&[1, 2, 5, 8]));
    let forward = [q.clone(), kv.clone(), kv.clone()];
    let (out, lse) = (f32t(&[1, 3, 4, 8]), f32t(&[1, 4, 3]));
    accepts(op(), &forward, &[out.clone(), lse.clone()]);
    let short = f32t(&[1, 2, 2, 8]);
    rejects_operand(op(), &[q.clone(), short.clone(), short], 1);
    // The contract is f32 activations rounded inside: f64 operands are refused.
    let wide = |dims: &[usize]| ty(DType::F64, dims);
    rejects_operand(
        op(),
        &[
            wide(&[1, 4, 3, 8]),
            wide(&[1, 2, 5, 8]),
            wide(&[1, 2, 5, 8]),
        ],
        0,
    );

    let backward = || Op::FlashAttentionBackward { scale: 0.5 };
    let with = |saved: [&TensorType; 3]| {
        let mut operands = forward.to_vec();
        operands.extend(saved.into_iter().cloned());
        operands
    };
    accepts(backward(), &with([&out, &lse, &out]), &forward);
    rejects_operand(backward(), &with([&lse, &lse, &out]), 3);
    rejects_operand(backward(), &with([&out, &f32t(&[1, 4, 3, 5]), &out]), 4);
    rejects_operand(backward(), &with([&out, &lse, &f32t(&[1, 4, 3, 8])]), 5);
    assert!(backward().infer(&with([&out, &lse, &out])[..5]).is_err());

    // Rounding to f16 takes f32 or f16 operands (a bf16 one is not its f16 rounding, nor an
    // f16 one the bf16 rounding), and nothing but bf16 or f16 is a rounding.
    let rounding = |rounding| Op::FlashAttention {
        scale: 0.5,
        rounding,
    };
    accepts(rounding(DType::F16), &forward, &[out.clone(), lse.clone()]);
    let bf16_k = [q.clone(), ty(DType::BF16, &[1, 2, 5, 8]), kv.clone()];
    accepts(op(), &bf16_k, &[out.clone(), lse.clone()]);
    rejects_operand(rounding(DType::F16), &bf16_k, 1);
    let f16_v = [q.clone(), kv.clone(), ty(DType::F16, &[1, 2, 5, 8])];
    accepts(rounding(DType::F16), &f16_v, &[out.clone(), lse.clone()]);
    rejects_operand(op(), &f16_v, 2);
    rejects_attribute(rounding(DType::F32), &forward, "bf16 or f16");
}

#[test]
fn cached_attention_positions_are_one_per_row() {
    let op = || Op::CachedAttention { scale: 0.5 };
    let (q, cache) = (f32t(&[2, 4, 1, 8]), f32t(&[2, 2, 16, 8]));
    let with = |positions: TensorType| vec![q.clone(), cache.clone(), cache.clone(), positions];
    accepts(op(), &with(i64t(&[2])), &[f32t(&[2, 1, 4, 8])]);
    rejects_operand(op(), &with(i64t(&[2, 1])), 3);
    rejects_operand(op(), &with(i64t(&[1])), 3);
    rejects_operand(op(), &with(f32t(&[2])), 3);
}

#[test]
fn kv_cache_write_fits_the_cache() {
    let cache = f32t(&[2, 2, 16, 8]);
    let with =
        |t: usize, positions: TensorType| vec![cache.clone(), f32t(&[2, 2, t, 8]), positions];
    accepts(Op::KvCacheWrite, &with(3, i64t(&[2])), &[cache.clone()]);
    accepts(Op::KvCacheWrite, &with(16, i64t(&[2])), &[cache.clone()]);
    rejects_operand(Op::KvCacheWrite, &with(17, i64t(&[2])), 1);
    rejects_operand(Op::KvCacheWrite, &with(3, i64t(&[3])), 2);
}

#[test]
fn pooled_cache_ops_take_one_slot_per_batch_row() {
    // A pool of 5 slots serves a batch of 2.
    let (q, pool) = (f32t(&[2, 4, 1, 8]), f32t(&[5, 2, 16, 8]));
    let attention = || Op::CachedAttention { scale: 0.5 };
    let read = |rows: TensorType| vec![q.clone(), pool.clone(), pool.clone(), i64t(&[2]), rows];
    accepts(attention(), &read(i64t(&[2])), &[f32t(&[2, 1, 4, 8])]);
    rejects_operand(attention(), &read(i64t(&[5])), 4);
    rejects_operand(attention(), &read(f32t(&[2])), 4);
    // Without rows, the cache has one row per batch row.
    let unpooled = vec![q.clone(), pool.clone(), pool.clone(), i64t(&[2])];
    rejects_operand(attention(), &unpooled, 1);

    let write = |rows: TensorType| vec![pool.clone(), f32t(&[2, 2, 1, 8]), i64t(&[2]), rows];
    accepts(Op::KvCacheWrite, &write(i64t(&[2])), &[pool.clone()]);
    rejects_operand(Op::KvCacheWrite, &write(i64t(&[3])), 3);
    let unpooled = vec![pool.clone(), f32t(&[2, 2, 1, 8]), i64t(&[2])];
    rejects_operand(Op::KvCacheWrite, &unpooled, 1);
    // A slot id must name one of the pool's rows.
    let types = write(i64t(&[2]));
    let range = Op::KvCacheWrite.index_range(3, &types).unwrap();
    assert!(range.contains(4) && !range.contains(5) && !range.contains(-2));
    assert!(range.contains(crate::PADDING_SLOT));
    let range = attention().index_range(4, &read(i64t(&[2]))).unwrap();
    assert!(range.contains(0) && !range.contains(5));
}

#[test]
fn argmax_drops_the_last_dim() {
    accepts(Op::Argmax, &[f32t(&[3, 7])], &[i64t(&[3])]);
    accepts(Op::Argmax, &[f32t(&[2, 4, 5])], &[i64t(&[2, 4])]);
    rejects_operand(Op::Argmax, &[i64t(&[3, 7])], 0);
    rejects_operand(Op::Argmax, &[f32t(&[])], 0);
}

#[test]
fn swiglu_and_its_backward() {
    let g = f32t(&[2, 6]);
    accepts(Op::SwiGlu, &[g.clone(), g.clone()], &[g.clone()]);
    rejects_operand(Op::SwiGlu, &[g.clone(), f32t(&[2, 5])], 1);
    accepts(
        Op::SwiGluBackward,
        &[g.clone(), g.clone(), g.clone()],
        &[g.clone(), g.clone()],
    );
    rejects_operand(Op::SwiGluBackward, &[g.clone(), g.clone(), f32t(&[6])], 2);
    // The incoming gradient is stored data: bf16 where mixed precision rounded it.
    let rounded = ty(DType::BF16, &[2, 6]);
    accepts(
        Op::SwiGluBackward,
        &[g.clone(), g.clone(), rounded.clone()],
        &[g.clone(), g.clone()],
    );
    rejects_operand(
        Op::SwiGluBackward,
        &[f32t(&[2, 5]), g.clone(), rounded.clone()],
        1,
    );
    // Gate and up may be rounded products: the op computes in f32 all the same.
    accepts(
        Op::SwiGlu,
        &[rounded.clone(), rounded.clone()],
        &[g.clone()],
    );
    rejects_operand(Op::SwiGlu, &[g.clone(), rounded.clone()], 1);
    accepts(
        Op::SwiGluBackward,
        &[rounded.clone(), rounded.clone(), rounded.clone()],
        &[g.clone(), g.clone()],
    );
    // f64 (gradient checks) stores nothing narrower.
    let wide = ty(DType::F64, &[2, 6]);
    rejects_operand(Op::SwiGlu, &[wide.clone(), rounded.clone()], 1);
    rejects_operand(Op::SwiGluBackward, &[wide.clone(), wide, rounded], 2);
}

#[test]
fn rounded_ops_give_their_rounded_results_as_bf16_and_take_only_roundable_ops() {
    let rounded = |op| Op::Rounded(Box::new(op));
    let (g, b) = (f32t(&[2, 6]), ty(DType::BF16, &[2, 6]));
    accepts(rounded(Op::SwiGlu), &[g.clone(), g.clone()], &[b.clone()]);
    accepts(rounded(Op::SwiGlu), &[b.clone(), b.clone()], &[b.clone()]);
    accepts(
        rounded(Op::SwiGluBackward),
        &[g.clone(), g.clone(), b.clone()],
        &[b.clone(), b.clone()],
    );
    let mm = |transpose_b| Op::MatMul {
        transpose_a: false,
        transpose_b,
    };
    let product = [ty(DType::BF16, &[3, 6]), ty(DType::BF16, &[4, 6])];
    accepts(rounded(mm(true)), &product, &[ty(DType::BF16, &[3, 4])]);
    // A product is rounded from bf16 operands alone; the inner rule still checks the rest.
    rejects_operand(rounded(mm(true)), &[f32t(&[3, 6]), f32t(&[4, 6])], 0);
    assert!(rounded(mm(false)).infer(&product).is_err());
    // A norm rounds its normed rows alone: an `AddRmsNorm`'s sum stays f32.
    let weight = f32t(&[6]);
    let norm = Op::RmsNorm { eps: 1e-6 };
    accepts(rounded(norm), &[g.clone(), weight.clone()], &[b.clone()]);
    let add = Op::AddRmsNorm { eps: 1e-6 };
    accepts(
        rounded(add),
        &[g.clone(), g.clone(), weight],
        &[g.clone(), b.clone()],
    );
    let unroundable = rounded(Op::Add);
    let err = unroundable.infer(&[g.clone(), g]).unwrap_err();
    assert!(matches!(err, Error::Attribute { .. }), "{err:?}");
    assert_eq!(unroundable.to_string(), "rounded{op=add}");
    assert_eq!(
        rounded(mm(true)).to_string(),
        "rounded_matmul{transpose_a=false, transpose_b=true}"
    );
}

/// `AlsoRounded`: the op's results as they are, then a bf16 copy of each it rounds; only ops
/// whose kernels write such copies.
#[test]
fn also_rounded_ops_append_bf16_copies_of_their_rounded_results() {
    let also = |op| Op::AlsoRounded(Box::new(op));
    let (g, b, weight) = (f32t(&[2, 6]), ty(DType::BF16, &[2, 6]), f32t(&[6]));
    let backward = Op::AddRmsNormBackward { eps: 1e-6 };
    accepts(
        also(backward),
        &[g.clone(), weight.clone(), g.clone(), g.clone()],
        &[g.clone(), weight.clone(), b.clone()],
    );
    let (x, positions) = (f32t(&[1, 2, 3, 4]), ty(DType::I64, &[1, 3]));
    let rope = Op::RopeBackward { theta: 1e4 };
    accepts(
        also(rope),
        &[x, positions],
        &[f32t(&[1, 3, 2, 4]), ty(DType::BF16, &[1, 3, 2, 4])],
    );
    accepts(also(Op::Contiguous), &[g.clone()], &[g.clone(), b]);
    // SwiGLU has a rounded form, but no kernel writing both.
    let err = also(Op::SwiGlu).infer(&[g.clone(), g.clone()]).unwrap_err();
    assert!(matches!(err, Error::Attribute { .. }), "{err:?}");
    let err = also(Op::Add).infer(&[g.clone(), g]).unwrap_err();
    assert!(matches!(err, Error::Attribute { .. }), "{err:?}");
    assert_eq!(
        also(Op::RopeBackward { theta: 1e4 }).to_string(),
        "also_rounded_rope_backward{theta=10000.0}"
    );
}

#[test]
fn softmax_backward() {
    let y = f32t(&[2, 5]);
    accepts(Op::SoftmaxBackward, &[y.clone(), y.clone()], &[y.clone()]);
    rejects_operand(Op::SoftmaxBackward, &[y, f32t(&[2, 4])], 1);
}

#[test]
fn cross_entropy_targets_are_one_per_row() {
    let op = || Op::CrossEntropy { ignore_index: -100 };
    let logits = f32t(&[6, 10]);
    accepts(op(), &[logits.clone(), i64t(&[6])], &[f32t(&[])]);
    rejects_operand(op(), &[logits.clone(), i64t(&[6, 1])], 1);
    rejects_operand(op(), &[logits.clone(), i64t(&[5])], 1);
    rejects_operand(op(), &[f32t(&[2, 3, 10]), i64t(&[6])], 0);
    let backward = || Op::CrossEntropyBackward { ignore_index: -100 };
    let operands = |grad_loss: TensorType| vec![logits.clone(), i64t(&[6]), grad_loss];
    accepts(backward(), &operands(f32t(&[])), &[logits.clone()]);
    rejects_operand(backward(), &operands(f32t(&[1])), 2);
}

#[test]
fn linear_cross_entropy_takes_one_dtype_for_x_and_weight_and_keeps_lse() {
    let op = || Op::LinearCrossEntropy { ignore_index: -100 };
    let bf = |dims: &[usize]| ty(DType::BF16, dims);
    for x in [f32t(&[6, 8]), bf(&[6, 8])] {
        let w = ty(x.dtype, &[50, 8]);
        let forward = [x.clone(), w.clone(), i64t(&[6])];
        accepts(op(), &forward, &[f32t(&[]), f32t(&[6])]);
        let backward = || Op::LinearCrossEntropyBackward { ignore_index: -100 };
        let mut saved = forward.to_vec();
        saved.extend([f32t(&[6]), f32t(&[])]);
        accepts(backward(), &saved, &[x.clone(), w.clone()]);
        let mut bad = saved.clone();
        bad[3] = f32t(&[5]);
        rejects_operand(backward(), &bad, 3);
        bad = saved.clone();
        bad[4] = ty(DType::F64, &[]);
        rejects_operand(backward(), &bad, 4);
    }
    rejects_operand(op(), &[f32t(&[6, 8]), bf(&[50, 8]), i64t(&[6])], 1);
    rejects_operand(op(), &[f32t(&[6, 8]), f32t(&[50, 7]), i64t(&[6])], 1);
    rejects_operand(
        op(),
        &[
            ty(DType::F64, &[6, 8]),
            ty(DType::F64, &[50, 8]),
            i64t(&[6]),
        ],
        0,
    );
    rejects_operand(op(), &[f32t(&[2, 6, 8]), f32t(&[50, 8]), i64t(&[6])], 0);
    rejects_operand(op(), &[f32t(&[6, 8]), f32t(&[50, 8]), i64t(&[5])], 2);
    rejects_operand(op(), &[f32t(&[6, 8]), f32t(&[50, 8]), f32t(&[6])], 2);
}

#[test]
fn adamw_takes_an_i64_step_an_f64_rate_an_optional_f32_grad_scale_and_a_bf16_grad() {
    let op = || {
        Op::AdamW(AdamWConfig {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        })
    };
    let p = f32t(&[3, 4]);
    let lr = || ty(DType::F64, &[]);
    let with =
        |m: TensorType, step: TensorType| vec![p.clone(), p.clone(), m, p.clone(), step, lr()];
    let updated = [p.clone(), p.clone(), p.clone()];
    accepts(op(), &with(p.clone(), i64t(&[])), &updated);
    let mut scaled = with(p.clone(), i64t(&[]));
    scaled.push(f32t(&[]));
    accepts(op(), &scaled, &updated);
    rejects_operand(op(), &with(p.clone(), ty(DType::I32, &[])), 4);
    rejects_operand(op(), &with(p.clone(), i64t(&[1])), 4);
    rejects_operand(op(), &with(f32t(&[4, 3]), i64t(&[])), 2);
    let mut f32_rate = with(p.clone(), i64t(&[]));
    f32_rate[5] = f32t(&[]);
    rejects_operand(op(), &f32_rate, 5);
    let mut wide_scale = scaled.clone();
    wide_scale[6] = f32t(&[1]);
    rejects_operand(op(), &wide_scale, 6);
    rejects_arity(op(), &with(p.clone(), i64t(&[]))[..5], "6 or 7");
    // The gradient is stored data: bf16 of the param's shape, nothing else.
    let mut bf16_grad = with(p.clone(), i64t(&[]));
    bf16_grad[1] = ty(DType::BF16, &[3, 4]);
    accepts(op(), &bf16_grad, &updated);
    for grad in [ty(DType::BF16, &[4, 3]), ty(DType::F64, &[3, 4])] {
        let mut wrong = with(p.clone(), i64t(&[]));
        wrong[1] = grad;
        rejects_operand(op(), &wrong, 1);
    }
}

#[test]
fn adamw_copy_takes_a_bf16_copy_of_the_param_before_the_step_and_returns_it_fourth() {
    let config = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let op = || Op::AdamWCopy(config);
    let p = f32t(&[3, 4]);
    let copy = ty(DType::BF16, &[3, 4]);
    let grad = ty(DType::BF16, &[3, 4]);
    let with = |copy: TensorType| {
        vec![
            p.clone(),
            grad.clone(),
            p.clone(),
            p.clone(),
            copy,
            i64t(&[]),
            ty(DType::F64, &[]),
        ]
    };
    let updated = [p.clone(), p.clone(), p.clone(), copy.clone()];
    accepts(op(), &with(copy.clone()), &updated);
    let mut scaled = with(copy.clone());
    scaled.push(f32t(&[]));
    accepts(op(), &scaled, &updated);
    for wrong in [f32t(&[3, 4]), ty(DType::BF16, &[4, 3])] {
        rejects_operand(op(), &with(wrong), 4);
    }
    let mut shifted = with(copy.clone());
    shifted[5] = ty(DType::F64, &[]);
    rejects_operand(op(), &shifted, 5);
    rejects_arity(op(), &with(copy.clone())[..6], "7 or 8");
    // AdamW itself takes no copy: its step is operand 4.
    rejects_operand(Op::AdamW(config), &with(copy)[..6], 4);
}

#[test]
fn clip_grad_norm_takes_f32_gradients_of_any_shape_and_gives_two_scalars() {
    let op = || Op::ClipGradNorm { max_norm: 1.0 };
    let scalars = [f32t(&[]), f32t(&[])];
    accepts(op(), &[f32t(&[3, 4]), f32t(&[7])], &scalars);
    accepts(op(), &[f32t(&[])], &scalars);
    rejects_operand(op(), &[f32t(&[3]), ty(DType::F64, &[3])], 1);
    rejects_arity(op(), &[], "at least 1");
    for max_norm in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        rejects_attribute(Op::ClipGradNorm { max_norm }, &[f32t(&[2])], "max_norm");
    }
}

#[test]
fn all_reduce_gives_each_f32_operand_its_own_type() {
    accepts(
        Op::AllReduce,
        &[f32t(&[3, 4]), f32t(&[7]), f32t(&[])],
        &[f32t(&[3, 4]), f32t(&[7]), f32t(&[])],
    );
    rejects_operand(Op::AllReduce, &[f32t(&[3]), ty(DType::BF16, &[3])], 1);
    rejects_operand(Op::AllReduce, &[i64t(&[2])], 0);
    rejects_arity(Op::AllReduce, &[], "at least 1");
    assert_eq!(Op::AllReduce.alias(2), crate::Alias::MayOverwrite(2));
}

#[test]
fn reshape_keeps_the_element_count() {
    let op = |dims: &[usize]| Op::Reshape {
        shape: Shape::new(dims),
    };
    accepts(op(&[6, 2]), &[f32t(&[3, 4])], &[f32t(&[6, 2])]);
    accepts(op(&[12]), &[i64t(&[3, 4])], &[i64t(&[12])]);
    rejects_attribute(op(&[5, 2]), &[f32t(&[3, 4])], "cannot view [3,4] as [5,2]");
}

#[test]
fn results_too_large_to_address_are_refused() {
    // Each operand fits; the result would not.
    let wide = 1usize << 32;
    let err = matmul(false, false)
        .infer(&[f32t(&[wide, 1]), f32t(&[1, wide])])
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("f32[4294967296,4294967296] is too large"),
        "{err}"
    );
    let reshape = Op::Reshape {
        shape: Shape::new(&[wide, wide, 0, wide]),
    };
    let empty = reshape.infer(&[f32t(&[0])]).unwrap();
    assert_eq!(empty, vec![f32t(&[wide, wide, 0, wide])]);
    let reshape = Op::Reshape {
        shape: Shape::new(&[wide, wide]),
    };
    let err = reshape.infer(&[f32t(&[0])]).unwrap_err();
    assert!(matches!(err, Error::TooLarge { .. }), "{err}");
}

#[test]
fn transpose_and_slice_bounds() {
    let x = f32t(&[2, 3, 4]);
    let transpose = |dim0, dim1| Op::Transpose { dim0, dim1 };
    accepts(transpose(0, 2), &[x.clone()], &[f32t(&[4, 3, 2])]);
    rejects_attribute(transpose(0, 3), &[x.clone()], "out of range for rank 3");
    let slice = |axis, start, end| Op::Slice { axis, start, end };
    accepts(slice(2, 1, 3), &[x.clone()], &[f32t(&[2, 3, 2])]);
    accepts(slice(1, 3, 3), &[x.clone()], &[f32t(&[2, 0, 4])]);
    rejects_attribute(slice(2, 1, 5), &[x.clone()], "1..5 along axis 2");
    rejects_attribute(slice(2, 3, 1), &[x.clone()], "3..1 along axis 2");
    rejects_attribute(slice(3, 0, 1), &[x], "along axis 3");
}

#[test]
fn cast_into_takes_its_destinations_type_and_a_float_of_its_shape() {
    let (into, a) = (ty(DType::BF16, &[3, 2]), f32t(&[3, 2]));
    accepts(Op::CastInto, &[into.clone(), a.clone()], &[into.clone()]);
    rejects_operand(Op::CastInto, &[into.clone(), f32t(&[2, 3])], 1);
    rejects_operand(Op::CastInto, &[into, i64t(&[3, 2])], 1);
    assert!(Op::CastInto.infer(&[a]).is_err());
}

#[test]
fn rope_kv_write_types_its_parts_and_names_its_own_ports() {
    let op = |bias| Op::RopeKvWrite {
        theta: 1e4,
        bias,
        staged: None,
    };
    let bf = |dims: &[usize]| ty(DType::BF16, dims);
    // B=2, T=1, Hq=4, Hkv=2, D=8; a pool of 5 slots of 16 positions.
    let (q, k, v) = (
        f32t(&[2, 1, 4, 8]),
        f32t(&[2, 1, 2, 8]),
        f32t(&[2, 2, 1, 8]),
    );
    let pool = bf(&[5, 2, 16, 8]);
    let operands = |pool: &TensorType, rows: bool, biases: bool| {
        let mut o = vec![q.clone(), k.clone(), v.clone(), pool.clone(), pool.clone()];
        o.extend([i64t(&[2, 1]), i64t(&[2])]);
        o.extend(rows.then(|| i64t(&[2])));
        o.extend(biases.then(|| [bf(&[32]), bf(&[16])]).into_iter().flatten());
        o
    };
    let results = |pool: &TensorType| vec![f32t(&[2, 4, 1, 8]), pool.clone(), pool.clone()];
    accepts(op(true), &operands(&pool, true, true), &results(&pool));
    let own = f32t(&[2, 2, 16, 8]);
    accepts(op(false), &operands(&own, false, false), &results(&own));
    accepts(op(true), &operands(&own, false, true), &results(&own));
    rejects_arity(op(true), &operands(&pool, true, false), "9 or 10");
    // A part's error names this op and the fused op's port.
    let mut bad = operands(&pool, true, true);
    bad[9] = bf(&[32]);
    rejects_operand(op(true), &bad, 9);
    let mut bad = operands(&pool, true, true);
    bad[7] = i64t(&[3]);
    rejects_operand(op(true), &bad, 7);
    // Rotated keys the cache does not fit are k's fault.
    let mut bad = operands(&own, false, false);
    bad[1] = f32t(&[2, 1, 3, 8]);
    rejects_operand(op(false), &bad, 1);
    let mut bad = operands(&pool, true, true);
    bad[2] = f32t(&[2, 1, 2, 8]);
    rejects_operand(op(true), &bad, 2);
    // q and k of one batch, length and head size.
    let mut bad = operands(&own, false, false);
    bad[0] = f32t(&[2, 1, 4, 6]);
    rejects_operand(op(false), &bad, 1);
    // The positions' ranges are the cache ops'.
    let types = operands(&pool, true, true);
    let range = op(true).index_range(6, &types).unwrap();
    assert!(range.contains(15) && !range.contains(16));
    let range = op(true).index_range(7, &types).unwrap();
    assert!(range.contains(4) && !range.contains(5) && range.contains(crate::PADDING_SLOT));
    assert!(op(true).index_range(5, &types).is_some());
    assert_eq!(op(true).index_range(8, &types), None);
    assert_eq!(op(true).alias(1), crate::Alias::MayOverwrite(3));
}

#[test]
fn staged_rope_kv_write_takes_token_major_values_and_gives_the_flash_operands() {
    let op = |staged| Op::RopeKvWrite {
        theta: 1e4,
        bias: false,
        staged: Some(staged),
    };
    // B=2, T=3, Hq=4, Hkv=2, D=8; each batch row's own cache of 16 positions.
    let (q, k) = (f32t(&[2, 3, 4, 8]), f32t(&[2, 3, 2, 8]));
    let cache = ty(DType::BF16, &[2, 2, 16, 8]);
    let operands = |v: &TensorType| {
        vec![
            q.clone(),
            k.clone(),
            v.clone(),
            cache.clone(),
            cache.clone(),
            i64t(&[2, 3]),
            i64t(&[2]),
        ]
    };
    let f16 = |dims: &[usize]| ty(DType::F16, dims);
    let results = vec![
        f16(&[2, 4, 3, 8]),
        cache.clone(),
        cache.clone(),
        f16(&[2, 2, 3, 8]),
        f16(&[2, 2, 3, 8]),
    ];
    accepts(op(DType::F16), &operands(&k), &results);
    // v is token-major like k here; the head-major v of the plain form is refused.
    rejects_operand(op(DType::F16), &operands(&f32t(&[2, 2, 3, 8])), 2);
    // f32 operands alone, f16 rows alone.
    let mut wide = operands(&k);
    wide[0] = ty(DType::F64, &[2, 3, 4, 8]);
    rejects_operand(op(DType::F16), &wide, 0);
    rejects_operand(
        op(DType::F16),
        &operands(&ty(DType::BF16, &[2, 3, 2, 8])),
        2,
    );
    let mut bf16_k = operands(&ty(DType::BF16, &[2, 3, 2, 8]));
    bf16_k[1] = ty(DType::BF16, &[2, 3, 2, 8]);
    rejects_operand(op(DType::F16), &bf16_k, 1);
    rejects_attribute(op(DType::BF16), &operands(&k), "f16 rows");
    assert_eq!(
        op(DType::F16).to_string(),
        "rope_kv_write{theta=10000.0, bias=false, staged=f16}"
    );
}

#[test]
fn linear_with_add_rmsnorm_gives_the_norms_results_of_the_residuals_shape() {
    let op = |groups: usize, swiglu| Op::Linear {
        biases: vec![false; groups],
        swiglu,
        add_rmsnorm: Some(1e-6),
        rope_kv: None,
    };
    let bf = |dims: &[usize]| ty(DType::BF16, dims);
    let (x, w, residual) = (f32t(&[2, 8]), bf(&[6, 8]), f32t(&[2, 1, 6]));
    let operands = |residual: &TensorType, weight: TensorType| {
        vec![x.clone(), w.clone(), residual.clone(), weight]
    };
    let both = vec![residual.clone(), residual.clone()];
    accepts(op(1, false), &operands(&residual, bf(&[6])), &both);
    accepts(op(1, false), &operands(&residual, f32t(&[6])), &both);
    // The residual holds the product's rows; the norm weight is [N].
    rejects_operand(op(1, false), &operands(&f32t(&[3, 6]), bf(&[6])), 2);
    rejects_operand(op(1, false), &operands(&bf(&[2, 1, 6]), bf(&[6])), 2);
    rejects_operand(op(1, false), &operands(&residual, bf(&[5])), 3);
    rejects_arity(op(1, false), &operands(&residual, bf(&[6]))[..3], "4");
    let two = [x.clone(), w.clone(), w.clone(), residual.clone(), bf(&[6])];
    rejects_attribute(op(2, false), &two, "one group");
    rejects_attribute(op(2, true), &two, "one group");
    assert_eq!(
        op(1, false).to_string(),
        "linear{biases=[false], swiglu=false, add_rmsnorm_eps=1e-6}"
    );
}

/// A linear writes its SwiGLU result or its normed rows rounded (the sum stays f32) where it
/// has more than `UNROUNDED_LINEAR_MAX_ROWS` rows, and a linear with neither has no rounded
/// form.
#[test]
fn a_rounded_linear_takes_more_rows_than_an_unrounded_one() {
    let bf = |dims: &[usize]| ty(DType::BF16, dims);
    let rows = crate::UNROUNDED_LINEAR_MAX_ROWS;
    let rounded = |swiglu, add_rmsnorm| {
        Op::Rounded(Box::new(Op::Linear {
            biases: vec![false; if swiglu { 2 } else { 1 }],
            swiglu,
            add_rmsnorm,
            rope_kv: None,
        }))
    };
    let swiglu = |m: usize| vec![f32t(&[m, 8]), bf(&[6, 8]), bf(&[6, 8])];
    accepts(
        rounded(true, None),
        &swiglu(rows + 1),
        &[bf(&[rows + 1, 6])],
    );
    rejects_operand(rounded(true, None), &swiglu(rows), 0);
    let m = rows + 1;
    let norm = vec![bf(&[m, 8]), bf(&[6, 8]), f32t(&[m, 6]), bf(&[6])];
    accepts(
        rounded(false, Some(1e-6)),
        &norm,
        &[f32t(&[m, 6]), bf(&[m, 6])],
    );
    let plain = [f32t(&[m, 8]), bf(&[6, 8])];
    rejects_attribute(rounded(false, None), &plain, "no rounded form");
}

#[test]
fn embedding_adamw_takes_the_update_then_its_rows_scatter_operands_and_returns_the_state() {
    let config = AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let table = f32t(&[7, 4]);
    let copy = ty(DType::BF16, &[7, 4]);
    let (ids, grad) = (i64t(&[2, 3]), f32t(&[2, 3, 4]));
    // The named rows' update takes the scatter's gradient, the unnamed rows' does not.
    let operands = |copied: bool, rows, base: Option<TensorType>| {
        let mut operands = vec![table.clone(), table.clone(), table.clone()];
        operands.extend(copied.then(|| copy.clone()));
        operands.extend([i64t(&[]), ty(DType::F64, &[]), ids.clone()]);
        operands.extend((rows == EmbeddingRows::Named).then(|| grad.clone()));
        operands.extend(base);
        operands
    };
    let op = |onto, copy, rows| Op::EmbeddingAdamW {
        config,
        onto,
        copy,
        rows,
    };
    let state = vec![table.clone(), table.clone(), table.clone()];
    let mut with_copy = state.clone();
    with_copy.push(copy.clone());
    for rows in [EmbeddingRows::Unnamed, EmbeddingRows::Named] {
        accepts(op(false, false, rows), &operands(false, rows, None), &state);
        let with_base = operands(true, rows, Some(copy.clone()));
        accepts(op(true, true, rows), &with_base, &with_copy);
        let with_base = operands(false, rows, Some(table.clone()));
        accepts(op(true, false, rows), &with_base, &state);
        // The base is the table's shape, and last.
        let wrong = operands(false, rows, Some(f32t(&[4, 7])));
        let last = wrong.len() - 1;
        rejects_operand(op(true, false, rows), &wrong, last);
        let arity = (wrong.len()).to_string();
        rejects_arity(op(true, false, rows), &operands(false, rows, None), &arity);
        assert_eq!(op(true, false, rows).stored_operands(), [last]);
        assert_eq!(op(true, true, rows).stored_operands(), [last + 1]);
    }
    // The scatter's gradient rows are the table's width.
    let mut narrow = operands(false, EmbeddingRows::Named, None);
    narrow[6] = f32t(&[2, 3, 5]);
    rejects_operand(op(false, false, EmbeddingRows::Named), &narrow, 6);
}

#[test]
fn linear_with_rope_kv_types_as_its_linear_and_rope_kv_write_and_names_its_own_ports() {
    let op = |biases: [bool; 3]| Op::Linear {
        biases: biases.to_vec(),
        swiglu: false,
        add_rmsnorm: None,
        rope_kv: Some(1e4),
    };
    let bf = |dims: &[usize]| ty(DType::BF16, dims);
    // B=2, T=1 (M=2), K=16, Hq=4, Hkv=2, D=8.
    // With rows: a pool of 5 slots of 16 positions; without, each batch row's own cache.
    let cache = |rows: bool| bf(&[if rows { 5 } else { 2 }, 2, 16, 8]);
    let operands = |biases: [bool; 3], rows: bool| {
        let mut o = vec![f32t(&[2, 16]), bf(&[32, 16]), bf(&[16, 16]), bf(&[16, 16])];
        let biased = [32, 16, 16].into_iter().zip(biases).filter(|&(_, b)| b);
        o.extend(biased.map(|(n, _)| bf(&[n])));
        o.extend([cache(rows), cache(rows), i64t(&[2, 1]), i64t(&[2])]);
        o.extend(rows.then(|| i64t(&[2])));
        o
    };
    let results = |rows| vec![f32t(&[2, 4, 1, 8]), cache(rows), cache(rows)];
    let all = [true; 3];
    accepts(op(all), &operands(all, true), &results(true));
    let v_bias = [false, false, true];
    accepts(op(v_bias), &operands(v_bias, false), &results(false));
    rejects_arity(op(all), &operands(all, true)[..9], "11 or 12");
    rejects_attribute(
        Op::Linear {
            biases: vec![false; 2],
            swiglu: false,
            add_rmsnorm: None,
            rope_kv: Some(1e4),
        },
        &operands(all, false)[..3],
        "three groups",
    );
    // Widths that are no whole heads of the caches' head size are the weight's fault.
    let mut bad = operands(all, true);
    bad[2] = bf(&[12, 16]);
    bad[5] = bf(&[12]);
    rejects_operand(op(all), &bad, 2);
    // RopeKvWrite's errors name this op's ports: v heads the cache does not hold (the v
    // weight's, as RopeKvWrite blames its v), a v cache not of rank 4, positions of another
    // batch.
    let mut bad = operands(all, true);
    bad[3] = bf(&[24, 16]);
    bad[6] = bf(&[24]);
    rejects_operand(op(all), &bad, 3);
    let mut bad = operands(all, true);
    bad[8] = bf(&[5, 2, 16]);
    rejects_operand(op(all), &bad, 8);
    let mut bad = operands(all, true);
    bad[10] = i64t(&[3]);
    rejects_operand(op(all), &bad, 10);
    // Rope positions of B·T ≠ M rows.
    let mut bad = operands(all, true);
    bad[9] = i64t(&[3, 1]);
    rejects_operand(op(all), &bad, 9);
    // The positions' ranges and the caches' aliases follow the ports.
    let types = operands(all, true);
    let range = op(all).index_range(10, &types).unwrap();
    assert!(range.contains(15) && !range.contains(16));
    let range = op(all).index_range(11, &types).unwrap();
    assert!(range.contains(4) && !range.contains(5) && range.contains(crate::PADDING_SLOT));
    assert!(op(all).index_range(9, &types).is_some());
    assert_eq!(op(all).index_range(8, &types), None);
    assert_eq!(op(all).alias(1), crate::Alias::MayOverwrite(7));
    assert_eq!(op(all).alias(2), crate::Alias::MayOverwrite(8));
    assert_eq!(op(all).alias(0), crate::Alias::Fresh);
    assert_eq!(
        op(all).to_string(),
        "linear{biases=[true,true,true], swiglu=false, rope_kv_theta=10000.0}"
    );
}
