//! The programs kiln compiles: `prefill`, `decode`, `train`, and `eval` (the `kiln eval`
//! contract as a graph). Each is the model code traced with the right inputs around it.
//!
//! Values that change per run — token ids, positions, targets, the optimizer step, the loss
//! seed — are graph Inputs (device inputs), never constants baked into the graph, so one
//! compiled program serves every step.

use kiln_ir::{DType, Graph, InputKind, Op, TensorType, ValueId};

use crate::error::Result;
use crate::model::{
    hidden_states, last_logits, lm_loss, output_head, parameter_shapes, ModelConfig, ModelWeights,
    Ops,
};
use crate::trace::{AttentionMode, Caches, LayerCache, Tracer};

mod options;
mod train;

pub use options::{DataParallel, ProgramOptions, DECODE_CACHE_ROWS};
pub use train::Accumulation;

/// Which program to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgramKind {
    Prefill,
    Decode,
    Train,
    Eval,
}

impl ProgramKind {
    pub fn name(self) -> &'static str {
        match self {
            ProgramKind::Prefill => "prefill",
            ProgramKind::Decode => "decode",
            ProgramKind::Train => "train",
            ProgramKind::Eval => "eval",
        }
    }
}

fn i64_input(graph: &mut Graph, name: &str, dims: &[usize]) -> Result<ValueId> {
    Ok(graph.input(name, InputKind::Input, TensorType::new(DType::I64, dims)?)?)
}

/// Every parameter as a Param input of `dtype` under its Hugging Face name.
fn params(graph: &mut Graph, config: &ModelConfig, dtype: DType) -> Result<ModelWeights<ValueId>> {
    ModelWeights::build(config, |name, dims| {
        Ok(graph.input(name, InputKind::Param, TensorType::new(dtype, dims)?)?)
    })
}

/// The per-layer KV cache states `cache.{k,v}.{layer}`, `[S,Hkv,rows,D]` of `dtype`, at
/// `positions`: one cache row per batch row (`S = B`), or with `options.pool` a pool of `S`
/// slots and the input `cache_rows [B]` naming each batch row's.
fn caches(
    graph: &mut Graph,
    config: &ModelConfig,
    (options, rows): (&ProgramOptions, usize),
    (dtype, positions): (DType, ValueId),
) -> Result<Caches> {
    let sequences = options.pool.unwrap_or(options.batch);
    let ty = TensorType::new(
        dtype,
        [sequences, config.num_key_value_heads, rows, config.head_dim],
    )?;
    let slots = match options.pool {
        Some(_) => Some(i64_input(graph, "cache_rows", &[options.batch])?),
        None => None,
    };
    let layers = (0..config.num_hidden_layers)
        .map(|layer| {
            let prefix = &options.cache_prefix;
            let (k_name, v_name) = (
                format!("{prefix}cache.k.{layer}"),
                format!("{prefix}cache.v.{layer}"),
            );
            Ok(LayerCache {
                k: graph.input(&k_name, InputKind::State, ty.clone())?,
                v: graph.input(&v_name, InputKind::State, ty.clone())?,
                k_name,
                v_name,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Caches {
        layers,
        positions,
        slots,
    })
}

/// A pool's programs also output `next_tokens [B]`, each row's greedy token (the argmax of its
/// logits, -1 for logits with a NaN or all -inf), so greedy decoding copies B ids off the
/// device instead of B·V logits.
fn greedy_tokens(tracer: &Tracer, options: &ProgramOptions, logits: ValueId) -> Result<()> {
    if options.pool.is_some() {
        let next = tracer.graph().op1(kiln_ir::Op::Argmax, &[logits])?;
        tracer.graph().output("next_tokens", next)?;
    }
    Ok(())
}

/// Logits `[B,V]` of the tokens `rows [B]` of the flattened `[B·T]` tokens (row `b` names one
/// of its own: `b·T + t`): the output head on those positions only.
fn row_logits(
    tracer: &Tracer,
    config: &ModelConfig,
    weights: &ModelWeights<ValueId>,
    (tokens, positions): (&ValueId, &ValueId),
    rows: ValueId,
) -> Result<ValueId> {
    let hidden = hidden_states(tracer, config, weights, tokens, positions)?;
    let dims = tracer.dims(&hidden);
    let flat = tracer.reshape(&hidden, &[dims[0] * dims[1], dims[2]])?;
    let picked = tracer.embedding(&flat, &rows)?;
    output_head(tracer, weights, &picked)
}

/// Builds program `kind` for `config`, after [`ProgramOptions::validate`], fused unless
/// `options.fusion` is off.
pub fn build(kind: ProgramKind, config: &ModelConfig, options: &ProgramOptions) -> Result<Graph> {
    let traced = trace(kind, config, options)?;
    match options.fusion {
        true => Ok(kiln_ir::fuse(&traced)?),
        false => Ok(traced),
    }
}

/// Program `kind` as the model code traces it.
fn trace(kind: ProgramKind, config: &ModelConfig, options: &ProgramOptions) -> Result<Graph> {
    options.validate(kind, config)?;
    let shard;
    let config = match options.tensor_parallel {
        Some(ranks) => {
            shard = config
                .shard(ranks)
                .map_err(|reason| crate::Error::ProgramOption {
                    flag: "--tensor-parallel",
                    value: ranks,
                    reason,
                })?;
            &shard
        }
        None => config,
    };
    // Each rank's row-parallel outputs are summed over the group (a group of one included:
    // its all-reduce is the identity, run through the communicator all the same).
    let new_tracer = |graph, mode| {
        let tracer = Tracer::new(graph, mode, options.precision);
        match options.tensor_parallel {
            Some(_) => tracer.with_tensor_parallel(),
            None => tracer,
        }
    };
    let mut graph = Graph::new(kind.name());
    let (batch, seq) = (options.batch, options.seq);
    let rows = options.cache_rows(kind, config).unwrap_or(0);
    let stored = options.precision.weight_dtype();
    let weights = params(&mut graph, config, stored)?;
    match kind {
        ProgramKind::Prefill => {
            let tokens = i64_input(&mut graph, "tokens", &[batch, seq])?;
            let positions = i64_input(&mut graph, "positions", &[batch, seq])?;
            let cache_positions = i64_input(&mut graph, "cache_positions", &[batch])?;
            let caches = caches(
                &mut graph,
                config,
                (options, rows),
                (stored, cache_positions),
            )?;
            let mode = AttentionMode::FillCache(caches);
            // A pool's prompts are padded to the program's length: each row names the token
            // whose logits come out.
            let logit_rows = match options.pool {
                Some(_) => Some(i64_input(&mut graph, "logit_rows", &[batch])?),
                None => None,
            };
            let tracer = new_tracer(graph, mode);
            let logits = match logit_rows {
                Some(rows) => row_logits(&tracer, config, &weights, (&tokens, &positions), rows)?,
                None => last_logits(&tracer, config, &weights, &tokens, &positions)?,
            };
            tracer.graph().output("logits", logits)?;
            greedy_tokens(&tracer, options, logits)?;
            Ok(tracer.finish())
        }
        ProgramKind::Decode => {
            let tokens = i64_input(&mut graph, "tokens", &[batch, 1])?;
            let positions = i64_input(&mut graph, "positions", &[batch])?;
            let caches = caches(&mut graph, config, (options, rows), (stored, positions))?;
            let mode = AttentionMode::ReadCache(caches);
            let tracer = new_tracer(graph, mode);
            let rope_positions = tracer.graph().op1(
                kiln_ir::Op::Reshape {
                    shape: [batch, 1].into(),
                },
                &[positions],
            )?;
            let logits = last_logits(&tracer, config, &weights, &tokens, &rope_positions)?;
            tracer.graph().output("logits", logits)?;
            greedy_tokens(&tracer, options, logits)?;
            Ok(tracer.finish())
        }
        ProgramKind::Train | ProgramKind::Eval => {
            let tokens = i64_input(&mut graph, "tokens", &[batch, seq])?;
            let positions = i64_input(&mut graph, "positions", &[batch, seq])?;
            // `validate` has checked that `[batch, seq]` ids fit, so their count does.
            let targets = i64_input(&mut graph, "targets", &[batch * seq])?;
            let mut tracer = new_tracer(graph, AttentionMode::Plain);
            if kind == ProgramKind::Train {
                tracer = tracer.with_weight_copies();
            }
            let hidden = hidden_states(&tracer, config, &weights, &tokens, &positions)?;
            let logits = (kind == ProgramKind::Eval)
                .then(|| output_head(&tracer, &weights, &hidden))
                .transpose()?;
            let loss = lm_loss(&tracer, &weights, &hidden, logits.as_ref(), &targets)?;
            let copies = tracer.weight_copies();
            let mut graph = tracer.finish();
            graph.output("loss", loss)?;
            if let Some(logits) = logits {
                graph.output("logits", logits)?;
            }
            if kind == ProgramKind::Eval && !options.grads {
                return Ok(graph);
            }
            let seed = graph.input(
                "loss_seed",
                InputKind::Input,
                TensorType::new(DType::F32, [])?,
            )?;
            let named = weights.named();
            let mut wrt: Vec<ValueId> = named.iter().map(|(_, v)| **v).collect();
            wrt.extend(copies.iter().map(|&(_, copy)| copy));
            let mut grads = kiln_ir::append_backward(&mut graph, loss, seed, &wrt)?;
            // A copy's gradient is its param's, widened back as a cast's would be (and added
            // to the param's own where it has uses of its own: a tied embedding).
            let copy_grads = grads.split_off(named.len());
            for (&(param, _), copy_grad) in copies.iter().zip(copy_grads) {
                let Some(copy_grad) = copy_grad else { continue };
                let at = wrt
                    .iter()
                    .position(|&v| v == param)
                    .expect("copies are of params");
                let widened = graph.op1(Op::Cast { to: DType::F32 }, &[copy_grad])?;
                grads[at] = Some(match grads[at] {
                    Some(own) => graph.op1(Op::Add, &[own, widened])?,
                    None => widened,
                });
            }
            if kind == ProgramKind::Eval {
                for ((name, _), grad) in named.iter().zip(&grads) {
                    if let Some(grad) = grad {
                        graph.output(&format!("grad.{name}"), *grad)?;
                    }
                }
                return Ok(graph);
            }
            let grads: Vec<(String, ValueId, ValueId)> = (named.iter().zip(grads))
                .filter_map(|((name, param), grad)| grad.map(|g| (name.clone(), **param, g)))
                .collect();
            train::append_update(&mut graph, options, &grads, &copies)?;
            Ok(graph)
        }
    }
}

/// Number of parameters of `config` (for summaries).
pub fn parameter_count(config: &ModelConfig) -> usize {
    parameter_shapes(config)
        .iter()
        .map(|(_, dims)| dims.iter().product::<usize>())
        .sum()
}

/// The learning rate [`example_inputs`] gives a train step: torch.optim.AdamW's default.
pub const DEFAULT_LR: f64 = 1e-3;

/// Per-run inputs and zeroed state for a program `graph` built by [`build`]`(kind, config,
/// options)`, for benchmarks and device checks: token ids drawn from `seed`, positions and
/// targets as `kiln eval` makes them (prefill from cache row 0), decode at `position` for every
/// row, optimizer step 1 at [`DEFAULT_LR`], loss seed 1, caches and moments zero. Parameters
/// (and the states derived from them) are not included.
pub fn example_inputs(
    graph: &Graph,
    config: &ModelConfig,
    kind: ProgramKind,
    options: &ProgramOptions,
    position: usize,
    seed: u64,
) -> Result<std::collections::BTreeMap<String, kiln_runtime::Tensor>> {
    use kiln_runtime::{Device, Tensor};
    use rand::{Rng, SeedableRng};
    if kind == ProgramKind::Decode {
        options.check_position(config, position)?;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let (batch, seq) = (options.batch, options.seq);
    let rows = if kind == ProgramKind::Decode { 1 } else { seq };
    let ids: Vec<i64> = (0..batch * rows)
        .map(|_| rng.random_range(0..config.vocab_size as i64))
        .collect();
    let tokens = Tensor::from_vec(ids, [batch, rows])?;
    let lm = match kind {
        ProgramKind::Decode => None,
        _ => Some(crate::eval::CausalLmInputs::new(
            &tokens,
            config.vocab_size,
        )?),
    };
    let mut values = std::collections::BTreeMap::new();
    for (_, name, input_kind, ty) in graph.inputs() {
        let tensor = match (name, kind) {
            ("tokens", _) => tokens.clone(),
            ("positions", ProgramKind::Decode) => {
                Tensor::from_vec(vec![position as i64; batch], [batch])?
            }
            ("positions" | "targets", _) => {
                let lm = lm.as_ref().expect("made for every program but decode");
                let found = lm.named().into_iter().find(|(n, _)| *n == name);
                found.map(|(_, t)| t.clone()).expect("named above")
            }
            ("cache_positions", _) => Tensor::from_vec(vec![0i64; batch], [batch])?,
            // Pool slots 0..B, one per row.
            ("cache_rows", _) => Tensor::from_vec((0..batch as i64).collect(), [batch])?,
            // Each row's last token.
            ("logit_rows", _) => {
                let rows = (1..=batch as i64).map(|b| b * seq as i64 - 1).collect();
                Tensor::from_vec(rows, [batch])?
            }
            ("step", _) => Tensor::from_vec(vec![1i64], kiln_ir::Shape::scalar())?,
            ("lr", _) => Tensor::scalar(DEFAULT_LR, DType::F64),
            ("loss_seed", _) => Tensor::scalar(1.0, DType::F32),
            // Params, and the states derived from them, are the caller's to set.
            _ if input_kind == InputKind::Param => continue,
            _ if graph.derived().iter().any(|(state, _)| state == name) => continue,
            _ => Tensor::zeros(ty.shape.clone(), ty.dtype, Device::Cpu),
        };
        values.insert(name.to_string(), tensor);
    }
    Ok(values)
}

#[cfg(test)]
#[path = "programs/parallel_tests.rs"]
mod parallel_tests;
#[cfg(test)]
mod tests;

/// Plans `graph`; with a `memory_budget` (arena bytes), recomputes in the backward what the
/// plan must drop to fit ([`kiln_planner::plan_within`]), and returns the graph it planned
/// (the given one when it fits as it is). Where no plan of `graph` fits, its LM-head loss with
/// the gradient in one op goes back to the loss and its backward
/// ([`kiln_ir::fuse::split_loss_grads`]), whose vocabulary chunks need less scratch, and that
/// graph is planned within the budget. A budget needs a train program: its backward begins at
/// the first reader of `loss_seed`.
pub fn plan_program(
    graph: Graph,
    options: &kiln_planner::PlanOptions,
    workspaces: &dyn kiln_planner::WorkspaceNeeds,
    memory_budget: Option<u64>,
) -> kiln_planner::Result<(Graph, kiln_planner::Plan)> {
    let Some(budget) = memory_budget else {
        let plan = kiln_planner::plan(&graph, options, workspaces)?;
        return Ok((graph, plan));
    };
    match plan_within(&graph, options, workspaces, budget) {
        Err(kiln_planner::Error::Budget { .. }) if has_loss_grad(&graph) => {
            let split = kiln_ir::fuse::split_loss_grads(&graph)?;
            plan_within(&split, options, workspaces, budget)
        }
        planned => planned,
    }
}

fn has_loss_grad(graph: &Graph) -> bool {
    (graph.ops()).any(|(_, op)| matches!(op, Op::LinearCrossEntropyGrad { .. }))
}

/// [`kiln_planner::plan_within`] from `graph`'s `loss_seed`.
fn plan_within(
    graph: &Graph,
    options: &kiln_planner::PlanOptions,
    workspaces: &dyn kiln_planner::WorkspaceNeeds,
    budget: u64,
) -> kiln_planner::Result<(Graph, kiln_planner::Plan)> {
    let seed = (graph.inputs().into_iter())
        .find(|&(_, name, _, _)| name == "loss_seed")
        .map(|(value, ..)| value)
        .ok_or_else(|| kiln_planner::Error::Unplannable {
            rule: "memory budget",
            detail: format!(
                "`{}` has no backward (no `loss_seed` input): --memory-budget recomputes in a \
                 train program's backward",
                graph.name()
            ),
        })?;
    let budgeted = kiln_planner::plan_within(graph, options, workspaces, (budget, seed))?;
    Ok((budgeted.graph, budgeted.plan))
}
