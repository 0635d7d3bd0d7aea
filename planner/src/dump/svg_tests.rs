//! Tests of the SVG dump, with a small XML well-formedness checker (tags balanced, one root,
//! attributes quoted and unique, no stray `<` or `&`, no characters XML forbids).

use super::{escape, tick_1_2_5, tick_power_of_two, to_svg};
use crate::dump::fixture::tiny_plan;

/// A start tag: its name and attributes (values as written, entities not expanded).
#[derive(Debug)]
pub(crate) struct Element {
    pub(crate) name: String,
    attributes: Vec<(String, String)>,
}

impl Element {
    pub(crate) fn attribute(&self, key: &str) -> Option<&str> {
        let (_, value) = self.attributes.iter().find(|(k, _)| k == key)?;
        Some(value)
    }
}

/// The start tags of `document` in order, or the first reason it is not well-formed XML.
pub(crate) fn parse_xml(document: &str) -> Result<Vec<Element>, String> {
    let mut rest = match document.strip_prefix("<?xml") {
        Some(after) => &after[after.find("?>").ok_or("unclosed XML declaration")? + 2..],
        None => document,
    };
    let mut elements = Vec::new();
    let mut open: Vec<String> = Vec::new();
    let mut roots = 0;
    while let Some(lt) = rest.find('<') {
        let text = &rest[..lt];
        if open.is_empty() && !text.trim().is_empty() {
            return Err(format!("text outside the root: {text:?}"));
        }
        check_characters(text)?;
        rest = &rest[lt + 1..];
        if let Some(after) = rest.strip_prefix('/') {
            let gt = after.find('>').ok_or("unclosed end tag")?;
            let name = after[..gt].trim_end();
            match open.pop() {
                Some(innermost) if innermost == name => {}
                innermost => return Err(format!("</{name}> closes {innermost:?}")),
            }
            rest = &after[gt + 1..];
            continue;
        }
        let (element, self_closing, after) = parse_start_tag(rest)?;
        if open.is_empty() {
            roots += 1;
        }
        if !self_closing {
            open.push(element.name.clone());
        }
        elements.push(element);
        rest = after;
    }
    if !rest.trim().is_empty() || !open.is_empty() || roots != 1 {
        return Err(format!(
            "{roots} roots, unclosed {open:?}, trailing {rest:?}"
        ));
    }
    Ok(elements)
}

/// The tag after its `<`: the element, whether it closes itself, and the text after `>`.
fn parse_start_tag(tag: &str) -> Result<(Element, bool, &str), String> {
    let name_end = tag
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .ok_or("unclosed tag")?;
    let mut element = Element {
        name: checked_name(&tag[..name_end])?,
        attributes: Vec::new(),
    };
    let mut rest = &tag[name_end..];
    loop {
        let trimmed = rest.trim_start();
        if let Some(after) = trimmed.strip_prefix("/>") {
            return Ok((element, true, after));
        }
        if let Some(after) = trimmed.strip_prefix('>') {
            return Ok((element, false, after));
        }
        if trimmed.len() == rest.len() {
            return Err(format!("no space before attribute in <{}", element.name));
        }
        let eq = trimmed.find('=').ok_or("attribute without a value")?;
        let key = checked_name(&trimmed[..eq])?;
        if element.attribute(&key).is_some() {
            return Err(format!("attribute {key} twice in <{}>", element.name));
        }
        let quoted = trimmed[eq + 1..]
            .strip_prefix('"')
            .ok_or("unquoted attribute")?;
        let close = quoted.find('"').ok_or("unclosed attribute")?;
        let value = &quoted[..close];
        if value.contains('<') {
            return Err(format!("'<' in attribute {key}"));
        }
        check_characters(value)?;
        element.attributes.push((key, value.to_string()));
        rest = &quoted[close + 1..];
    }
}

fn checked_name(name: &str) -> Result<String, String> {
    let mut chars = name.chars();
    let starts_well = chars.next().is_some_and(|c| c.is_alphabetic() || c == '_');
    if starts_well && chars.all(|c| c.is_alphanumeric() || "-_.:".contains(c)) {
        Ok(name.to_string())
    } else {
        Err(format!("bad name {name:?}"))
    }
}

/// Character data: every `&` starts an entity, no character XML 1.0 forbids.
fn check_characters(text: &str) -> Result<(), String> {
    for (at, _) in text.match_indices('&') {
        let entity = &text[at..];
        let known = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
            .iter()
            .any(|e| entity.starts_with(e));
        if !known {
            return Err(format!("stray '&' in {text:?}"));
        }
    }
    match text
        .chars()
        .find(|&c| (c < ' ' && !"\t\n\r".contains(c)) || c == '\u{FFFE}' || c == '\u{FFFF}')
    {
        Some(c) => Err(format!("forbidden character {c:?}")),
        None => Ok(()),
    }
}

#[test]
fn the_checker_rejects_malformed_xml() {
    assert!(parse_xml(r#"<a><b x="1"/>t &amp; u</a>"#).is_ok());
    for bad in [
        "<a><b></a></b>",
        "<a>",
        "<a/><b/>",
        "<a>x & y</a>",
        "<a>x < y</a>",
        r#"<a x="1" x="2"/>"#,
        r#"<a x=1/>"#,
        r#"<a x="1"y="2"/>"#,
        "<a>\u{1}</a>",
        "text<a/>",
    ] {
        assert!(parse_xml(bad).is_err(), "accepted {bad:?}");
    }
}

#[test]
fn svg_is_well_formed_with_a_rect_per_arena_buffer_and_a_legend() {
    let plan = tiny_plan();
    let svg = to_svg(&plan);
    let elements = parse_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    assert_eq!(elements[0].name, "svg");
    assert_eq!(elements[0].attribute("width"), Some("1200"));
    assert_eq!(elements[0].attribute("height"), Some("700"));
    let rects: Vec<&Element> = elements.iter().filter(|e| e.name == "rect").collect();
    let of_class = |class: &str| {
        rects
            .iter()
            .filter(|r| r.attribute("class") == Some(class))
            .count()
    };
    let in_arena = plan.buffers.iter().filter(|b| b.class.in_arena()).count();
    assert_eq!(in_arena, 6);
    assert_eq!(of_class("buffer"), in_arena);
    assert_eq!(of_class("legend"), 2);
    assert_eq!(rects.len(), in_arena + 2);
    // Every buffer rectangle has a tooltip: one <title> per rect plus the document's.
    assert_eq!(
        elements.iter().filter(|e| e.name == "title").count(),
        in_arena + 1
    );
    assert_eq!(
        elements
            .iter()
            .filter(|e| e.attribute("class") == Some("peak"))
            .count(),
        1
    );
}

#[test]
fn svg_geometry_matches_the_hand_computation() {
    let svg = to_svg(&tiny_plan());
    // Plot x 110..1170 over 6 steps (176.67 px each), y 630 (offset 0) up to 80 (3072 B).
    // Buffer 4: steps [0, 2), bytes [0, 1024) -> x 110, width 353.33, y 630 - 183.33.
    assert!(svg.contains(
        r##"<rect class="buffer" x="110.00" y="446.67" width="353.33" height="183.33" fill="#0072B2""##
    ));
    // Workspace 8: step 2, bytes [2816, 3072) -> the top of the plot, in orange.
    assert!(svg.contains(
        r##"<rect class="buffer" x="463.33" y="80.00" width="176.67" height="45.83" fill="#E69F00""##
    ));
    // The peak line at the middle of step 3: 110 + 3.5 * 176.67.
    assert!(svg.contains(r#"<line class="peak" x1="728.33" y1="80" x2="728.33" y2="630""#));
    assert!(svg.contains(
        "<title>tiny: arena 3.00 KiB (3072 B), lower bound 2.25 KiB (2304 B), \
         arena / lower bound 1.3333</title>"
    ));
    assert!(svg.contains(
        "<title>silu &quot;gate&quot; &lt;&amp;&gt; %7.0\nactivation, 768 B, steps 3..5, offset 0</title>"
    ));
    for label in [
        ">schedule step<",
        ">arena offset (bytes)<",
        ">activation<",
        ">workspace<",
    ] {
        assert!(svg.contains(label), "no {label}");
    }
    // Slivers (here 1 B of 3072 B is 0.18 px) have no white edge to hide their color.
    let mut plan = tiny_plan();
    plan.buffers[9].size = 1;
    let sliver = to_svg(&plan);
    assert!(
        sliver.contains(r##"height="0.18" fill="#E69F00"><title>"##),
        "{sliver}"
    );
    // Byte ticks every 512 B, labelled in binary units.
    assert!(svg.contains(r#"text-anchor="end">2.50 KiB</text>"#));
}

#[test]
fn names_cannot_break_the_xml() {
    let mut plan = tiny_plan();
    plan.program = "p</svg><x a='1'>&\u{0}".to_string();
    plan.buffers[4].name = "]]> <!-- \" ' & \u{7}\u{FFFF}".to_string();
    let svg = to_svg(&plan);
    parse_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    assert_eq!(
        escape("a<b>&\"'\t\u{1}"),
        "a&lt;b&gt;&amp;&quot;&apos;\t\u{FFFD}"
    );
}

#[test]
fn broken_plans_give_well_formed_svg() {
    let mut plan = tiny_plan();
    plan.buffers[4].end = usize::MAX;
    plan.buffers[7].size = u64::MAX;
    plan.buffers[7].offset = Some(u64::MAX - 1);
    plan.buffers[8].offset = None;
    plan.arena_bytes = 0;
    let svg = to_svg(&plan);
    let elements = parse_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    let buffers = elements
        .iter()
        .filter(|e| e.attribute("class") == Some("buffer"))
        .count();
    assert_eq!(
        buffers, 5,
        "all placed buffers but the one without an offset"
    );

    plan.schedule.clear();
    let svg = to_svg(&plan);
    parse_xml(&svg).unwrap_or_else(|e| panic!("{e}\n{svg}"));
    assert!(svg.contains("no arena buffers to draw"));
}

#[test]
fn ticks_are_round() {
    assert_eq!(tick_power_of_two(3072, 8), 512);
    assert_eq!(tick_power_of_two(3 << 30, 8), 512 << 20);
    assert_eq!(tick_power_of_two(0, 8), 1);
    assert_eq!(tick_power_of_two(u64::MAX, 8), 1 << 61);
    assert_eq!(tick_1_2_5(6, 10), 1);
    assert_eq!(tick_1_2_5(250, 10), 50);
    assert_eq!(tick_1_2_5(1234, 10), 200);
    assert_eq!(tick_1_2_5(0, 10), 1);
    assert_eq!(tick_1_2_5(usize::MAX, 10), 2_000_000_000_000_000_000);
}
