//! `kiln plan`: plan a program and dump the plan as text, JSON, CSV or SVG.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use kiln_frontend::hf::safetensors_io::{check_absent, write_file_atomically};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_planner::{dump, PlanOptions};
use kiln_runtime::Workspaces;

/// How to render a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanFormat {
    Text,
    Json,
    Csv,
    Svg,
}

/// Plans `kind` for `model` with workspaces sized for `workspaces`' kernels and renders it;
/// writes to `out` (which must not exist) or returns the text to print. With `verify`, the
/// independent plan verifier checks the plan first.
pub fn plan(
    model: &str,
    kind: ProgramKind,
    options: &ProgramOptions,
    (plan_options, workspaces): (&PlanOptions, Workspaces),
    format: PlanFormat,
    out: Option<&Path>,
    verify: bool,
) -> Result<Option<String>> {
    plan_options.validate()?;
    if let Some(out) = out {
        // Checked again when the file is published: this only answers before the work.
        check_absent(out).map_err(|e| anyhow!("{e} (choose another --out)"))?;
    }
    let (config, _) = ModelSource::resolve(model)?.config()?;
    options.validate(kind, &config)?;
    let graph =
        build(kind, &config, options).with_context(|| format!("tracing {}", kind.name()))?;
    kiln_ir::verify(&graph).context("the traced graph failed verification")?;
    let started = std::time::Instant::now();
    let plan = kiln_planner::plan(&graph, plan_options, &workspaces).context("planning")?;
    let elapsed = started.elapsed();
    if verify {
        kiln_planner::verify_plan(&graph, &plan, &workspaces)
            .context("the plan failed verification")?;
    }
    let text = match format {
        PlanFormat::Text => {
            let mut text = dump::to_text(&plan, Some(elapsed));
            if verify {
                text.push_str("verified: the independent plan verifier accepts this plan\n");
            }
            text
        }
        PlanFormat::Json => dump::to_json(&plan),
        PlanFormat::Csv => dump::to_csv(&plan),
        PlanFormat::Svg => dump::to_svg(&plan),
    };
    match out {
        Some(out) => {
            write_file_atomically(out, text.as_bytes())?;
            eprintln!(
                "wrote the {} plan ({} buffers, arena {} B, lower bound {} B) to {}",
                kind.name(),
                plan.buffers.len(),
                plan.arena_bytes,
                plan.lower_bound_bytes,
                out.display()
            );
            Ok(None)
        }
        None => Ok(Some(text)),
    }
}
