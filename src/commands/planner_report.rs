//! `kiln planner-report`: the planner quality table for the official presets (arena against
//! the exact lower bound, against the naive sum of all activations, and planning time).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kiln_frontend::hf::presets::preset;
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_planner::{BufferClass, PlanOptions};

/// The rows: preset, program, batch, tokens per row, cache rows.
const ROWS: [(&str, ProgramKind, usize, usize, usize); 8] = [
    ("qwen2.5-0.5b", ProgramKind::Prefill, 1, 512, 512),
    ("qwen2.5-0.5b", ProgramKind::Decode, 1, 1, 512),
    ("qwen2.5-0.5b", ProgramKind::Decode, 8, 1, 512),
    ("qwen2.5-0.5b", ProgramKind::Train, 1, 512, 512),
    (
        "deepseek-r1-distill-qwen-1.5b",
        ProgramKind::Prefill,
        1,
        512,
        512,
    ),
    (
        "deepseek-r1-distill-qwen-1.5b",
        ProgramKind::Decode,
        1,
        1,
        512,
    ),
    (
        "deepseek-r1-distill-qwen-1.5b",
        ProgramKind::Decode,
        8,
        1,
        512,
    ),
    (
        "deepseek-r1-distill-qwen-1.5b",
        ProgramKind::Train,
        1,
        512,
        512,
    ),
];

fn mib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1024.0 * 1024.0))
}

/// Plans every row with `streams` streams (best planning time of `repeats` runs) and returns a
/// Markdown table.
pub fn planner_report(streams: usize, repeats: usize) -> Result<String> {
    anyhow::ensure!(repeats >= 1, "--repeats {repeats}: must be at least 1");
    let plan_options = PlanOptions {
        streams,
        ..PlanOptions::default()
    };
    plan_options.validate()?;
    let mut table = String::new();
    writeln!(
        table,
        "| preset | program | batch | seq | streams | ops | arena MiB | lower bound MiB | arena / lower bound | naive sum MiB | planning ms |"
    )?;
    writeln!(table, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    for (name, kind, batch, seq, max_seq) in ROWS {
        let (config, _) = preset(name)?;
        let options = ProgramOptions {
            batch,
            seq,
            max_seq: Some(max_seq),
            ..ProgramOptions::default()
        };
        let graph = build(kind, &config, &options)
            .with_context(|| format!("tracing {name} {}", kind.name()))?;
        let mut best = Duration::MAX;
        let mut planned = None;
        for _ in 0..repeats {
            let started = Instant::now();
            let plan = kiln_planner::plan(&graph, &plan_options, &kiln_runtime::Workspaces::Any)?;
            best = best.min(started.elapsed());
            planned = Some(plan);
        }
        let plan = planned.context("no plan")?;
        kiln_planner::verify_plan(&graph, &plan, &kiln_runtime::Workspaces::Any)?;
        // What one allocation per activation and workspace would take.
        let naive: u64 = plan
            .buffers
            .iter()
            .filter(|b| matches!(b.class, BufferClass::Activation | BufferClass::Workspace))
            .map(|b| b.size)
            .sum();
        let shown_seq = if kind == ProgramKind::Decode {
            format!("1 (context {max_seq})")
        } else {
            seq.to_string()
        };
        writeln!(
            table,
            "| {name} | {} | {batch} | {shown_seq} | {streams} | {} | {} | {} | {:.4} | {} | {:.1} |",
            kind.name(),
            plan.schedule.len(),
            mib(plan.arena_bytes),
            mib(plan.lower_bound_bytes),
            plan.arena_bytes as f64 / plan.lower_bound_bytes.max(1) as f64,
            mib(naive),
            best.as_secs_f64() * 1e3
        )?;
    }
    Ok(table)
}
