//! Tests of memory attribution on the hand-made plan (`fixture.rs`: peak step 3, 2304 B live
//! there: buffers 5, 6 and 7) and of its stacked picture.

use super::{attribute, Attribution, Category, Source};
use crate::dump::fixture::tiny_plan;
use crate::dump::svg::tests::parse_xml;
use crate::{Buffer, Plan};

/// Buffers 4 and 5 a layer's activations (5 kept for the backward), 6 a gradient, 7 the
/// logits, the workspaces scratch of the head.
fn sources(buffer: &Buffer) -> Source {
    let (category, group) = match buffer.id {
        4 => (Category::Activation, "layer 0"),
        5 => (Category::SavedActivation, "layer 0"),
        6 => (Category::Gradient, "layer 0"),
        7 => (Category::Logits, "head"),
        _ => (Category::Workspace, "head"),
    };
    Source {
        category,
        group: group.to_string(),
    }
}

fn tiny() -> (Plan, Attribution) {
    let plan = tiny_plan();
    let attribution = attribute(&plan, sources);
    (plan, attribution)
}

#[test]
fn the_peak_is_the_lower_bound_split_by_source() {
    let (plan, attribution) = tiny();
    assert_eq!(attribution.peak_step, Some(3));
    assert_eq!(attribution.peak_bytes, plan.lower_bound_bytes);
    let groups: Vec<&str> = attribution
        .at_peak
        .iter()
        .map(|g| g.group.as_str())
        .collect();
    assert_eq!(groups, ["layer 0", "head"], "in order of first appearance");
    assert_eq!(attribution.at_peak[0].bytes, [0, 1024, 512, 0, 0, 0]);
    assert_eq!(attribution.at_peak[1].bytes, [0, 0, 0, 0, 768, 0]);
    let total: u64 = attribution.at_peak.iter().map(|g| g.total).sum();
    assert_eq!(total, plan.lower_bound_bytes);
    let per_step: Vec<u64> = (attribution.per_step.iter())
        .map(|s| s.iter().sum())
        .collect();
    assert_eq!(per_step, [1024, 2048, 1792, 2304, 1280, 1280]);
    assert_eq!(
        attribution.outside_arena,
        [
            ("param", 3072),
            ("input", 64),
            ("output", 2048),
            ("state", 4096)
        ]
    );
}

#[test]
fn sizes_count_as_the_arena_holds_them() {
    let mut plan = tiny_plan();
    // 500 B take 512 B of a 256-byte aligned arena; the lower bound counts them so.
    plan.buffers[6].size = 500;
    let attribution = attribute(&plan, sources);
    assert_eq!(attribution.peak_bytes, 2304);
    assert_eq!(attribution.at_peak[0].bytes[2], 512);
}

#[test]
fn the_table_reads_and_is_deterministic() {
    let (_, attribution) = tiny();
    let text = attribution.to_text();
    assert_eq!(text, tiny().1.to_text());
    assert!(
        text.contains("peak step 3: 2.25 KiB (2304 B) live in the arena"),
        "{text}"
    );
    let total = text
        .lines()
        .find(|l| l.trim_start().starts_with("total"))
        .unwrap();
    assert!(total.ends_with("2.25 KiB"), "{text}");
    assert!(
        text.contains("outside the arena (not counted above): param 3.00 KiB"),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&attribution.to_json()).unwrap();
    assert_eq!(json["peak_bytes"], 2304);
    assert_eq!(json["categories"][1], "saved activation");
    assert_eq!(json["at_peak"][0]["bytes"][1], 1024);
}

#[test]
fn the_stacked_picture_is_well_formed_and_labelled() {
    let (_, attribution) = tiny();
    let svg = attribution.to_svg();
    let elements = parse_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    let count = |class: &str| {
        (elements.iter())
            .filter(|e| e.attribute("class") == Some(class))
            .count()
    };
    // Five categories hold bytes (no optimizer update); six legend entries.
    assert_eq!(count("category"), 5);
    assert_eq!(count("legend"), 6);
    assert_eq!(count("peak"), 1);
    for label in [
        ">schedule step<",
        ">live arena bytes<",
        ">saved activation<",
        ">logits/loss<",
    ] {
        assert!(svg.contains(label), "no {label}");
    }
    // The peak step's stack reaches the top of the plot (y = 80).
    assert!(
        svg.contains("<title>gradient: 512 B at the peak, at most 512 B</title>"),
        "{svg}"
    );
    assert!(svg.contains(" 80.00 L"), "{svg}");
}

#[test]
fn empty_and_broken_plans_give_reports() {
    let mut plan = tiny_plan();
    plan.buffers[4].end = usize::MAX;
    plan.buffers[7].size = u64::MAX;
    let attribution = attribute(&plan, sources);
    parse_xml(&attribution.to_svg()).unwrap();
    attribution.to_text();
    plan.schedule.clear();
    let attribution = attribute(&plan, sources);
    assert_eq!(attribution.peak_step, None);
    assert!(attribution.to_text().contains("the schedule is empty"));
    let svg = attribution.to_svg();
    parse_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
}
