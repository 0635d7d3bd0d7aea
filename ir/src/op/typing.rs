//! Type rules: the result types of an op from its operand types, or an error that names the
//! op, the operand and the mismatch.

use super::{AdamWConfig, Op};
use crate::{DType, Error, Result, Shape, TensorType};

mod cache;
mod linear;
mod loss;

use cache::{attention_types, cached_attention_types, kv_cache_write_types, rope_kv_write_types};
use linear::linear_types;
pub use linear::{LINEAR_MAX_GROUPS, LINEAR_MAX_ROWS, UNROUNDED_LINEAR_MAX_ROWS};
use loss::linear_cross_entropy_types;

/// Checks of one op's operands; every error names the op and the operand port.
struct Rule<'a> {
    op: &'a Op,
    operands: &'a [TensorType],
}

impl Rule<'_> {
    fn type_error(&self, port: usize, expected: impl Into<String>) -> Error {
        Error::Type {
            op: self.op.to_string(),
            port,
            expected: expected.into(),
            got: self.operands[port].to_string(),
        }
    }

    fn arity(&self, expected: usize) -> Result<()> {
        if self.operands.len() == expected {
            Ok(())
        } else {
            Err(Error::Arity {
                op: self.op.to_string(),
                expected: expected.to_string(),
                got: self.operands.len(),
            })
        }
    }

    /// The operand count is one of two (a plain and a pooled form).
    fn arity_either(&self, [first, second]: [usize; 2]) -> Result<()> {
        match self.operands.len() {
            n if n == first || n == second => Ok(()),
            got => Err(Error::Arity {
                op: self.op.to_string(),
                expected: format!("{first} or {second}"),
                got,
            }),
        }
    }

    fn float(&self, port: usize) -> Result<&TensorType> {
        let t = &self.operands[port];
        if matches!(t.dtype, DType::F32 | DType::F64) {
            Ok(t)
        } else {
            Err(self.type_error(port, "f32 or f64"))
        }
    }

    /// Operand `port` is stored data (a weight, bias or cache) of an op computing in
    /// `compute`, shaped `dims`: of `compute`, or bf16 when `compute` is f32 (see [`stores`]).
    fn stored(&self, port: usize, compute: DType, dims: &[usize]) -> Result<()> {
        let t = &self.operands[port];
        if stores(compute, t.dtype) && t.dims() == dims {
            Ok(())
        } else {
            let also = if compute == DType::F32 {
                " or bf16"
            } else {
                ""
            };
            let shape = Shape::from(dims);
            Err(self.type_error(port, format!("{compute}{also} {shape}")))
        }
    }

    fn int(&self, port: usize) -> Result<&TensorType> {
        let t = &self.operands[port];
        if matches!(t.dtype, DType::I32 | DType::I64) {
            Ok(t)
        } else {
            Err(self.type_error(port, "i32 or i64"))
        }
    }

    /// Operand `port` has exactly type `want`.
    fn same(&self, port: usize, want: &TensorType) -> Result<()> {
        if &self.operands[port] == want {
            Ok(())
        } else {
            Err(self.type_error(port, want.to_string()))
        }
    }

    /// Operand `port` is a float of `dtype` whose shape is `dims`.
    fn shaped(&self, port: usize, dtype: DType, dims: &[usize]) -> Result<()> {
        self.same(port, &TensorType::new(dtype, dims)?)
    }

    fn rank(&self, port: usize, rank: usize, layout: &str) -> Result<&[usize]> {
        let dims = self.operands[port].dims();
        if dims.len() == rank {
            Ok(dims)
        } else {
            Err(self.type_error(port, format!("{} {layout}", self.operands[port].dtype)))
        }
    }

    /// `error`, from the type rule of one of this op's parts (an unfused op it stands for),
    /// as this op's: a `Type` error names this op and the port `port_of` gives for the part's.
    fn renamed(&self, error: Error, port_of: impl Fn(usize) -> usize) -> Error {
        match error {
            Error::Type {
                port,
                expected,
                got,
                ..
            } => Error::Type {
                op: self.op.to_string(),
                port: port_of(port),
                expected,
                got,
            },
            other => other,
        }
    }

    fn attribute(&self, reason: impl Into<String>) -> Error {
        Error::Attribute {
            op: self.op.to_string(),
            reason: reason.into(),
        }
    }
}

/// Whether an op computing in `compute` takes stored data (weights, biases, caches) of
/// `stored`: its own dtype, or bf16 under f32 compute — widened exactly where it is read,
/// rounded to nearest even where it is written (as `Cast`), so such an op equals the same op
/// with a `Cast` on each side (bf16 inference keeps its weights and caches as checkpoints do).
pub fn stores(compute: DType, stored: DType) -> bool {
    stored == compute || (compute == DType::F32 && stored == DType::BF16)
}

fn is_suffix(short: &[usize], long: &[usize]) -> bool {
    short.len() <= long.len() && long[long.len() - short.len()..] == *short
}

impl Op {
    /// Result types for operands of types `operands`.
    pub fn infer(&self, operands: &[TensorType]) -> Result<Vec<TensorType>> {
        let rule = Rule { op: self, operands };
        let one = |t: TensorType| Ok(vec![t]);
        match self {
            Op::Embedding => {
                rule.arity(2)?;
                // A bf16 table gives f32 rows (widened exactly, like a stored operand).
                let weight = &operands[0];
                let dtype = match weight.dtype {
                    DType::F32 | DType::F64 => weight.dtype,
                    DType::BF16 => DType::F32,
                    _ => return Err(rule.type_error(0, "f32, f64 or bf16 [V,H]")),
                };
                rule.rank(0, 2, "[V,H]")?;
                let ids = rule.int(1)?;
                let mut dims = ids.dims().to_vec();
                dims.push(weight.dims()[1]);
                one(TensorType::new(dtype, dims)?)
            }
            Op::EmbeddingBackward { vocab, onto } => {
                rule.arity(if *onto { 3 } else { 2 })?;
                rule.int(0)?;
                let grad = rule.float(1)?;
                let ids = operands[0].dims();
                let hidden = grad.dims().last().copied().unwrap_or(0);
                let mut want = ids.to_vec();
                want.push(hidden);
                rule.shaped(1, grad.dtype, &want)?;
                if *onto {
                    rule.stored(2, grad.dtype, &[*vocab, hidden])?;
                }
                one(TensorType::new(grad.dtype, [*vocab, hidden])?)
            }
            Op::Rounded(op) | Op::AlsoRounded(op) => {
                if !op.roundable() {
                    return Err(rule.attribute(format!("{op} has no rounded form")));
                }
                if matches!(self, Op::AlsoRounded(_)) && !op.also_roundable() {
                    return Err(rule.attribute(format!("{op} writes no rounded copy too")));
                }
                // A product is rounded from bf16 operands (mixed precision's GEMMs) alone, a
                // linear of more than `UNROUNDED_LINEAR_MAX_ROWS` rows (on the vendor GEMM).
                let bf16 = |t: &TensorType| t.dtype == DType::BF16;
                if matches!(**op, Op::MatMul { .. }) && !operands.first().is_some_and(bf16) {
                    return Err(rule.type_error(0, "bf16"));
                }
                let rows = operands.first().and_then(|x| x.dims().first().copied());
                if matches!(**op, Op::Linear { .. })
                    && rows.is_some_and(|m| m <= UNROUNDED_LINEAR_MAX_ROWS)
                {
                    let want = format!("[M,K] with M > {UNROUNDED_LINEAR_MAX_ROWS}");
                    return Err(rule.type_error(0, want));
                }
                let mut results = op.infer(operands)?;
                let mut copies = Vec::new();
                for &port in op.rounded_results() {
                    let Some(result) = results.get_mut(port) else {
                        continue;
                    };
                    if result.dtype != DType::F32 {
                        return Err(rule.attribute(format!("{op} gives {result}, not f32")));
                    }
                    let rounded = TensorType::new(DType::BF16, result.dims())?;
                    match self {
                        Op::Rounded(_) => *result = rounded,
                        _ => copies.push(rounded),
                    }
                }
                results.extend(copies);
                Ok(results)
            }
            Op::MatMul {
                transpose_a,
                transpose_b,
            } => {
                rule.arity(2)?;
                let (a, b) = (&operands[0], &operands[1]);
                let dtype = match a.dtype {
                    DType::F32 | DType::F64 => a.dtype,
                    DType::BF16 => DType::F32,
                    _ => return Err(rule.type_error(0, "f32, f64 or bf16")),
                };
                if b.dtype != a.dtype {
                    return Err(rule.type_error(1, format!("{} like operand 0", a.dtype)));
                }
                let rank = a.dims().len();
                if rank < 2 {
                    return Err(rule.type_error(0, "rank >= 2"));
                }
                if b.dims().len() != rank || b.dims()[..rank - 2] != a.dims()[..rank - 2] {
                    return Err(
                        rule.type_error(1, format!("rank {rank} with batch dims of operand 0"))
                    );
                }
                let (ad, bd) = (a.dims(), b.dims());
                let (m, k) = if *transpose_a {
                    (ad[rank - 1], ad[rank - 2])
                } else {
                    (ad[rank - 2], ad[rank - 1])
                };
                let (kb, n) = if *transpose_b {
                    (bd[rank - 1], bd[rank - 2])
                } else {
                    (bd[rank - 2], bd[rank - 1])
                };
                if k != kb {
                    return Err(rule.type_error(1, format!("inner dimension {k}")));
                }
                let mut dims = ad[..rank - 2].to_vec();
                dims.extend([m, n]);
                one(TensorType::new(dtype, dims)?)
            }
            Op::Add | Op::Mul => {
                rule.arity(2)?;
                let (a, b) = (&operands[0], &operands[1]);
                // Add's terms may be stored data (a bias, mixed precision's rounded gradients):
                // bf16 terms are widened, a bf16 `a` gives f32. Mul's operands share a's dtype.
                let dtype = match self {
                    Op::Add => self.compute_dtype(&[a.dtype, b.dtype]).unwrap_or(a.dtype),
                    _ => a.dtype,
                };
                if !matches!(dtype, DType::F32 | DType::F64) {
                    let expected = match self {
                        Op::Add => "f32, f64 or bf16",
                        _ => "f32 or f64",
                    };
                    return Err(rule.type_error(0, expected));
                }
                let dtype_ok = match self {
                    Op::Add => stores(dtype, a.dtype) && stores(dtype, b.dtype),
                    _ => b.dtype == a.dtype,
                };
                if !dtype_ok || !is_suffix(b.dims(), a.dims()) {
                    return Err(
                        rule.type_error(1, format!("{} with a suffix of {}", a.dtype, a.shape))
                    );
                }
                one(TensorType::new(dtype, a.dims())?)
            }
            Op::Scale { .. } | Op::Softmax | Op::Contiguous => {
                rule.arity(1)?;
                let a = if matches!(self, Op::Contiguous) {
                    &operands[0]
                } else {
                    rule.float(0)?
                };
                one(a.clone())
            }
            Op::Argmax => {
                rule.arity(1)?;
                let x = rule.float(0)?;
                let Some((_, rows)) = x.dims().split_last() else {
                    return Err(rule.type_error(0, "a float of rank 1 or more"));
                };
                one(TensorType::new(DType::I64, rows)?)
            }
            Op::SumToShape { shape } => {
                rule.arity(1)?;
                let a = rule.float(0)?;
                if !is_suffix(shape.dims(), a.dims()) {
                    return Err(rule.attribute(format!("{shape} is not a suffix of {}", a.shape)));
                }
                one(TensorType::new(a.dtype, shape.clone())?)
            }
            Op::BroadcastTo { shape } => {
                rule.arity(1)?;
                let a = rule.float(0)?;
                if !is_suffix(a.dims(), shape.dims()) {
                    return Err(rule.attribute(format!("{} is not a suffix of {shape}", a.shape)));
                }
                one(TensorType::new(a.dtype, shape.clone())?)
            }
            Op::Cast { to } => {
                rule.arity(1)?;
                let a = &operands[0];
                if !a.dtype.is_float() || !to.is_float() {
                    return Err(rule.type_error(0, "a float (casts are float to float)"));
                }
                one(TensorType::new(*to, a.shape.clone())?)
            }
            Op::CastInto => {
                rule.arity(2)?;
                let (into, a) = (&operands[0], &operands[1]);
                if !into.dtype.is_float() || !a.dtype.is_float() {
                    return Err(rule.type_error(1, "a float (casts are float to float)"));
                }
                if a.shape != into.shape {
                    return Err(
                        rule.type_error(1, format!("a float of `into`'s shape {}", into.shape))
                    );
                }
                one(into.clone())
            }
            Op::RmsNorm { .. } => {
                rule.arity(2)?;
                let x = rule.float(0)?;
                let h = x
                    .dims()
                    .last()
                    .copied()
                    .ok_or_else(|| rule.type_error(0, "rank >= 1"))?;
                rule.stored(1, x.dtype, &[h])?;
                one(x.clone())
            }
            Op::RmsNormBackward { .. } => {
                rule.arity(3)?;
                let x = rule.float(0)?.clone();
                let h = x
                    .dims()
                    .last()
                    .copied()
                    .ok_or_else(|| rule.type_error(0, "rank >= 1"))?;
                rule.shaped(1, x.dtype, &[h])?;
                rule.same(2, &x)?;
                Ok(vec![x.clone(), operands[1].clone()])
            }
            Op::AddRmsNorm { .. } => {
                rule.arity(3)?;
                let x = rule.float(0)?.clone();
                rule.same(1, &x)?;
                let h = x
                    .dims()
                    .last()
                    .copied()
                    .ok_or_else(|| rule.type_error(0, "rank >= 1"))?;
                rule.stored(2, x.dtype, &[h])?;
                Ok(vec![x.clone(), x])
            }
            Op::AddRmsNormBackward { .. } => {
                // grad_sum is absent when the sum output received no gradient.
                if !(3..=4).contains(&operands.len()) {
                    return Err(Error::Arity {
                        op: self.to_string(),
                        expected: "3 or 4".into(),
                        got: operands.len(),
                    });
                }
                let sum = rule.float(0)?.clone();
                let h = sum
                    .dims()
                    .last()
                    .copied()
                    .ok_or_else(|| rule.type_error(0, "rank >= 1"))?;
                rule.shaped(1, sum.dtype, &[h])?;
                for port in 2..operands.len() {
                    rule.same(port, &sum)?;
                }
                Ok(vec![sum, operands[1].clone()])
            }
            Op::Rope { bias, .. } => {
                rule.arity(if *bias { 3 } else { 2 })?;
                let x = rule.float(0)?;
                let &[b, t, h, d] = rule.rank(0, 4, "[B,T,H,D]")? else {
                    unreachable!("rank checked")
                };
                if d % 2 != 0 {
                    return Err(rule.type_error(0, "[B,T,H,D] with D even"));
                }
                rule.int(1)?;
                if operands[1].dims() != [b, t] {
                    return Err(rule.type_error(1, format!("int [{b},{t}]")));
                }
                if *bias {
                    rule.stored(2, x.dtype, &[h * d])?;
                }
                one(TensorType::new(x.dtype, [b, h, t, d])?)
            }
            Op::RopeBackward { .. } => {
                rule.arity(2)?;
                let g = rule.float(0)?;
                let &[b, h, t, d] = rule.rank(0, 4, "[B,H,T,D]")? else {
                    unreachable!("rank checked")
                };
                rule.int(1)?;
                if operands[1].dims() != [b, t] {
                    return Err(rule.type_error(1, format!("int [{b},{t}]")));
                }
                one(TensorType::new(g.dtype, [b, t, h, d])?)
            }
            Op::Attention { .. } => attention_types(&rule, None),
            Op::FlashAttention { rounding, .. } => attention_types(&rule, Some(*rounding)),
            Op::CachedAttention { .. } => cached_attention_types(&rule),
            Op::AttentionBackward { scale } | Op::FlashAttentionBackward { scale } => {
                let flash = matches!(self, Op::FlashAttentionBackward { .. });
                rule.arity(if flash { 6 } else { 5 })?;
                // The forward rule checks q, k, v; its errors are renamed to this op.
                let forward = match flash {
                    true => Op::FlashAttention {
                        scale: *scale,
                        rounding: DType::BF16,
                    },
                    false => Op::Attention { scale: *scale },
                };
                let forward = forward.infer(&operands[..3]).map_err(|error| match error {
                    Error::Type {
                        port,
                        expected,
                        got,
                        ..
                    } => Error::Type {
                        op: self.to_string(),
                        port,
                        expected,
                        got,
                    },
                    other => other,
                })?;
                // (probs, grad_out), or (out, lse, grad_out).
                let saved: &[&TensorType] = match flash {
                    true => &[&forward[0], &forward[1]],
                    false => &[&forward[1], &forward[0]],
                };
                for (port, ty) in (3..).zip(saved) {
                    rule.same(port, ty)?;
                }
                if !flash {
                    return Ok(operands[..3].to_vec());
                }
                // Flash: grad_out f32 or its bf16 rounding; the gradients f32.
                let grad_out = &operands[5];
                if grad_out.dims() != forward[0].dims()
                    || !matches!(grad_out.dtype, DType::F32 | DType::BF16)
                {
                    return Err(rule.type_error(5, format!("f32 or bf16 {}", forward[0].shape)));
                }
                (operands[..3].iter())
                    .map(|t| TensorType::new(DType::F32, t.dims()))
                    .collect()
            }
            Op::KvCacheWrite => kv_cache_write_types(&rule),
            Op::RopeKvWrite {
                theta,
                bias,
                staged,
            } => rope_kv_write_types(&rule, (*theta, *bias), *staged),
            // Gate and up (of one type) may be rounded products: bf16, widened as read, the op
            // computing in f32. The gradient is stored data, bf16 where mixed precision
            // rounded it.
            Op::SwiGlu | Op::SwiGluBackward => {
                let backward = matches!(self, Op::SwiGluBackward);
                rule.arity(if backward { 3 } else { 2 })?;
                let dtypes: Vec<DType> = operands.iter().map(|t| t.dtype).collect();
                let compute = self.compute_dtype(&dtypes).unwrap_or(DType::F32);
                if !matches!(compute, DType::F32 | DType::F64) {
                    return Err(rule.type_error(0, "f32, f64 or bf16"));
                }
                rule.same(1, &operands[0])?;
                let result = TensorType::new(compute, operands[0].dims().to_vec())?;
                if backward {
                    rule.stored(2, compute, result.dims())?;
                }
                match backward {
                    true => Ok(vec![result.clone(), result]),
                    false => one(result),
                }
            }
            Op::SoftmaxBackward => {
                rule.arity(2)?;
                let y = rule.float(0)?.clone();
                rule.same(1, &y)?;
                one(y)
            }
            Op::CrossEntropy { .. } | Op::CrossEntropyBackward { .. } => {
                let backward = matches!(self, Op::CrossEntropyBackward { .. });
                rule.arity(if backward { 3 } else { 2 })?;
                let logits = rule.float(0)?.clone();
                let &[n, _] = rule.rank(0, 2, "[N,V]")? else {
                    unreachable!("rank checked")
                };
                rule.int(1)?;
                if operands[1].dims() != [n] {
                    return Err(rule.type_error(1, format!("int [{n}]")));
                }
                if backward {
                    rule.shaped(2, logits.dtype, &[])?;
                    one(logits)
                } else {
                    one(TensorType::new(logits.dtype, Shape::scalar())?)
                }
            }
            Op::LinearCrossEntropy { .. }
            | Op::LinearCrossEntropyBackward { .. }
            | Op::LinearCrossEntropyGrad { .. } => linear_cross_entropy_types(&rule),
            Op::AdamW(c) | Op::AdamWCopy(c) => {
                adamw_config(&rule, c)?;
                let step = matches!(self, Op::AdamWCopy(_)) as usize + 4;
                if !(step + 2..=step + 3).contains(&operands.len()) {
                    return Err(Error::Arity {
                        op: self.to_string(),
                        expected: format!("{} or {}", step + 2, step + 3),
                        got: operands.len(),
                    });
                }
                let param = rule.float(0)?.clone();
                // The gradient is stored data: bf16 where mixed precision rounded it.
                rule.stored(1, param.dtype, param.dims())?;
                for port in 2..4 {
                    rule.same(port, &param)?;
                }
                rule.shaped(step, DType::I64, &[])?;
                rule.shaped(step + 1, DType::F64, &[])?;
                if operands.len() == step + 3 {
                    rule.shaped(step + 2, DType::F32, &[])?;
                }
                let mut results = vec![param.clone(), param.clone(), param.clone()];
                if step == 5 {
                    // The copy: the param's bf16 rounding, written where it is.
                    rule.shaped(4, DType::BF16, param.dims())?;
                    results.push(operands[4].clone());
                }
                Ok(results)
            }
            Op::EmbeddingAdamW { config, copy, .. } => {
                adamw_config(&rule, config)?;
                let step = 3 + usize::from(*copy);
                let (ids, grad, base) = self.embedding_update_ports().expect("an embedding update");
                rule.arity(1 + base.or(grad).unwrap_or(ids))?;
                let param = rule.float(0)?.clone();
                let &[_, hidden] = param.dims() else {
                    return Err(rule.type_error(0, "a table [V,H]"));
                };
                for port in 1..3 {
                    rule.same(port, &param)?;
                }
                let mut results = vec![param.clone(), param.clone(), param.clone()];
                if *copy {
                    rule.shaped(3, DType::BF16, param.dims())?;
                    results.push(operands[3].clone());
                }
                rule.shaped(step, DType::I64, &[])?;
                rule.shaped(step + 1, DType::F64, &[])?;
                // The scatter's operands, as `EmbeddingBackward` types them.
                let mut want = rule.int(ids)?.dims().to_vec();
                want.push(hidden);
                if let Some(grad) = grad {
                    rule.shaped(grad, param.dtype, &want)?;
                }
                if let Some(base) = base {
                    rule.stored(base, param.dtype, param.dims())?;
                }
                Ok(results)
            }
            Op::ClipGradNorm { max_norm } => {
                if operands.is_empty() {
                    return Err(Error::Arity {
                        op: self.to_string(),
                        expected: "at least 1".into(),
                        got: 0,
                    });
                }
                if !(max_norm.is_finite() && *max_norm > 0.0) {
                    return Err(
                        rule.attribute(format!("max_norm must be finite and > 0, got {max_norm}"))
                    );
                }
                for port in 0..operands.len() {
                    if rule.operands[port].dtype != DType::F32 {
                        return Err(rule.type_error(port, "f32"));
                    }
                }
                let scalar = TensorType::new(DType::F32, Shape::scalar())?;
                Ok(vec![scalar.clone(), scalar])
            }
            Op::AllReduce => {
                if operands.is_empty() {
                    return Err(Error::Arity {
                        op: self.to_string(),
                        expected: "at least 1".into(),
                        got: 0,
                    });
                }
                for port in 0..operands.len() {
                    if rule.operands[port].dtype != DType::F32 {
                        return Err(rule.type_error(port, "f32"));
                    }
                }
                Ok(operands.to_vec())
            }
            Op::Linear {
                biases,
                swiglu,
                add_rmsnorm,
                rope_kv,
            } => linear_types(&rule, biases, *swiglu, (*add_rmsnorm, *rope_kv)),
            Op::Reshape { shape } => {
                rule.arity(1)?;
                let a = &operands[0];
                // Typed first: a target shape whose count overflows is refused, not compared.
                let viewed = TensorType::new(a.dtype, shape.clone())?;
                if a.shape.numel() != viewed.shape.numel() {
                    return Err(rule.attribute(format!("cannot view {} as {shape}", a.shape)));
                }
                one(viewed)
            }
            Op::Transpose { dim0, dim1 } => {
                rule.arity(1)?;
                let a = &operands[0];
                let rank = a.dims().len();
                if *dim0 >= rank || *dim1 >= rank {
                    return Err(
                        rule.attribute(format!("dims {dim0},{dim1} out of range for rank {rank}"))
                    );
                }
                let mut dims = a.dims().to_vec();
                dims.swap(*dim0, *dim1);
                one(TensorType::new(a.dtype, dims)?)
            }
            Op::Slice { axis, start, end } => {
                rule.arity(1)?;
                let a = &operands[0];
                match a.dims().get(*axis) {
                    Some(&size) if start <= end && *end <= size => {
                        let mut dims = a.dims().to_vec();
                        dims[*axis] = end - start;
                        one(TensorType::new(a.dtype, dims)?)
                    }
                    _ => Err(rule.attribute(format!(
                        "{start}..{end} along axis {axis} does not fit {}",
                        a.shape
                    ))),
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "typing_tests.rs"]
mod tests;

/// AdamW's hyper-parameters: betas in [0, 1), eps and weight decay finite and >= 0.
fn adamw_config(rule: &Rule<'_>, c: &AdamWConfig) -> Result<()> {
    for (name, value) in [("beta1", c.beta1), ("beta2", c.beta2)] {
        if !(0.0..1.0).contains(&value) {
            return Err(rule.attribute(format!("{name} must be in [0, 1), got {value}")));
        }
    }
    for (name, value) in [("eps", c.eps), ("weight_decay", c.weight_decay)] {
        if !(value.is_finite() && value >= 0.0) {
            return Err(rule.attribute(format!("{name} must be finite and >= 0, got {value}")));
        }
    }
    Ok(())
}
