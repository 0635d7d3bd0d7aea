//! `kiln plan --by source`: the arena bytes at the peak attributed to layer and category add up
//! to the plan's peak of live bytes exactly, on the tiny train program (snapshot of the table)
//! and on an official preset's train step; a forward-only program holds no gradients.

use kiln_frontend::hf::presets::preset;
use kiln_frontend::memory_sources::memory_sources;
use kiln_frontend::model::ModelConfig;
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_planner::dump::{attribute, Attribution, Category};
use kiln_planner::PlanOptions;
use kiln_runtime::Workspaces;

fn attribution(config: &ModelConfig, kind: ProgramKind, options: &ProgramOptions) -> Attribution {
    let graph = build(kind, config, options).unwrap();
    let plan = kiln_planner::plan(&graph, &PlanOptions::default(), &Workspaces::Any).unwrap();
    let sources = memory_sources(&graph, &plan);
    assert_eq!(sources.len(), plan.buffers.len());
    let attribution = attribute(&plan, |buffer| sources[buffer.id].clone());
    let at_peak: u64 = attribution.at_peak.iter().map(|g| g.total).sum();
    assert_eq!(
        attribution.peak_bytes,
        plan.lower_bound_bytes,
        "{}",
        kind.name()
    );
    assert_eq!(at_peak, plan.lower_bound_bytes, "{}", kind.name());
    assert!(
        attribution.at_peak.iter().all(|g| g.group != "unknown"),
        "every buffer has a source"
    );
    attribution
}

/// Bytes of `category` at the peak, over every group.
fn at_peak(attribution: &Attribution, category: Category) -> u64 {
    (attribution.at_peak.iter())
        .map(|g| g.bytes[category as usize])
        .sum()
}

/// The most bytes of `category` live at one step.
fn most(attribution: &Attribution, category: Category) -> u64 {
    (attribution.per_step.iter())
        .map(|s| s[category as usize])
        .max()
        .unwrap_or(0)
}

#[test]
fn tiny_train_by_source() {
    let options = ProgramOptions {
        batch: 2,
        seq: 4,
        max_seq: Some(8),
        ..Default::default()
    };
    let attribution = attribution(&ModelConfig::tiny(), ProgramKind::Train, &options);
    for category in [
        Category::SavedActivation,
        Category::Gradient,
        Category::Logits,
    ] {
        assert!(most(&attribution, category) > 0, "{category:?}");
    }
    let groups: Vec<&str> = attribution
        .at_peak
        .iter()
        .map(|g| g.group.as_str())
        .collect();
    assert_eq!(groups, ["embed", "layer 0", "layer 1", "head"]);
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!("attribution_tiny_train", attribution.to_text());
    });
}

#[test]
fn an_official_train_step_adds_up_to_its_peak() {
    let (config, _) = preset("qwen2.5-0.5b").unwrap();
    let options = ProgramOptions {
        batch: 1,
        seq: 512,
        max_seq: Some(512),
        ..Default::default()
    };
    let attribution = attribution(&config, ProgramKind::Train, &options);
    // Every layer keeps activations for the backward, and they are most of the peak.
    let layers = (attribution.at_peak.iter())
        .filter(|g| {
            g.group.starts_with("layer ") && g.bytes[Category::SavedActivation as usize] > 0
        })
        .count();
    assert_eq!(layers, config.num_hidden_layers);
    assert!(at_peak(&attribution, Category::SavedActivation) > attribution.peak_bytes / 2);
    assert!(
        at_peak(&attribution, Category::Logits) > 0,
        "the logits are live at the peak"
    );
}

#[test]
fn a_forward_program_holds_no_gradients() {
    let options = ProgramOptions {
        batch: 2,
        seq: 4,
        max_seq: Some(8),
        ..Default::default()
    };
    let attribution = attribution(&ModelConfig::tiny(), ProgramKind::Prefill, &options);
    for category in [
        Category::SavedActivation,
        Category::Gradient,
        Category::Optimizer,
    ] {
        assert_eq!(most(&attribution, category), 0, "{category:?}");
    }
    assert!(most(&attribution, Category::Activation) > 0);
}
