//! `kiln compile`: trace a model into a program graph, verify it, summarize or print it.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::programs::{build, parameter_count, ProgramKind, ProgramOptions};
use kiln_ir::graph::NodeKind;
use kiln_ir::InputKind;

/// Builds `kind` for `model` and returns the text to show: the IR when `print_ir`, else a
/// summary.
pub fn compile(
    model: &str,
    kind: ProgramKind,
    options: &ProgramOptions,
    print_ir: bool,
) -> Result<String> {
    let source = ModelSource::resolve(model)?;
    let (config, _) = source.config()?;
    options.validate(kind, &config)?;
    let started = std::time::Instant::now();
    let graph =
        build(kind, &config, options).with_context(|| format!("tracing {}", kind.name()))?;
    kiln_ir::verify(&graph).context("the traced graph failed verification")?;
    let elapsed = started.elapsed();
    if print_ir {
        return Ok(kiln_ir::print(&graph));
    }
    let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
    let mut count = 0;
    for node in graph.node_indices() {
        if let Some(NodeKind::Op(op)) = graph.node(node).map(|n| &n.kind) {
            *ops.entry(op.name()).or_default() += 1;
            count += 1;
        }
    }
    let inputs = graph.inputs();
    let of = |kind: InputKind| inputs.iter().filter(|(_, _, k, _)| *k == kind).count();
    let shape = match (kind, options.cache_rows(kind, &config)) {
        (ProgramKind::Decode, Some(rows)) => format!("one token per row, cache {rows}"),
        (_, Some(rows)) => format!("seq {}, cache {rows}", options.seq),
        (_, None) => format!("seq {}", options.seq),
    };
    let mut text = format!(
        "program {} for {model} ({} parameters): batch {}, {shape}, precision {}, fusion {}\n",
        kind.name(),
        parameter_count(&config),
        options.batch,
        options.precision.name(),
        if options.fusion { "on" } else { "off" }
    );
    text += &format!(
        "  {} params, {} inputs, {} states, {count} ops, {} outputs, {} writes; traced and verified in {:.1} ms\n  ops:",
        of(InputKind::Param),
        of(InputKind::Input),
        of(InputKind::State),
        graph.outputs().len(),
        graph.writes().len(),
        elapsed.as_secs_f64() * 1e3
    );
    for (name, n) in ops {
        text += &format!(" {name}×{n}");
    }
    text.push('\n');
    Ok(text)
}
