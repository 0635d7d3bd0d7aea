//! `kiln plan`: plan a program and dump the plan as text, JSON, CSV or SVG; with `--by
//! source`, the arena bytes attributed to layer and category instead (text, JSON or a stacked
//! SVG); with `--by launches`, the launches one run issues on a CUDA device, lowered here
//! (text or JSON).

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use kiln_frontend::hf::safetensors_io::{check_absent, write_file_atomically};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::memory_sources::memory_sources;
use kiln_frontend::programs::{build, plan_program, ProgramKind, ProgramOptions};
use kiln_planner::{dump, PlanOptions};
use kiln_runtime::{LowerOptions, LoweringSummary, Workspaces};
use serde::Serialize;

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
    /// The launches one run issues on a CUDA device, by op and by kernel.
    Launches,
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
    if view == PlanView::Launches {
        if !matches!(format, PlanFormat::Text | PlanFormat::Json) {
            bail!("--by launches renders as --format text or json");
        }
        if workspaces == Workspaces::Cpu {
            bail!("--by launches lowers for CUDA: plan with --backend cuda or any, not cpu");
        }
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
        (PlanView::Launches, format) => {
            let summary = kiln_runtime::lower_for_device(&graph, &plan, LowerOptions::default())
                .context("lowering the plan for CUDA")?;
            let launches = launch_table(kind.name(), &summary);
            match format {
                PlanFormat::Json => serde_json::to_string_pretty(&launches)? + "\n",
                _ => {
                    let mut text = launches.to_text();
                    if verify {
                        text.push_str(
                            "verified: the independent plan verifier accepts this plan\n",
                        );
                    }
                    text
                }
            }
        }
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
            let what = match view {
                PlanView::Plan => "plan",
                PlanView::BySource => "plan's bytes by source",
                PlanView::Launches => "plan's launches",
            };
            eprintln!(
                "wrote the {} {what} ({} buffers, arena {} B, lower bound {} B) to {}",
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

/// The launches one run of a program issues (`kiln plan --by launches`).
#[derive(Serialize)]
struct LaunchTable {
    program: String,
    launches: usize,
    kernels: usize,
    gemms: usize,
    copies: usize,
    collectives: usize,
    /// The most launches first.
    by_op: Vec<OpLaunches>,
    /// The most launches first.
    by_launch: Vec<NamedLaunches>,
}

/// The steps of one op name that launch something, and their launches.
#[derive(Serialize)]
struct OpLaunches {
    op: String,
    steps: usize,
    launches: usize,
}

/// The launches of one kernel (`module.function`), or of the vendor GEMM, copies, collectives.
#[derive(Serialize)]
struct NamedLaunches {
    launch: String,
    launches: usize,
}

fn launch_table(program: &str, summary: &LoweringSummary) -> LaunchTable {
    let mut by_op: Vec<OpLaunches> = (summary.by_op.iter())
        .map(|(op, &(steps, launches))| OpLaunches {
            op: op.clone(),
            steps,
            launches,
        })
        .collect();
    by_op.sort_by(|a, b| b.launches.cmp(&a.launches).then_with(|| a.op.cmp(&b.op)));
    let mut by_launch: Vec<NamedLaunches> = (summary.by_launch.iter())
        .map(|(launch, &launches)| NamedLaunches {
            launch: launch.clone(),
            launches,
        })
        .collect();
    by_launch.sort_by(|a, b| (b.launches.cmp(&a.launches)).then_with(|| a.launch.cmp(&b.launch)));
    LaunchTable {
        program: program.to_string(),
        launches: summary.kernels + summary.gemms + summary.copies + summary.collectives,
        kernels: summary.kernels,
        gemms: summary.gemms,
        copies: summary.copies,
        collectives: summary.collectives,
        by_op,
        by_launch,
    }
}

impl LaunchTable {
    fn to_text(&self) -> String {
        use std::fmt::Write;
        let mut text = format!(
            "launches of one {} run on a CUDA device (lowered here, with the defaults of an sm_90 \
             device): {}\n  kernels {}, vendor GEMMs {}, copies {}, collectives {}\n\n",
            self.program, self.launches, self.kernels, self.gemms, self.copies, self.collectives
        );
        let width = (self.by_op.iter().map(|r| r.op.len()))
            .chain(self.by_launch.iter().map(|r| r.launch.len()))
            .max()
            .unwrap_or(0)
            .max(6);
        let _ = writeln!(text, "  {:width$}  {:>6}  {:>8}", "op", "steps", "launches");
        for OpLaunches {
            op,
            steps,
            launches,
        } in &self.by_op
        {
            let _ = writeln!(text, "  {op:width$}  {steps:>6}  {launches:>8}");
        }
        let _ = writeln!(
            text,
            "\n  {:width$}  {:>6}  {:>8}",
            "launch", "", "launches"
        );
        for NamedLaunches { launch, launches } in &self.by_launch {
            let _ = writeln!(text, "  {launch:width$}  {:>6}  {launches:>8}", "");
        }
        text
    }
}
