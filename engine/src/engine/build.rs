//! Compiling engines: every bucket's program of one or more engines, planned and bound into
//! ONE executable group — the weights once, one arena of the largest plan's bytes, and each
//! engine's own KV pool (its cache states named apart).

use std::collections::BTreeMap;

use kiln_frontend::model::{
    parameter_shapes, shard_parameter, sharded_config, ModelConfig, ModelWeights,
};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::{Graph, InputKind};
use kiln_runtime::{Backend, Executable, Tensor};

use super::{Engine, EngineMemory, EngineOptions};
use crate::error::{Error, Result};

/// One engine's programs before they are compiled.
struct Programs {
    graphs: Vec<Graph>,
    /// (batch, length) → index into `graphs`.
    prefill: BTreeMap<(usize, usize), usize>,
    /// batch → index into `graphs`.
    decode: BTreeMap<usize, usize>,
}

impl Engine {
    /// Compiles every bucket's program for `config` on `backend` into one group and sets the
    /// weights and an empty pool. A tensor-parallel rank takes the whole model's weights (it
    /// keeps its part of each) or its part alone, as `ModelSource::load_shard` reads it.
    pub fn new(
        model: (&ModelConfig, &ModelWeights<Var>),
        backend: &Backend,
        options: EngineOptions,
    ) -> Result<Self> {
        let mut engines = Engine::group(model, backend, vec![options])?;
        engines.pop().ok_or_else(|| Error::Generate {
            reason: "the engine group compiled no engine".to_string(),
        })
    }

    /// Engines of one model, one per `options`, compiled into ONE group: they share the
    /// weights and the arena, and each has its own KV pool. Their runs never overlap (one
    /// caller steps them in turn).
    pub fn group(
        (config, weights): (&ModelConfig, &ModelWeights<Var>),
        backend: &Backend,
        options: Vec<EngineOptions>,
    ) -> Result<Vec<Self>> {
        let several = options.len() > 1;
        let mut all = Vec::with_capacity(options.len());
        for (index, options) in options.iter().enumerate() {
            check_options(options)?;
            let prefix = if several {
                format!("pool{index}.")
            } else {
                String::new()
            };
            all.push(programs(config, options, &prefix)?);
        }
        let workspaces = backend.workspaces();
        let graphs: Vec<&Graph> = all.iter().flat_map(|p| &p.graphs).collect();
        let plans = (graphs.iter())
            .map(|graph| kiln_planner::plan(graph, &Default::default(), &workspaces))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let pairs: Vec<_> = graphs.iter().copied().zip(&plans).collect();
        let group = backend.compile_group(&pairs)?;
        let mut executables = group.executables.into_iter();
        let mut engines = Vec::with_capacity(all.len());
        for (programs, options) in all.into_iter().zip(options) {
            let mut own: Vec<Box<dyn Executable>> =
                executables.by_ref().take(programs.graphs.len()).collect();
            let first = own.first_mut().ok_or_else(|| Error::Generate {
                reason: "an engine compiled no program".to_string(),
            })?;
            if engines.is_empty() {
                // A rank takes the whole model's weights, split here, or its own part
                // already (`ModelSource::load_shard`: only that part was read).
                let own = match options.tensor_parallel {
                    Some((_, ranks)) => sharded_config(config, ranks)?,
                    None => config.clone(),
                };
                let shapes: BTreeMap<String, Vec<usize>> =
                    parameter_shapes(&own).into_iter().collect();
                for (name, var) in weights.named() {
                    let value = var.value();
                    match options.tensor_parallel {
                        Some((rank, ranks))
                            if shapes.get(&name).map(Vec::as_slice) != Some(value.dims()) =>
                        {
                            first.set(&name, &shard_parameter(&name, value, ranks, rank)?)?
                        }
                        _ => first.set(&name, value)?,
                    }
                }
            }
            let mut allocated = 0;
            for (_, name, kind, ty) in programs.graphs[0].inputs() {
                if kind == InputKind::State {
                    let empty =
                        Tensor::zeros(ty.shape.clone(), ty.dtype, kiln_runtime::Device::Cpu);
                    first.set(name, &empty)?;
                    allocated += ty.size_bytes() as u64;
                }
            }
            let pool_bytes = pool_bytes(config, &options);
            if allocated != pool_bytes {
                return Err(Error::Generate {
                    reason: format!(
                        "the KV pool took {allocated} bytes where its formula gives {pool_bytes}"
                    ),
                });
            }
            let memory = EngineMemory {
                group: group.memory.clone(),
                pool_bytes,
                programs: programs.graphs.len(),
            };
            engines.push(Engine {
                config: config.clone(),
                options,
                executables: own,
                prefill: programs.prefill,
                decode: programs.decode,
                memory,
            });
        }
        Ok(engines)
    }
}

/// Every bucket's program of one engine, its caches named with `prefix`.
fn programs(config: &ModelConfig, options: &EngineOptions, prefix: &str) -> Result<Programs> {
    let mut out = Programs {
        graphs: Vec::new(),
        prefill: BTreeMap::new(),
        decode: BTreeMap::new(),
    };
    let program = |kind, (batch, seq)| {
        let program_options = ProgramOptions {
            batch,
            seq,
            max_seq: Some(options.max_seq),
            pool: Some(options.slots),
            cache_prefix: prefix.to_string(),
            precision: options.precision,
            tensor_parallel: options.tensor_parallel.map(|(_, ranks)| ranks),
            ..ProgramOptions::default()
        };
        build(kind, config, &program_options)
    };
    for &batch in &options.prefill_batches {
        for &length in &options.prefill_lengths {
            out.prefill.insert((batch, length), out.graphs.len());
            out.graphs
                .push(program(ProgramKind::Prefill, (batch, length))?);
        }
    }
    for &batch in &options.decode_batches {
        out.decode.insert(batch, out.graphs.len());
        out.graphs.push(program(ProgramKind::Decode, (batch, 1))?);
    }
    Ok(out)
}

/// Refuses buckets that cannot serve the pool: empty or unsorted lists, a bucket of 0, a batch
/// bucket past the pool, a length bucket past a slot.
fn check_options(options: &EngineOptions) -> Result<()> {
    let refuse = |reason: String| Err(Error::Generate { reason });
    if let Some((rank, ranks)) = options.tensor_parallel {
        if rank >= ranks {
            return refuse(format!(
                "rank {rank} is not one of {ranks} tensor-parallel ranks"
            ));
        }
    }
    if options.slots == 0 || options.max_seq == 0 {
        return refuse("an engine needs at least one slot of at least one position".into());
    }
    let lists = [
        ("prefill lengths", &options.prefill_lengths, options.max_seq),
        ("prefill batches", &options.prefill_batches, options.slots),
        ("decode batches", &options.decode_batches, options.slots),
    ];
    for (what, list, most) in lists {
        let ascending = list.windows(2).all(|w| w[0] < w[1]);
        if list.is_empty() || !ascending || list[0] == 0 || list[list.len() - 1] > most {
            return refuse(format!(
                "{what} {list:?}: need one or more ascending sizes from 1 to {most}"
            ));
        }
    }
    Ok(())
}

/// The KV pool's bytes: layers × 2 (keys, values) × slots × Hkv × max_seq × D × element (a
/// tensor-parallel rank's share of the heads).
pub fn pool_bytes(config: &ModelConfig, options: &EngineOptions) -> u64 {
    let element = options.precision.weight_dtype().size_bytes();
    let ranks = options.tensor_parallel.map_or(1, |(_, ranks)| ranks.max(1));
    let dims = [
        2 * config.num_hidden_layers,
        options.slots,
        config.num_key_value_heads / ranks,
        options.max_seq,
        config.head_dim,
    ];
    dims.iter()
        .fold(element as u64, |bytes, &n| bytes.saturating_mul(n as u64))
}
