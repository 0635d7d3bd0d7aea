//! The prompts of `kiln generate --prompts FILE`: a JSONL file of `{"prompt": "text"}` or
//! `{"prompt_ids": [1, 2, 3]}` lines, or a safetensors file of integer vectors `prompt.0`,
//! `prompt.1`, … (in index order).

use std::path::Path;

use anyhow::{bail, Context, Result};
use kiln_frontend::hf::safetensors_io::SafetensorsFile;
use kiln_ir::DType;
use safetensors::Dtype;

use super::Prompt;

/// Prompt files larger than this are refused (a JSONL line per prompt).
const JSONL_LIMIT: u64 = 256 << 20;

/// The prompts of `path`, in order.
pub fn read_prompts(path: &Path) -> Result<Vec<Prompt>> {
    let prompts = match path.extension().and_then(|e| e.to_str()) {
        Some("safetensors") => from_safetensors(path)?,
        _ => from_jsonl(path)?,
    };
    if prompts.is_empty() {
        bail!("{}: holds no prompt", path.display());
    }
    Ok(prompts)
}

fn from_jsonl(path: &Path) -> Result<Vec<Prompt>> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() || meta.len() > JSONL_LIMIT {
        bail!(
            "{}: must be a regular file of at most {JSONL_LIMIT} bytes",
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut prompts = Vec::new();
    for (index, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let at = || format!("{} line {}", path.display(), index + 1);
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: not JSON", at()))?;
        let prompt = match (value.get("prompt"), value.get("prompt_ids")) {
            (Some(serde_json::Value::String(text)), None) => Prompt::Text(text.clone()),
            (None, Some(serde_json::Value::Array(ids))) => {
                let ids = (ids.iter())
                    .map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()))
                    .collect::<Option<Vec<u32>>>();
                match ids {
                    Some(ids) => Prompt::Ids(ids),
                    None => bail!("{}: `prompt_ids` must be non-negative integers", at()),
                }
            }
            _ => bail!(
                "{}: expected an object with a string `prompt` or an array `prompt_ids`",
                at()
            ),
        };
        prompts.push(prompt);
    }
    Ok(prompts)
}

fn from_safetensors(path: &Path) -> Result<Vec<Prompt>> {
    let file = SafetensorsFile::open(path)?;
    let names = file.names();
    let mut prompts = Vec::new();
    for index in 0.. {
        let name = format!("prompt.{index}");
        let Some((dtype, shape)) = file.info(&name) else {
            break;
        };
        if !matches!(dtype, Dtype::I32 | Dtype::I64) || shape.len() != 1 {
            bail!(
                "{}: `{name}` is {dtype} {shape:?}; expected a vector of integer token ids",
                path.display()
            );
        }
        let ids = file.tensor(&name, DType::I64)?.to_vec::<i64>()?;
        let ids = (ids.iter().map(|&id| u32::try_from(id).ok()))
            .collect::<Option<Vec<u32>>>()
            .with_context(|| format!("{}: `{name}` holds a negative id", path.display()))?;
        prompts.push(Prompt::Ids(ids));
    }
    if prompts.len() != names.len() {
        bail!(
            "{}: expected only tensors prompt.0, prompt.1, … (in order); it holds {}",
            path.display(),
            names.join(", ")
        );
    }
    Ok(prompts)
}
