//! `kiln eval`: logits, the causal-LM loss and (optionally) every parameter's gradient for a
//! batch of token ids — the contract scripts and the parity tests rely on.

use std::collections::BTreeMap;

use kiln_ir::DType;
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::{Error, Result};
use crate::model::{
    hidden_states, lm_loss, output_head, shifted_targets, Eager, ModelConfig, ModelWeights,
    Precision,
};
use crate::ops;
use crate::programs::{build, ProgramKind, ProgramOptions};
use crate::value_trace::{add_trace_outputs, Probe, TracePatterns, TRACE_PREFIX};

/// What one evaluation produced, every tensor f32.
pub struct Evaluation {
    /// `[B,T,V]`.
    pub logits: Tensor,
    /// `[1]`: mean cross-entropy of `logits[:, :-1]` against `tokens[:, 1:]`.
    pub loss: Tensor,
    /// Gradient of the loss per parameter, Hugging Face names (tied models: the embedding only).
    pub grads: Vec<(String, Tensor)>,
    /// The traced values (`crate::value_trace`) by value name, in the order the model named
    /// them; empty unless asked for.
    pub traces: Vec<(String, Tensor)>,
}

impl Evaluation {
    /// The tensors by the names of `kiln eval`'s output file: `logits`, `loss`, then
    /// `grad.<parameter>` in the parameters' order, then `trace.<value>` of `--trace`. Every
    /// door to an evaluation (the CLI, the Python and C bindings) names its results through
    /// this one function.
    pub fn named(self) -> Vec<(String, Tensor)> {
        let mut tensors = vec![
            ("logits".to_string(), self.logits),
            ("loss".to_string(), self.loss),
        ];
        tensors.extend((self.grads.into_iter()).map(|(name, grad)| (format!("grad.{name}"), grad)));
        tensors.extend(
            (self.traces.into_iter()).map(|(name, value)| (format!("{TRACE_PREFIX}{name}"), value)),
        );
        tensors
    }
}

/// Checks `tokens` (integer `[B,T]`, `B >= 1`, `T >= 2`, ids inside the vocabulary) and returns
/// them as i64 values.
pub fn check_tokens(tokens: &Tensor, vocab: usize) -> Result<(usize, usize, Vec<i64>)> {
    let &[batch, seq] = tokens.dims() else {
        return Err(Error::Tokens {
            reason: format!("expected shape [B,T], got {}", tokens.shape()),
        });
    };
    if batch == 0 || seq < 2 {
        return Err(Error::Tokens {
            reason: format!(
                "shape {} has no next-token pairs; the loss needs B >= 1 and T >= 2",
                tokens.shape()
            ),
        });
    }
    let ids: Vec<i64> = match tokens.dtype() {
        DType::I64 => tokens.to_vec::<i64>()?,
        DType::I32 => tokens.to_vec::<i32>()?.into_iter().map(i64::from).collect(),
        other => {
            return Err(Error::Tokens {
                reason: format!("expected integer ids (i64 or i32), got {other}"),
            })
        }
    };
    if let Some(at) = ids
        .iter()
        .position(|&id| id < 0 || id as u64 >= vocab as u64)
    {
        return Err(Error::TokenOutOfRange {
            row: at / seq,
            column: at % seq,
            id: ids[at],
            vocab,
        });
    }
    Ok((batch, seq, ids))
}

fn to_f32(tensor: &Tensor) -> Result<Tensor> {
    if tensor.dtype() == DType::F32 {
        return Ok(tensor.clone());
    }
    Ok(ops::cast(&Var::constant(tensor.clone()), DType::F32)?
        .value()
        .clone())
}

/// The per-run inputs of a causal-LM batch, named as the programs' graph inputs.
pub struct CausalLmInputs {
    /// i64 `[B,T]`.
    pub tokens: Tensor,
    /// i64 `[B,T]`: `0..T` in every row.
    pub positions: Tensor,
    /// i64 `[B·T]`: the tokens shifted left, last column ignored (see `shifted_targets`).
    pub targets: Tensor,
}

impl CausalLmInputs {
    /// Checks `tokens` (see [`check_tokens`]) and derives positions and targets.
    pub fn new(tokens: &Tensor, vocab: usize) -> Result<Self> {
        let (batch, seq, ids) = check_tokens(tokens, vocab)?;
        let positions: Vec<i64> = (0..batch * seq).map(|i| (i % seq) as i64).collect();
        let targets = shifted_targets(&ids, batch, seq);
        Ok(CausalLmInputs {
            tokens: Tensor::from_vec(ids, [batch, seq])?,
            positions: Tensor::from_vec(positions, [batch, seq])?,
            targets: Tensor::from_vec(targets, [batch * seq])?,
        })
    }

    /// `[B, T]`.
    pub fn batch_and_seq(&self) -> (usize, usize) {
        (self.tokens.dims()[0], self.tokens.dims()[1])
    }

    /// The inputs by graph input name.
    pub fn named(&self) -> [(&'static str, &Tensor); 3] {
        [
            ("tokens", &self.tokens),
            ("positions", &self.positions),
            ("targets", &self.targets),
        ]
    }
}

/// The eval program's options for `inputs`, checked as every program's are
/// ([`ProgramOptions::validate`]), so every engine refuses the same tokens.
fn eval_options(
    config: &ModelConfig,
    inputs: &CausalLmInputs,
    with_grads: bool,
    precision: Precision,
) -> Result<ProgramOptions> {
    let (batch, seq) = inputs.batch_and_seq();
    let options = ProgramOptions {
        batch,
        seq,
        grads: with_grads,
        precision,
        ..ProgramOptions::default()
    };
    // `kiln eval` has no --batch or --seq: the tokens' [B,T] are them.
    options
        .validate(ProgramKind::Eval, config)
        .map_err(|error| match error {
            Error::ProgramOption {
                flag,
                value,
                reason,
            } => Error::Tokens {
                reason: match flag {
                    "--batch" => format!("B = {value} rows: {reason}"),
                    _ => format!("T = {value} tokens per row: {reason}"),
                },
            },
            other => other,
        })?;
    Ok(options)
}

/// Runs the model on `tokens` at positions `0..T` through the eager oracle.
pub fn evaluate(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    tokens: &Tensor,
    with_grads: bool,
    precision: Precision,
) -> Result<Evaluation> {
    let untraced = TracePatterns::default();
    evaluate_traced(config, weights, tokens, (with_grads, precision), &untraced)
}

/// Like [`evaluate`], also returning the values `trace` selects.
pub fn evaluate_traced(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    tokens: &Tensor,
    (with_grads, precision): (bool, Precision),
    trace: &TracePatterns,
) -> Result<Evaluation> {
    let inputs = CausalLmInputs::new(tokens, config.vocab_size)?;
    eval_options(config, &inputs, with_grads, precision)?;
    let [ids, positions, targets] = inputs.named().map(|(_, t)| Var::constant(t.clone()));
    let eager = Eager { precision };
    let probe = Probe::new(&eager, trace);
    let hidden = hidden_states(&probe, config, weights, &ids, &positions)?;
    let logits = output_head(&probe, weights, &hidden)?;
    let loss = lm_loss(&probe, weights, &hidden, Some(&logits), &targets)?;
    let traces = (probe.into_values()?.into_iter())
        .map(|(name, value)| Ok((name, to_f32(value.value())?)))
        .collect::<Result<Vec<_>>>()?;
    let mut grads = Vec::new();
    if with_grads {
        for (_, param) in weights.named() {
            param.zero_grad()?;
        }
        loss.backward()?;
        for (name, param) in weights.named() {
            let grad = match param.grad() {
                Some(grad) => to_f32(&grad)?,
                // A parameter no gradient reached (possible only for degenerate inputs).
                None => Tensor::zeros(param.shape().clone(), DType::F32, param.value().device()),
            };
            grads.push((name, grad));
        }
    }
    Ok(Evaluation {
        logits: to_f32(logits.value())?,
        loss: to_f32(loss.value())?.reshape([1])?,
        grads,
        traces,
    })
}

/// Like [`evaluate`], through the traced `eval` program on the reference interpreter: the
/// forward pass as an IR graph and the gradients from IR autodiff.
pub fn evaluate_interpreted(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    tokens: &Tensor,
    with_grads: bool,
    precision: Precision,
) -> Result<Evaluation> {
    evaluate_program(
        config,
        weights,
        tokens,
        with_grads,
        precision,
        Engine::Interpret,
    )
}

/// The values `kiln eval --trace` can pick for `tokens`, in the order the model names them:
/// each name with its type (`f32 [2,8,64]`).
pub fn traceable_values(
    config: &ModelConfig,
    tokens: &Tensor,
    precision: Precision,
) -> Result<Vec<(String, String)>> {
    let inputs = CausalLmInputs::new(tokens, config.vocab_size)?;
    let options = eval_options(config, &inputs, false, precision)?;
    let graph = build(ProgramKind::Eval, config, &options)?;
    (graph.value_names().iter())
        .map(|(name, value)| {
            let ty = graph.value_type(*value)?;
            Ok((name.clone(), crate::error::type_name(ty.dtype, &ty.shape)))
        })
        .collect()
}

/// What runs the traced eval program.
pub enum Engine<'b> {
    /// The reference interpreter (one allocation per value).
    Interpret,
    /// The program planned (one stream) and bound to `backend`, run once in `mode`.
    Planned {
        backend: &'b kiln_runtime::Backend,
        mode: kiln_runtime::RunMode,
    },
}

/// As [`evaluate_interpreted`], with the eval program run by `engine`.
pub fn evaluate_program(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    tokens: &Tensor,
    with_grads: bool,
    precision: Precision,
    engine: Engine<'_>,
) -> Result<Evaluation> {
    let untraced = TracePatterns::default();
    evaluate_program_traced(
        config,
        weights,
        tokens,
        (with_grads, precision),
        engine,
        &untraced,
    )
}

/// Like [`evaluate_program`], also returning the values `trace` selects: the eval program
/// with their `trace.<name>` outputs added.
pub fn evaluate_program_traced(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    tokens: &Tensor,
    (with_grads, precision): (bool, Precision),
    engine: Engine<'_>,
    trace: &TracePatterns,
) -> Result<Evaluation> {
    let inputs = CausalLmInputs::new(tokens, config.vocab_size)?;
    let options = eval_options(config, &inputs, with_grads, precision)?;
    let mut graph = build(ProgramKind::Eval, config, &options)?;
    let traced = match trace.is_empty() {
        true => Vec::new(),
        false => add_trace_outputs(&mut graph, trace)?,
    };
    let mut values: BTreeMap<String, Tensor> = weights
        .named()
        .into_iter()
        .map(|(name, param)| (name, param.value().clone()))
        .collect();
    for (name, tensor) in inputs.named() {
        values.insert(name.to_string(), tensor.clone());
    }
    if with_grads {
        values.insert("loss_seed".into(), Tensor::scalar(1.0, DType::F32));
    }
    let mut outputs = match engine {
        Engine::Interpret => kiln_runtime::interpret(&graph, &mut values)?,
        Engine::Planned { backend, mode } => {
            let plan = kiln_planner::plan(
                &graph,
                &kiln_planner::PlanOptions::default(),
                &backend.workspaces(),
            )?;
            backend.run(&graph, &plan, &values, mode, 1)?
        }
    };
    let mut take = |name: &str| {
        outputs.remove(name).ok_or_else(|| Error::Operand {
            op: "eval",
            reason: format!("the eval program has no output `{name}`"),
        })
    };
    let logits = take("logits")?;
    let loss = take("loss")?.reshape([1])?;
    let mut grads = Vec::new();
    if with_grads {
        for (name, param) in weights.named() {
            let grad = match take(&format!("grad.{name}")) {
                Ok(grad) => grad,
                Err(_) => Tensor::zeros(param.shape().clone(), DType::F32, param.value().device()),
            };
            grads.push((name, grad));
        }
    }
    let traces = (traced.iter())
        .map(|output| {
            let name = output.strip_prefix(TRACE_PREFIX).unwrap_or(output);
            Ok((name.to_string(), to_f32(&take(output)?)?))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Evaluation {
        logits: to_f32(&logits)?,
        loss: to_f32(&loss)?,
        grads,
        traces,
    })
}
