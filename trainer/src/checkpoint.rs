//! Checkpoints of a run directory: `step-NNNNNN/`, each a Hugging Face model directory
//! (`config.json` + `model.safetensors`, f32, loadable by transformers and by kiln) with the
//! AdamW moments (`optimizer.safetensors`), the run's state (`trainer_state.json`: step,
//! options, data) and the source model's tokenizer files.
//!
//! A save writes everything into a hidden temporary directory beside its target, syncs each
//! file (the safetensors writer does) and the directory, and renames it into place; then
//! older checkpoints beyond the newest `keep` are removed. A process killed at any moment
//! leaves the newest complete checkpoint as it was: a `step-*` directory exists only whole.
//! A leftover temporary directory of a killed save is removed by the next save.

use std::fs;
use std::path::{Path, PathBuf};

use kiln_frontend::hf::config::{config_json, CONFIG_FILE};
use kiln_frontend::hf::safetensors_io::{
    write_file_atomically, write_safetensors, SafetensorsFile,
};
use kiln_frontend::hf::weights_io::WEIGHTS_FILE;
use kiln_frontend::model::ModelConfig;
use kiln_ir::DType;
use kiln_runtime::Tensor;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::RunOptions;

pub const STATE_FILE: &str = "trainer_state.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// Version of `trainer_state.json`.
pub const FORMAT: u32 = 1;
/// Files of a model directory a checkpoint carries along when the source has them.
pub const TOKENIZER_FILES: [&str; 6] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
];

/// What a checkpoint says about its run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    pub format: u32,
    /// Optimizer steps taken: the next step is `step + 1`, its windows those of that step.
    pub step: u64,
    pub options: RunOptions,
    pub data: DataState,
}

/// The data a run trains on, to refuse a resume on other data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataState {
    pub path: PathBuf,
    pub tokens: usize,
    pub dtype: crate::TokenDType,
    pub fingerprint: String,
}

/// The name of step `step`'s checkpoint directory.
pub fn dir_name(step: u64) -> String {
    format!("step-{step:06}")
}

/// The step of a checkpoint directory name, `None` for any other name.
fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step-")?;
    (digits.len() >= 6 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Every checkpoint of `run`, oldest first.
pub fn list(run: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    let entries = match fs::read_dir(run) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(io(run, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io(run, e))?;
        if let Some(step) = entry.file_name().to_str().and_then(step_of) {
            found.push((step, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// The newest checkpoint of `run`, if any.
pub fn latest(run: &Path) -> Result<Option<PathBuf>> {
    Ok(list(run)?.pop().map(|(_, path)| path))
}

/// Everything [`save`] writes.
pub struct Contents<'a> {
    pub config: &'a ModelConfig,
    pub params: &'a [(String, Tensor)],
    pub moments: &'a [(String, Tensor)],
    pub state: &'a TrainerState,
    /// The source model directory, whose tokenizer files are copied.
    pub source: Option<&'a Path>,
}

/// Writes checkpoint `state.step` into `run` (see the module) and returns its path.
pub fn save(run: &Path, contents: &Contents<'_>) -> Result<PathBuf> {
    let name = dir_name(contents.state.step);
    let target = run.join(&name);
    if fs::symlink_metadata(&target).is_ok() {
        return Err(Error::Checkpoint {
            path: target,
            reason: "already exists; a checkpoint is never replaced".into(),
        });
    }
    sweep_temporaries(run)?;
    let temp = run.join(format!(".{name}.tmp-{}", std::process::id()));
    fs::create_dir(&temp).map_err(|e| io(&temp, e))?;
    let written = write_contents(&temp, contents).and_then(|()| {
        sync_dir(&temp)?;
        fs::rename(&temp, &target).map_err(|e| io(&target, e))?;
        sync_dir(run)
    });
    if let Err(e) = written {
        let _ = fs::remove_dir_all(&temp);
        return Err(e);
    }
    Ok(target)
}

fn write_contents(dir: &Path, c: &Contents<'_>) -> Result<()> {
    let metadata = || Some([("format".to_string(), "pt".to_string())].into());
    write_safetensors(&dir.join(WEIGHTS_FILE), c.params, metadata())?;
    write_safetensors(&dir.join(OPTIMIZER_FILE), c.moments, metadata())?;
    write_file_atomically(
        &dir.join(CONFIG_FILE),
        config_json(c.config, DType::F32)?.as_bytes(),
    )?;
    if let Some(source) = c.source {
        for file in TOKENIZER_FILES {
            let from = source.join(file);
            if from.is_file() {
                let bytes = fs::read(&from).map_err(|e| io(&from, e))?;
                write_file_atomically(&dir.join(file), &bytes)?;
            }
        }
    }
    let json = serde_json::to_string_pretty(c.state).expect("the state serializes");
    write_file_atomically(&dir.join(STATE_FILE), json.as_bytes())?;
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<()> {
    // Some filesystems refuse to sync a directory; the files themselves are synced.
    if let Ok(handle) = fs::File::open(dir) {
        let _ = handle.sync_all();
    }
    Ok(())
}

/// Removes temporary checkpoint directories of saves that were killed (any `.step-*.tmp-*`
/// whose process is gone, or this process's own).
fn sweep_temporaries(run: &Path) -> Result<()> {
    for entry in fs::read_dir(run).map_err(|e| io(run, e))? {
        let entry = entry.map_err(|e| io(run, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((_, pid)) = name
            .strip_prefix(".step-")
            .and_then(|n| n.split_once(".tmp-"))
        else {
            continue;
        };
        let alive = pid.parse::<u32>().is_ok_and(|pid| {
            pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists()
        });
        if !alive {
            let path = entry.path();
            let removed = match path.is_dir() {
                true => fs::remove_dir_all(&path),
                false => fs::remove_file(&path),
            };
            removed.map_err(|e| io(&path, e))?;
        }
    }
    Ok(())
}

/// Removes all but the newest `keep` checkpoints of `run` (`keep` ≥ 1).
pub fn prune(run: &Path, keep: usize) -> Result<()> {
    let all = list(run)?;
    let excess = all.len().saturating_sub(keep.max(1));
    for (_, path) in &all[..excess] {
        fs::remove_dir_all(path).map_err(|e| io(path, e))?;
    }
    Ok(())
}

/// A checkpoint's state, read and checked.
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    let text = fs::read_to_string(&path).map_err(|e| Error::Checkpoint {
        path: path.clone(),
        reason: format!("{e} (not a kiln checkpoint, or an incomplete one)"),
    })?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    if state.format != FORMAT {
        return Err(Error::Checkpoint {
            path,
            reason: format!("format {} (this kiln reads format {FORMAT})", state.format),
        });
    }
    Ok(state)
}

/// The moments of `dir` for parameters of these names and shapes, `adamw.m.<name>` and
/// `adamw.v.<name>` in that order, each checked to be there with its parameter's shape.
pub fn read_moments(dir: &Path, params: &[(String, Vec<usize>)]) -> Result<Vec<(String, Tensor)>> {
    let path = dir.join(OPTIMIZER_FILE);
    if !path.is_file() {
        return Err(Error::Checkpoint {
            path,
            reason: "is missing: the checkpoint holds no optimizer state to resume from".into(),
        });
    }
    let file = SafetensorsFile::open(&path)?;
    let mut moments = Vec::with_capacity(2 * params.len());
    for (name, dims) in params {
        for moment in ["m", "v"] {
            let key = format!("adamw.{moment}.{name}");
            match file.info(&key) {
                Some((_, found)) if &found == dims => {}
                Some((_, found)) => {
                    return Err(Error::Checkpoint {
                        path: path.clone(),
                        reason: format!("`{key}` is {found:?}, its parameter {dims:?}"),
                    })
                }
                None => {
                    return Err(Error::Checkpoint {
                        path: path.clone(),
                        reason: format!("has no `{key}`"),
                    })
                }
            }
            moments.push((key.clone(), file.tensor(&key, DType::F32)?));
        }
    }
    Ok(moments)
}
