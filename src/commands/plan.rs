//! `kiln plan`: plan a program and dump the plan as text, JSON, CSV or SVG; with `--by
//! source`, the arena bytes attributed to layer and category instead (text, JSON or a stacked
//! SVG).

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use kiln_frontend::hf::safetensors_io::{check_absent, write_file_atomically};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::memory_sources::memory_sources;
use kiln_frontend::programs::{build, plan_program, ProgramKind, ProgramOptions};
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

/// What the dump shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanView {
    /// The plan itself.
    Plan,
    /// The live arena bytes by source (layer and category).
    BySource,
}

/// Plans `kind` for `model` with workspaces sized for `workspaces`' kernels and renders
/// `view` as `format`; writes to `out` (which must not exist) or returns the text to print.
/// With `verify`, the independent plan verifier checks the plan first. With a
/// `memory_budget` (arena bytes; train programs), values the backward reads are recomputed
/// there until the plan fits, and the dump lists them.
pub fn plan(
    model: &str,
    kind: ProgramKind,
    options: &ProgramOptions,
    (plan_options, workspaces, memory_budget): (&PlanOptions, Workspaces, Option<u64>),
    (view, format): (PlanView, PlanFormat),
    out: Option<&Path>,
    verify: bool,
) -> Result<Option<String>> {
    if view == PlanView::BySource && format == PlanFormat::Csv {
        bail!("--by source renders as --format text, json or svg, not csv");
    }
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
    let (graph, plan) =
        plan_program(graph, plan_options, &workspaces, memory_budget).context("planning")?;
    let elapsed = started.elapsed();
    if verify {
        kiln_planner::verify_plan(&graph, &plan, &workspaces)
            .context("the plan failed verification")?;
    }
    let attribution = || {
        let sources = memory_sources(&graph, &plan);
        dump::attribute(&plan, |buffer| sources[buffer.id].clone())
    };
    let text = match (view, format) {
        (PlanView::BySource, PlanFormat::Text) => {
            let mut text = attribution().to_text();
            if verify {
                text.push_str("verified: the independent plan verifier accepts this plan\n");
            }
            text
        }
        (PlanView::BySource, PlanFormat::Json) => attribution().to_json(),
        (PlanView::BySource, _) => attribution().to_svg(),
        (PlanView::Plan, PlanFormat::Text) => {
            let mut text = dump::to_text(&plan, Some(elapsed));
            if verify {
                text.push_str("verified: the independent plan verifier accepts this plan\n");
            }
            text
        }
        (PlanView::Plan, PlanFormat::Json) => dump::to_json(&plan),
        (PlanView::Plan, PlanFormat::Csv) => dump::to_csv(&plan),
        (PlanView::Plan, PlanFormat::Svg) => dump::to_svg(&plan),
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
