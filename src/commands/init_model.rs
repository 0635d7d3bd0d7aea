//! `kiln init-model`: a preset written as a Hugging Face model directory.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use kiln_frontend::hf::config::{config_json, CONFIG_FILE};
use kiln_frontend::hf::presets::preset;
use kiln_frontend::hf::safetensors_io::{check_absent, write_file_atomically, write_safetensors};
use kiln_frontend::hf::weights_io::{WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use kiln_frontend::model::{parameter_shapes, random_parameters};
use kiln_ir::DType;

/// Writes `out/config.json` and `out/model.safetensors` for `preset_name` with weights drawn
/// from `seed` (the same weights `--model PRESET --seed` uses). Refuses a directory that
/// already holds either file or a shard index (anything at those names, a dangling symbolic
/// link included), before the work and again when each file is published.
pub fn init_model(preset_name: &str, seed: u64, out: &Path, dtype: Option<DType>) -> Result<()> {
    let (config, official_dtype) = preset(preset_name)?;
    let dtype = dtype.unwrap_or(official_dtype);
    for file in [CONFIG_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE] {
        check_absent(&out.join(file)).map_err(|e| anyhow!("{e} (choose another --out)"))?;
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;

    let count = parameter_shapes(&config).len() as u64;
    let bar = ProgressBar::new(count).with_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} tensors {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("generating");
    let tensors = random_parameters(&config, seed, dtype, |_| bar.inc(1))?;
    bar.set_message("writing");
    let weights_path = out.join(WEIGHTS_FILE);
    let metadata = [("format".to_string(), "pt".to_string())].into();
    write_safetensors(&weights_path, &tensors, Some(metadata))?;
    let json = config_json(&config, dtype)?;
    write_file_atomically(&out.join(CONFIG_FILE), json.as_bytes())?;
    bar.finish_and_clear();
    let params: usize = tensors.iter().map(|(_, t)| t.numel()).sum();
    println!(
        "wrote {} ({} tensors, {} parameters, {dtype}, seed {seed}) and config.json to {}",
        preset_name,
        tensors.len(),
        params,
        out.display()
    );
    Ok(())
}
