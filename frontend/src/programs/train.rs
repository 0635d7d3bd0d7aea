//! The end of a train program, after the backward: the AdamW updates (with optional
//! clipping), or, under gradient accumulation, the micro-batch's part in them.
//!
//! Accumulating over `k` micro-batches takes three programs of one executable group sharing
//! the parameters and the f32 accumulators `grad_acc.<name>` (state): the first micro-batch
//! writes its gradients into the accumulators, each one between adds its own to them (an add
//! made in the accumulator's storage), and the last adds its own to them and updates — so the
//! update sees the sum, and with a loss seed of `1/k` the mean, as torch's
//! `loss / accumulation_steps` gives. The accumulators are left as they are: the next step's
//! first micro-batch overwrites them.

use kiln_ir::{DType, Graph, InputKind, Op, TensorType, ValueId};

use super::ProgramOptions;
use crate::error::{Error, Result};

/// A train program's part in a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Accumulation {
    /// The whole step: forward, backward, update.
    #[default]
    None,
    /// The first micro-batch: its gradients written into the accumulators.
    First,
    /// A micro-batch between the first and the last: its gradients added to them.
    Add,
    /// The last micro-batch: its gradients and the accumulators' sum updates the parameters.
    Last,
}

/// Appends the end of the train program to `graph`: `grads` are (parameter name, parameter,
/// gradient) of every parameter the loss depends on; `copies` (param, derived copy state) are
/// rewritten as casts of their updated params, so they stay derived.
pub(super) fn append_update(
    graph: &mut Graph,
    options: &ProgramOptions,
    grads: &[(String, ValueId, ValueId)],
    copies: &[(ValueId, ValueId)],
) -> Result<()> {
    let accumulated = |graph: &mut Graph, name: &str, param: ValueId| -> Result<ValueId> {
        let ty = graph.value_type(param)?.clone();
        Ok(graph.input(&format!("grad_acc.{name}"), InputKind::State, ty)?)
    };
    let mut totals = Vec::with_capacity(grads.len());
    for (name, param, grad) in grads {
        let total = match options.accumulation {
            Accumulation::None => *grad,
            Accumulation::First => {
                accumulated(graph, name, *param)?;
                graph.write(&format!("grad_acc.{name}"), *grad)?;
                continue;
            }
            Accumulation::Add | Accumulation::Last => {
                let acc = accumulated(graph, name, *param)?;
                graph.op1(Op::Add, &[acc, *grad])?
            }
        };
        if options.accumulation == Accumulation::Add {
            graph.write(&format!("grad_acc.{name}"), total)?;
            continue;
        }
        totals.push((name.as_str(), *param, total));
    }
    if totals.is_empty() {
        return Ok(());
    }
    if let Some(data_parallel) = options.data_parallel {
        all_reduce_in_buckets(graph, data_parallel.bucket_bytes, &mut totals)?;
    }
    let step = graph.input("step", InputKind::Input, TensorType::new(DType::I64, [])?)?;
    let lr = graph.input("lr", InputKind::Input, TensorType::new(DType::F64, [])?)?;
    let grad_scale = match options.clip_grad_norm {
        Some(max_norm) => {
            let all: Vec<ValueId> = totals.iter().map(|(_, _, grad)| *grad).collect();
            let clipped = graph.op(Op::ClipGradNorm { max_norm }, &all)?;
            graph.output("grad_norm", clipped[0])?;
            Some(clipped[1])
        }
        None => None,
    };
    for (name, param, grad) in totals {
        let ty = graph.value_type(param)?.clone();
        let m = graph.input(&format!("adamw.m.{name}"), InputKind::State, ty.clone())?;
        let v = graph.input(&format!("adamw.v.{name}"), InputKind::State, ty.clone())?;
        let mut config = options.adamw;
        if options.decay_exempt_vectors && ty.dims().len() < 2 {
            config.weight_decay = 0.0;
        }
        let mut operands = vec![param, grad, m, v, step, lr];
        operands.extend(grad_scale);
        let updated = graph.op(Op::AdamW(config), &operands)?;
        graph.write(name, updated[0])?;
        if let Some(&(_, copy)) = copies.iter().find(|(p, _)| *p == param) {
            // In the copy's own slot, as AdamW updates the param in its own.
            let cast = graph.op1(Op::CastInto, &[copy, updated[0]])?;
            graph.write(&input_name(graph, copy)?, cast)?;
        }
        graph.write(&format!("adamw.m.{name}"), updated[1])?;
        graph.write(&format!("adamw.v.{name}"), updated[2])?;
    }
    Ok(())
}

/// Replaces each gradient of `totals` by its sum over the ranks: one `all_reduce` per bucket
/// of at most `bucket_bytes` (a larger gradient alone), filled in the order the backward makes
/// the gradients (by node), so the planner can sum a bucket while the backward goes on.
fn all_reduce_in_buckets(
    graph: &mut Graph,
    bucket_bytes: u64,
    totals: &mut [(&str, ValueId, ValueId)],
) -> Result<()> {
    let mut order: Vec<usize> = (0..totals.len()).collect();
    order.sort_by_key(|&i| totals[i].2.node.index());
    let mut buckets: Vec<Vec<usize>> = Vec::new();
    let mut filled = 0u64;
    for i in order {
        let bytes = graph.value_type(totals[i].2)?.size_bytes() as u64;
        match buckets.last_mut() {
            Some(bucket) if filled + bytes <= bucket_bytes => {
                bucket.push(i);
                filled += bytes;
            }
            _ => {
                buckets.push(vec![i]);
                filled = bytes;
            }
        }
    }
    for bucket in buckets {
        let grads: Vec<ValueId> = bucket.iter().map(|&i| totals[i].2).collect();
        let summed = graph.op(Op::AllReduce, &grads)?;
        for (&i, sum) in bucket.iter().zip(summed) {
            totals[i].2 = sum;
        }
    }
    Ok(())
}

/// The name of graph input `value`.
fn input_name(graph: &Graph, value: ValueId) -> Result<String> {
    let input = (graph.inputs().into_iter()).find(|(v, ..)| *v == value);
    let (_, name, ..) = input.ok_or_else(|| Error::Operand {
        op: "adamw",
        reason: format!("the weight copy {value} is not a graph input"),
    })?;
    Ok(name.to_string())
}
