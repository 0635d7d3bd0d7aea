//! Where a model comes from: a Hugging Face directory or a built-in preset. Everywhere kiln takes
//! `--model`, either works.

use std::path::{Path, PathBuf};

use kiln_ir::DType;

use crate::error::{Error, Result};
use crate::hf::config::load_config;
use crate::hf::presets::{preset, PRESETS};
use crate::hf::weights_io::{load_weight_shard, LoadedWeights};
use crate::model::{random_weights_as, shard_weights, ModelConfig};

/// A resolved `--model` argument.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// A directory with config.json and safetensors weights.
    Dir(PathBuf),
    /// A built-in preset: its config with seeded random weights.
    Preset(String),
}

impl ModelSource {
    /// A directory if `arg` is one, else a preset name if it is one, else an error naming both
    /// possibilities.
    pub fn resolve(arg: &str) -> Result<ModelSource> {
        if Path::new(arg).is_dir() {
            Ok(ModelSource::Dir(PathBuf::from(arg)))
        } else if PRESETS.contains(&arg) {
            Ok(ModelSource::Preset(arg.to_string()))
        } else {
            Err(Error::ModelSource {
                arg: arg.to_string(),
                known: PRESETS.join(", "),
            })
        }
    }

    /// The config and the checkpoint dtype (a preset's official dtype).
    pub fn config(&self) -> Result<(ModelConfig, DType)> {
        match self {
            ModelSource::Dir(dir) => load_config(dir),
            ModelSource::Preset(name) => preset(name),
        }
    }

    /// The config and the weights as leaves of the eager oracle in `dtype` (f32, or bf16 for
    /// bf16 inference), with the stored tensors ignored on purpose (see [`LoadedWeights`]). A
    /// preset's weights are random from `seed`, exactly what `kiln init-model --seed --dtype`
    /// writes.
    pub fn load(&self, seed: u64, dtype: DType) -> Result<(ModelConfig, LoadedWeights)> {
        self.load_shard(seed, dtype, None)
    }

    /// As [`ModelSource::load`], rank `rank`'s weights under `ranks`-way tensor parallelism
    /// (`shard`; `None`: the whole model), shaped as `config.shard(ranks)` has them (the config
    /// returned is the whole model's): a directory's files give only the rank's part of each
    /// split projection ([`load_weight_shard`]); a preset's random weights are made whole and
    /// split.
    pub fn load_shard(
        &self,
        seed: u64,
        dtype: DType,
        shard: Option<(usize, usize)>,
    ) -> Result<(ModelConfig, LoadedWeights)> {
        let (config, _) = self.config()?;
        let loaded = match self {
            ModelSource::Dir(dir) => load_weight_shard(dir, &config, dtype, shard)?,
            ModelSource::Preset(_) => {
                let whole = random_weights_as(&config, seed, dtype)?;
                LoadedWeights {
                    weights: match shard {
                        Some((rank, ranks)) => shard_weights(&config, &whole, ranks, rank)?,
                        None => whole,
                    },
                    ignored: Vec::new(),
                    non_finite: Vec::new(),
                }
            }
        };
        Ok((config, loaded))
    }
}
