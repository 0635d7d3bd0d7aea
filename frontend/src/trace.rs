//! Tracing: the model code, run with [`Tracer`] as its [`Ops`], builds an IR graph instead of
//! computing. Each method emits exactly the ops the eager oracle runs for it (same order, same
//! decomposition), so an interpreted graph can match the oracle bit for bit.

use std::cell::RefCell;

use kiln_ir::{Graph, InputKind, Op, TensorType, ValueId};

use crate::error::{Error, Result};
use crate::model::{Ops, Precision};

/// What attention does with each layer's keys and values.
#[derive(Clone, Debug)]
pub enum AttentionMode {
    /// Attend over this call's keys and values (training, evaluation).
    Plain,
    /// Attend over this call's keys and values and store them in the layer's cache at
    /// positions `positions[b]..` (prefill from an empty cache).
    FillCache(Caches),
    /// Store this call's keys and values in the cache at `positions[b]..` and attend over the
    /// cache up to each query's position (decode).
    ReadCache(Caches),
}

/// Every layer's cache, where each batch row's keys go.
#[derive(Clone, Debug)]
pub struct Caches {
    pub layers: Vec<LayerCache>,
    /// `[B]` int: the position of each batch row's first token.
    pub positions: ValueId,
    /// `[B]` int: each batch row's slot, when the caches are a pool of sequences.
    pub slots: Option<ValueId>,
}

impl Caches {
    /// The index operands of a cache op: positions, then slots when pooled.
    fn indices(&self) -> Vec<ValueId> {
        std::iter::once(self.positions).chain(self.slots).collect()
    }
}

/// The State inputs holding one layer's cache, `[B,Hkv,Smax,D]` each.
#[derive(Clone, Debug)]
pub struct LayerCache {
    pub k: ValueId,
    pub v: ValueId,
    pub k_name: String,
    pub v_name: String,
}

/// Records ops into a graph.
pub struct Tracer {
    graph: RefCell<Graph>,
    mode: AttentionMode,
    precision: Precision,
    /// With [`Tracer::with_weight_copies`]: the persistent copy each param weight of a linear
    /// reads instead of a cast of its own, (param, copy state) by the param's first use.
    copies: Option<RefCell<Vec<(ValueId, ValueId)>>>,
    /// With [`Tracer::with_tensor_parallel`]: row-parallel outputs are all-reduced.
    tensor_parallel: bool,
}

impl Tracer {
    pub fn new(graph: Graph, mode: AttentionMode, precision: Precision) -> Self {
        Tracer {
            graph: RefCell::new(graph),
            mode,
            precision,
            copies: None,
            tensor_parallel: false,
        }
    }

    /// Traces one rank of a tensor-parallel group (the model traced is the rank's shard,
    /// [`ModelConfig::shard`](crate::model::ModelConfig::shard)): each row-parallel output is
    /// summed over the ranks by an `all_reduce` op.
    pub fn with_tensor_parallel(mut self) -> Self {
        self.tensor_parallel = true;
        self
    }

    /// Linears read a persistent GEMM-dtype copy of each param weight (state `<dtype>.<name>`,
    /// derived from the param) instead of casting it: for train programs, whose updates keep
    /// the copies (frontend/src/programs/train.rs). Only with a GEMM dtype.
    pub fn with_weight_copies(mut self) -> Self {
        if self.precision.gemm_dtype().is_some() {
            self.copies = Some(RefCell::new(Vec::new()));
        }
        self
    }

    /// The (param, copy) pairs the linears read, in first-use order.
    pub fn weight_copies(&self) -> Vec<(ValueId, ValueId)> {
        self.copies
            .as_ref()
            .map_or_else(Vec::new, |c| c.borrow().clone())
    }

    /// `weight` as linears take it: its copy (made at its first use) when copies are on and it
    /// is an f32 param, else its cast to the GEMM dtype.
    fn gemm_weight(&self, weight: ValueId, gemm: kiln_ir::DType) -> Result<ValueId> {
        let Some(copies) = &self.copies else {
            return self.cast_to(weight, gemm);
        };
        if let Some(&(_, copy)) = copies.borrow().iter().find(|(p, _)| *p == weight) {
            return Ok(copy);
        }
        let param = (self.graph.borrow().inputs().into_iter())
            .find(|&(value, _, kind, ty)| {
                value == weight && kind == InputKind::Param && ty.dtype == kiln_ir::DType::F32
            })
            .map(|(_, name, _, ty)| (name.to_string(), ty.clone()));
        let Some((name, ty)) = param else {
            return self.cast_to(weight, gemm);
        };
        let copy_name = format!("{gemm}.{name}");
        let mut graph = self.graph.borrow_mut();
        let copy_type = TensorType::new(gemm, ty.dims().to_vec())?;
        let copy = graph.input(&copy_name, InputKind::State, copy_type)?;
        graph.derive(&copy_name, &name)?;
        copies.borrow_mut().push((weight, copy));
        Ok(copy)
    }

    /// Access to the graph being built (to add inputs and outputs around the model).
    pub fn graph(&self) -> std::cell::RefMut<'_, Graph> {
        self.graph.borrow_mut()
    }

    /// The traced graph.
    pub fn finish(self) -> Graph {
        self.graph.into_inner()
    }

    fn op(&self, op: Op, operands: &[ValueId]) -> Result<Vec<ValueId>> {
        Ok(self.graph.borrow_mut().op(op, operands)?)
    }

    fn op1(&self, op: Op, operands: &[ValueId]) -> Result<ValueId> {
        Ok(self.graph.borrow_mut().op1(op, operands)?)
    }

    /// `value` as `dtype`: itself when it has that dtype, else a `Cast`.
    fn cast_to(&self, value: ValueId, dtype: kiln_ir::DType) -> Result<ValueId> {
        if self.graph.borrow().value_type(value)?.dtype == dtype {
            Ok(value)
        } else {
            self.op1(Op::Cast { to: dtype }, &[value])
        }
    }

    /// Writes `k`, `v` into layer `layer`'s cache at its positions and makes the updated
    /// caches the new content of their states; returns them.
    fn write_cache(
        &self,
        caches: &Caches,
        layer: usize,
        k: &ValueId,
        v: &ValueId,
    ) -> Result<(ValueId, ValueId)> {
        let cache = caches.layers.get(layer).ok_or_else(|| Error::Operand {
            op: "attention",
            reason: format!(
                "no cache for layer {layer} ({} caches)",
                caches.layers.len()
            ),
        })?;
        let write = |cache: ValueId, new: ValueId| {
            let operands: Vec<ValueId> = [cache, new].into_iter().chain(caches.indices()).collect();
            self.op1(Op::KvCacheWrite, &operands)
        };
        let (k_cache, v_cache) = (write(cache.k, *k)?, write(cache.v, *v)?);
        let mut graph = self.graph.borrow_mut();
        graph.write(&cache.k_name, k_cache)?;
        graph.write(&cache.v_name, v_cache)?;
        Ok((k_cache, v_cache))
    }
}

impl From<kiln_ir::Error> for Error {
    fn from(error: kiln_ir::Error) -> Self {
        Error::Ir(Box::new(error))
    }
}

impl Ops for Tracer {
    type Value = ValueId;

    fn dims(&self, x: &ValueId) -> Vec<usize> {
        self.graph
            .borrow()
            .value_type(*x)
            .map(|t| t.dims().to_vec())
            .unwrap_or_default()
    }

    fn embedding(&self, weight: &ValueId, ids: &ValueId) -> Result<ValueId> {
        self.op1(Op::Embedding, &[*weight, *ids])
    }

    fn linear(&self, x: &ValueId, weight: &ValueId, bias: Option<&ValueId>) -> Result<ValueId> {
        // As ops::linear: view as a matrix, x·wᵀ, + bias, view back.
        let dims = self.dims(x);
        let features = dims.last().copied().unwrap_or(0);
        let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        let outputs = self.dims(weight).first().copied().unwrap_or(0);
        let flat = self.reshape(x, &[rows, features])?;
        let (flat, weight) = match self.precision.gemm_dtype() {
            Some(gemm) => (self.cast_to(flat, gemm)?, self.gemm_weight(*weight, gemm)?),
            None => (flat, *weight),
        };
        let mut out = self.op1(
            Op::MatMul {
                transpose_a: false,
                transpose_b: true,
            },
            &[flat, weight],
        )?;
        if let Some(bias) = bias {
            out = self.op1(Op::Add, &[out, *bias])?;
        }
        let mut out_dims = dims[..dims.len().saturating_sub(1)].to_vec();
        out_dims.push(outputs);
        self.reshape(&out, &out_dims)
    }

    fn rmsnorm(&self, x: &ValueId, weight: &ValueId, eps: f64) -> Result<ValueId> {
        self.op1(Op::RmsNorm { eps }, &[*x, *weight])
    }

    fn add_rmsnorm(
        &self,
        x: &ValueId,
        residual: &ValueId,
        weight: &ValueId,
        eps: f64,
    ) -> Result<(ValueId, ValueId)> {
        let results = self.op(Op::AddRmsNorm { eps }, &[*x, *residual, *weight])?;
        Ok((results[0], results[1]))
    }

    fn rope(
        &self,
        x: &ValueId,
        positions: &ValueId,
        bias: Option<&ValueId>,
        theta: f64,
    ) -> Result<ValueId> {
        let mut operands = vec![*x, *positions];
        operands.extend(bias.copied());
        let op = Op::Rope {
            theta,
            bias: bias.is_some(),
        };
        self.op1(op, &operands)
    }

    fn heads_first(&self, x: &ValueId) -> Result<ValueId> {
        let swapped = self.op1(Op::Transpose { dim0: 1, dim1: 2 }, &[*x])?;
        self.op1(Op::Contiguous, &[swapped])
    }

    fn attention(
        &self,
        layer: usize,
        q: &ValueId,
        k: &ValueId,
        v: &ValueId,
        scale: f64,
    ) -> Result<ValueId> {
        let head_dim = self.dims(q).last().copied().unwrap_or(0);
        let own_keys = match self.precision.flash_attention(head_dim) {
            Some(rounding) => Op::FlashAttention { scale, rounding },
            None => Op::Attention { scale },
        };
        match &self.mode {
            AttentionMode::Plain => Ok(self.op(own_keys, &[*q, *k, *v])?[0]),
            AttentionMode::FillCache(caches) => {
                self.write_cache(caches, layer, k, v)?;
                Ok(self.op(own_keys, &[*q, *k, *v])?[0])
            }
            AttentionMode::ReadCache(caches) => {
                let (k_cache, v_cache) = self.write_cache(caches, layer, k, v)?;
                let operands: Vec<ValueId> = [*q, k_cache, v_cache]
                    .into_iter()
                    .chain(caches.indices())
                    .collect();
                self.op1(Op::CachedAttention { scale }, &operands)
            }
        }
    }

    fn reduce_partial(&self, x: &ValueId) -> Result<ValueId> {
        match self.tensor_parallel {
            true => self.op1(Op::AllReduce, &[*x]),
            false => Ok(*x),
        }
    }

    fn swiglu(&self, gate: &ValueId, up: &ValueId) -> Result<ValueId> {
        // Gate and up rounded where the precision keeps them so, read back widened (the
        // fusion pass has the GEMMs write them rounded and SwiGLU read them stored).
        let rounded = |value: ValueId| match self.precision.swiglu_dtype() {
            Some(dtype) => {
                let wide = self.graph.borrow().value_type(value)?.dtype;
                let narrow = self.cast_to(value, dtype)?;
                self.cast_to(narrow, wide)
            }
            None => Ok(value),
        };
        self.op1(Op::SwiGlu, &[rounded(*gate)?, rounded(*up)?])
    }

    fn last_position(&self, x: &ValueId) -> Result<ValueId> {
        let seq = self.dims(x).get(1).copied().unwrap_or(0);
        let op = Op::Slice {
            axis: 1,
            start: seq.saturating_sub(1),
            end: seq,
        };
        let last = self.op1(op, &[*x])?;
        self.op1(Op::Contiguous, &[last])
    }

    fn reshape(&self, x: &ValueId, dims: &[usize]) -> Result<ValueId> {
        self.op1(Op::Reshape { shape: dims.into() }, &[*x])
    }

    fn cross_entropy(
        &self,
        logits: &ValueId,
        targets: &ValueId,
        ignore_index: i64,
    ) -> Result<ValueId> {
        self.op1(Op::CrossEntropy { ignore_index }, &[*logits, *targets])
    }

    fn chunked_loss(
        &self,
        hidden: &ValueId,
        head: &ValueId,
        targets: &ValueId,
        ignore_index: i64,
    ) -> Result<Option<ValueId>> {
        // As Eager::chunked_loss: view as rows, the GEMM dtype's casts, the one op.
        if !self.precision.chunked_loss() {
            return Ok(None);
        }
        let dims = self.dims(hidden);
        let features = dims.last().copied().unwrap_or(0);
        let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        let flat = self.reshape(hidden, &[rows, features])?;
        let (flat, head) = match self.precision.gemm_dtype() {
            Some(gemm) => (self.cast_to(flat, gemm)?, self.gemm_weight(*head, gemm)?),
            None => (flat, *head),
        };
        let results = self.op(
            Op::LinearCrossEntropy { ignore_index },
            &[flat, head, *targets],
        )?;
        Ok(Some(results[0]))
    }

    fn name_value(&self, name: &str, x: &ValueId) -> Result<()> {
        Ok(self.graph.borrow_mut().name_value(name, *x)?)
    }
}
