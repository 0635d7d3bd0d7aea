//! A model's weights in a Hugging Face directory.
//!
//! Loading reads `model.safetensors`, or else the sharded form: `model.safetensors.index.json`
//! (`{"metadata": {...}, "weight_map": {tensor name: shard file name}}`) and the shards it
//! names, which must be plain file names inside the directory. Before any tensor is converted,
//! the whole set is checked against [`parameter_shapes`]: every parameter present with its
//! shape and a float dtype, nothing extra (a tied model may carry an `lm_head.weight` shaped
//! like the embedding; it is ignored, as transformers ties it; old checkpoints carry RoPE's
//! `model.layers.{i}.self_attn.rotary_emb.inv_freq` buffers, which transformers ignores on load
//! and kiln ignores too, reporting them in [`LoadedWeights::ignored`]), the index and the shards
//! in agreement. Problems are reported in a fixed order: parameters in [`parameter_shapes`] order,
//! then unexpected tensors by name.
//!
//! Saving writes a new `model.safetensors` atomically under the Hugging Face names, with the
//! `{"format": "pt"}` metadata transformers expects; an existing one is never replaced.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path};

use kiln_ir::{DType, Shape};
use kiln_runtime::Tensor;

use crate::autograd::Var;
use crate::error::{Error, Result};
use crate::hf::files::{read_text, INDEX_LIMIT};
use crate::hf::safetensors_io::{write_safetensors_as, OrderedEntries, SafetensorsFile};
use crate::model::{parameter_shapes, shard_part, sharded_config, ModelConfig, ModelWeights};

/// The single-file weights of a Hugging Face directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The shard index of a Hugging Face directory with sharded weights.
pub const WEIGHTS_INDEX_FILE: &str = "model.safetensors.index.json";

/// Weights loaded from a directory, and the stored tensors ignored on purpose.
#[derive(Clone, Debug)]
pub struct LoadedWeights {
    pub weights: ModelWeights<Var>,
    /// Stored tensors transformers ignores too (RoPE inverse frequencies of old checkpoints),
    /// sorted: the caller tells the user (see [`LoadedWeights::note`]).
    pub ignored: Vec<String>,
    /// Parameters holding NaN or infinite values, in parameter order: (name, NaNs,
    /// infinities). They flow into every output; the caller warns (see
    /// [`LoadedWeights::warning`]).
    pub non_finite: Vec<(String, usize, usize)>,
}

impl LoadedWeights {
    /// One line naming the ignored tensors, or `None` if none were.
    pub fn note(&self) -> Option<String> {
        let names = &self.ignored;
        let listed = match names.as_slice() {
            [] => return None,
            [first, second, .., last] if names.len() > 4 => {
                format!("{first}, {second}, ..., {last} ({} in all)", names.len())
            }
            _ => names.join(", "),
        };
        Some(format!(
            "ignored stored tensors that transformers ignores too (RoPE inverse frequencies; \
             kiln computes them from rope_theta): {listed}"
        ))
    }

    /// One line naming the parameters that hold NaN or infinite values, or `None`.
    pub fn warning(&self) -> Option<String> {
        if self.non_finite.is_empty() {
            return None;
        }
        let listed: Vec<String> = (self.non_finite.iter().take(4))
            .map(|(name, nans, infinities)| format!("{name} ({nans} NaN, {infinities} infinite)"))
            .collect();
        let more = match self.non_finite.len() {
            n if n > 4 => format!(" and {} more", n - 4),
            _ => String::new(),
        };
        Some(format!(
            "weights hold non-finite values, which flow into every output: {}{more}",
            listed.join(", ")
        ))
    }
}

/// (NaNs, infinities) among the elements of a loaded parameter (f32 or f64).
fn count_non_finite(tensor: &Tensor) -> Result<(usize, usize)> {
    /// (NaNs, infinities) among values whose bits have `exponent` all ones where a value is
    /// not finite, and `mantissa` nonzero where it is a NaN.
    fn count<T: Copy + Into<u64>>(bits: &[T], exponent: u64, mantissa: u64) -> (usize, usize) {
        let special = |b: u64| b & exponent == exponent;
        // One pass that vectorizes; the split into NaNs and infinities only when needed.
        let specials: usize = bits.iter().map(|&b| usize::from(special(b.into()))).sum();
        if specials == 0 {
            return (0, 0);
        }
        let nans = (bits.iter().map(|&b| b.into()))
            .filter(|&b| special(b) && b & mantissa != 0)
            .count();
        (nans, specials - nans)
    }
    let counted = tensor.read_with(|view| match view.dtype() {
        DType::F32 => (view.slice::<f32>("load_weights", "weight")).map(|v| {
            count(
                bytemuck::cast_slice::<f32, u32>(v),
                0x7f80_0000,
                0x007f_ffff,
            )
        }),
        DType::BF16 => (view.slice::<half::bf16>("load_weights", "weight"))
            .map(|v| count(bytemuck::cast_slice::<half::bf16, u16>(v), 0x7f80, 0x007f)),
        _ => (view.slice::<f64>("load_weights", "weight")).map(|v| {
            let bits = bytemuck::cast_slice::<f64, u64>(v);
            count(bits, 0x7ff0_0000_0000_0000, 0x000f_ffff_ffff_ffff)
        }),
    })?;
    Ok(counted?)
}

/// Loads and checks the weights in `dir` for `config`, each converted to `dtype` (f32 or f64 to
/// compute in; bf16 for bf16 inference, which reads a bf16 file as it is stored) and made a
/// parameter leaf.
pub fn load_weights(dir: &Path, config: &ModelConfig, dtype: DType) -> Result<LoadedWeights> {
    load_weight_shard(dir, config, dtype, None)
}

/// Rank `rank`'s weights under `ranks`-way tensor parallelism (`shard`; `None`: the whole
/// model, [`load_weights`]), loaded and checked as [`load_weights`] does: the files are
/// checked against the whole model, but of each split projection only the rank's part
/// ([`shard_part`]) is copied out of the files and converted. The weights are shaped as
/// `config.shard(ranks)` has them, equal to [`shard_weights`](crate::model::shard_weights) of
/// the whole model's; their non-finite counts are the rank's part's.
pub fn load_weight_shard(
    dir: &Path,
    config: &ModelConfig,
    dtype: DType,
    shard: Option<(usize, usize)>,
) -> Result<LoadedWeights> {
    if !matches!(dtype, DType::F32 | DType::F64 | DType::BF16) {
        return Err(Error::Unsupported {
            path: dir.display().to_string(),
            field: "dtype".into(),
            value: dtype.to_string(),
            reason: "weights load as f32, f64 or bf16".into(),
        });
    }
    let sources = Sources::open(dir)?;
    let ignored = sources.check(config)?;
    let built = match shard {
        Some((_, ranks)) => sharded_config(config, ranks)?,
        None => config.clone(),
    };
    let mut decoded = sources.decode_all(&parameter_shapes(config), dtype, shard)?;
    let mut non_finite = Vec::new();
    let weights = ModelWeights::build(&built, |name, dims| {
        let (tensor, (nans, infinities)) =
            decoded.remove(name).ok_or_else(|| Error::MissingTensor {
                path: sources.listing.clone(),
                name: name.to_string(),
                expected: shape_text(dims),
            })?;
        if nans + infinities > 0 {
            non_finite.push((name.to_string(), nans, infinities));
        }
        Var::leaf(tensor)
    })?;
    Ok(LoadedWeights {
        weights,
        ignored,
        non_finite,
    })
}

/// Writes `weights` to a new `dir/model.safetensors` (creating `dir` if needed) under their
/// Hugging Face names, converted to the float `dtype` (f32, bf16 or f16 for transformers; f64
/// too), atomically; an existing file is refused ([`Error::AlreadyExists`]) and left as it was.
pub fn save_weights(dir: &Path, weights: &ModelWeights<Var>, dtype: DType) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::Unsupported {
            path: dir.display().to_string(),
            field: "dtype".into(),
            value: dtype.to_string(),
            reason: "weights are saved as floats: f32, bf16, f16 or f64".into(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|e| Error::Io {
        path: dir.display().to_string(),
        reason: format!("cannot create the directory: {e}"),
    })?;
    let tensors: Vec<(String, Tensor)> = weights
        .named()
        .into_iter()
        .map(|(name, var)| (name, var.value().clone()))
        .collect();
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_as(&dir.join(WEIGHTS_FILE), &tensors, dtype, Some(metadata))
}

/// A tensor and its (NaN, infinity) counts.
type Counted = (Tensor, (usize, usize));

/// The opened weight files and which one holds each tensor.
struct Sources {
    files: Vec<SafetensorsFile>,
    /// Tensor name → index into `files`.
    owner: BTreeMap<String, usize>,
    /// The file that lists the tensors (the single file or the index), named when one is
    /// missing.
    listing: String,
}

impl Sources {
    fn open(dir: &Path) -> Result<Sources> {
        let single = dir.join(WEIGHTS_FILE);
        if single.exists() {
            let file = SafetensorsFile::open(&single)?;
            let owner = file.names().into_iter().map(|name| (name, 0)).collect();
            return Ok(Sources {
                files: vec![file],
                owner,
                listing: single.display().to_string(),
            });
        }
        let index = dir.join(WEIGHTS_INDEX_FILE);
        if index.exists() {
            return Self::open_sharded(dir, &index);
        }
        Err(Error::Io {
            path: dir.display().to_string(),
            reason: format!("no weights: neither {WEIGHTS_FILE} nor {WEIGHTS_INDEX_FILE} exists"),
        })
    }

    /// Opens every shard the index names and checks that index and shards agree.
    fn open_sharded(dir: &Path, index: &Path) -> Result<Sources> {
        let listing = index.display().to_string();
        let malformed = |reason: String| Error::Safetensors {
            path: listing.clone(),
            reason,
        };
        let weight_map = read_index(index).map_err(&malformed)?;
        let mut mapped = BTreeMap::new();
        for (name, shard) in weight_map {
            if !is_plain_file_name(&shard) {
                return Err(malformed(format!(
                    "tensor `{name}` maps to shard \"{shard}\", which is not a plain file name \
                     inside the model directory"
                )));
            }
            if mapped.insert(name.clone(), shard).is_some() {
                return Err(malformed(format!(
                    "tensor `{name}` is listed twice in weight_map"
                )));
            }
        }

        let shard_names: BTreeSet<&String> = mapped.values().collect();
        let mut files = Vec::with_capacity(shard_names.len());
        let mut owner: BTreeMap<String, usize> = BTreeMap::new();
        for shard in shard_names {
            let file = SafetensorsFile::open(&dir.join(shard))?;
            for name in file.names() {
                if let Some(&other) = owner.get(&name) {
                    return Err(malformed(format!(
                        "tensor `{name}` is stored in two shards: {} and {shard}",
                        shard_file_name(&files[other])
                    )));
                }
                owner.insert(name, files.len());
            }
            files.push(file);
        }

        for (name, shard) in &mapped {
            match owner.get(name).map(|&i| &files[i]) {
                Some(file) if shard_file_name(file) == *shard => {}
                found => {
                    let elsewhere = found
                        .map(|file| format!(" (it is in {})", shard_file_name(file)))
                        .unwrap_or_default();
                    return Err(Error::Safetensors {
                        path: dir.join(shard).display().to_string(),
                        reason: format!(
                            "tensor `{name}` is listed in {WEIGHTS_INDEX_FILE} for this shard \
                             but absent from it{elsewhere}"
                        ),
                    });
                }
            }
        }
        if let Some((name, &i)) = owner.iter().find(|(name, _)| !mapped.contains_key(*name)) {
            return Err(Error::Safetensors {
                path: files[i].path().display().to_string(),
                reason: format!("tensor `{name}` is in this shard but not in {WEIGHTS_INDEX_FILE}"),
            });
        }
        Ok(Sources {
            files,
            owner,
            listing,
        })
    }

    fn file_of(&self, name: &str) -> Option<&SafetensorsFile> {
        self.owner.get(name).map(|&i| &self.files[i])
    }

    /// Every tensor of `shapes` the files hold, read as `dtype`, with its (NaN, infinity)
    /// counts. One thread per core takes the tensors largest first: the copies out of the
    /// memory map, and the page faults of the memory they fill, are most of a load. The first
    /// error in `shapes` order is returned.
    fn decode_all(
        &self,
        shapes: &[(String, Vec<usize>)],
        dtype: DType,
        shard: Option<(usize, usize)>,
    ) -> Result<BTreeMap<String, Counted>> {
        let mut order: Vec<(usize, &str)> = (shapes.iter().enumerate())
            .filter(|(_, (name, _))| self.file_of(name).is_some())
            .map(|(index, (name, _))| (index, name.as_str()))
            .collect();
        let elements = |index: usize| shapes[index].1.iter().product::<usize>();
        order.sort_by_key(|&(index, _)| std::cmp::Reverse(elements(index)));
        let next = std::sync::atomic::AtomicUsize::new(0);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        type Decoded = (usize, String, Result<Counted>);
        let decoded: Vec<Decoded> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads.min(order.len()))
                .map(|_| {
                    scope.spawn(|| {
                        let mut out = Vec::new();
                        loop {
                            let at = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            let Some(&(index, name)) = order.get(at) else {
                                return out;
                            };
                            let file = self.file_of(name).expect("filtered above");
                            let part = match shard {
                                Some((rank, ranks)) => {
                                    shard_part(name, &shapes[index].1, ranks, rank)
                                }
                                None => Ok(None),
                            };
                            let read = part.and_then(|part| match part {
                                Some(part) => file.tensor_part(name, dtype, part),
                                None => file.tensor(name, dtype),
                            });
                            let read = read.and_then(|tensor| {
                                let counts = count_non_finite(&tensor)?;
                                Ok((tensor, counts))
                            });
                            out.push((index, name.to_string(), read));
                        }
                    })
                })
                .collect();
            (workers.into_iter())
                .flat_map(|w| w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let mut all = BTreeMap::new();
        let mut first_error: Option<(usize, Error)> = None;
        for (index, name, read) in decoded {
            match read {
                Ok(value) => {
                    all.insert(name, value);
                }
                Err(e) if first_error.as_ref().is_none_or(|(at, _)| index < *at) => {
                    first_error = Some((index, e));
                }
                Err(_) => {}
            }
        }
        match first_error {
            Some((_, e)) => Err(e),
            None => Ok(all),
        }
    }

    /// Every parameter present with its shape and a float dtype (in parameter order), then no
    /// unexpected tensor (by name). Returns the tensors ignored as transformers ignores them.
    fn check(&self, config: &ModelConfig) -> Result<Vec<String>> {
        let expected = parameter_shapes(config);
        for (name, dims) in &expected {
            let found = self
                .file_of(name)
                .and_then(|file| Some((file, file.info(name)?)));
            let Some((file, (stored, shape))) = found else {
                return Err(Error::MissingTensor {
                    path: self.listing.clone(),
                    name: name.clone(),
                    expected: shape_text(dims),
                });
            };
            check_tensor(file, name, stored, &shape, dims)?;
        }
        let names: BTreeSet<&str> = expected.iter().map(|(name, _)| name.as_str()).collect();
        let mut ignored = Vec::new();
        for (name, &i) in &self.owner {
            if names.contains(name.as_str()) {
                continue;
            }
            if is_rope_buffer(name, config) {
                ignored.push(name.clone());
                continue;
            }
            let file = &self.files[i];
            if name == "lm_head.weight" && config.tie_word_embeddings {
                // transformers ties the head to the embedding and ignores a stored copy.
                if let Some((stored, shape)) = file.info(name) {
                    let embedding = [config.vocab_size, config.hidden_size];
                    check_tensor(file, name, stored, &shape, &embedding)?;
                }
                continue;
            }
            return Err(Error::UnexpectedTensor {
                path: file.path().display().to_string(),
                name: name.clone(),
            });
        }
        Ok(ignored)
    }
}

/// `model.layers.{i}.self_attn.rotary_emb.inv_freq` for a layer of `config`: a buffer older
/// transformers saved and now ignores on load (it is recomputed from `rope_theta`).
fn is_rope_buffer(name: &str, config: &ModelConfig) -> bool {
    name.strip_prefix("model.layers.")
        .and_then(|rest| rest.split_once('.'))
        .is_some_and(|(layer, rest)| {
            rest == "self_attn.rotary_emb.inv_freq"
                && layer.bytes().all(|b| b.is_ascii_digit())
                && layer
                    .parse::<usize>()
                    .is_ok_and(|i| i < config.num_hidden_layers)
        })
}

/// One tensor's stored shape and dtype against what the config expects.
fn check_tensor(
    file: &SafetensorsFile,
    name: &str,
    stored: safetensors::Dtype,
    shape: &[usize],
    expected: &[usize],
) -> Result<()> {
    use safetensors::Dtype as S;
    let path = || file.path().display().to_string();
    if shape != expected {
        return Err(Error::TensorShape {
            path: path(),
            name: name.to_string(),
            expected: shape_text(expected),
            found: shape_text(shape),
        });
    }
    if !matches!(stored, S::F32 | S::F64 | S::BF16 | S::F16) {
        return Err(Error::TensorDType {
            path: path(),
            name: name.to_string(),
            expected: "a float dtype (F32, F64, BF16 or F16)".into(),
            found: stored.to_string(),
        });
    }
    Ok(())
}

/// The index's `weight_map` entries in file order (duplicates kept, to be reported); the error
/// is the reason in words.
fn read_index(index: &Path) -> Result<Vec<(String, String)>, String> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: OrderedEntries<String>,
    }
    let text =
        read_text(index, INDEX_LIMIT).map_err(|e| format!("cannot read the shard index: {e}"))?;
    match serde_json::from_str::<Index>(&text) {
        Ok(index) => Ok(index.weight_map.0),
        Err(e) if e.is_data() => Err(format!(
            "the shard index must be {{\"weight_map\": {{tensor name: shard file name}}, ...}}: \
             {e}"
        )),
        Err(e) => Err(format!("the shard index is not valid JSON: {e}")),
    }
}

/// A single normal path component: no separator, not `.` or `..`, not absolute.
fn is_plain_file_name(name: &str) -> bool {
    let mut components = Path::new(name).components();
    !name.contains(['/', '\\'])
        && matches!(components.next(), Some(Component::Normal(_)))
        && components.next().is_none()
}

/// The shard's file name as the index spells it.
fn shard_file_name(file: &SafetensorsFile) -> String {
    file.path()
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// `[2,3]`: how errors name a shape.
fn shape_text(dims: &[usize]) -> String {
    Shape::new(dims).to_string()
}

#[cfg(test)]
#[path = "weights_io_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "weights_io_shard_tests.rs"]
mod shard_tests;

#[cfg(test)]
#[path = "weights_io_ignored_tests.rs"]
mod ignored_tests;

#[cfg(test)]
#[path = "weights_io_parallel_tests.rs"]
mod parallel_tests;
