//! The SVG dump: a standalone picture of the arena over time, to open in a browser.
//!
//! x is the schedule step, y the arena offset (0 at the bottom). Every arena buffer is a
//! rectangle over steps `[start, end + 1)` and bytes `[offset, offset + size)`, colored by
//! class (Okabe–Ito blue for activations, orange for workspaces: distinct under the common
//! color-vision deficiencies), with a `<title>` tooltip naming it. Axes carry ticks and labels,
//! a legend names the colors and a dashed line marks the peak step; the title line gives the
//! program, arena, lower bound and their ratio.
//!
//! Invariants: the canvas is fixed (1200 × 700) and the plot scaled to fit every placed buffer;
//! coordinates have two decimals; all text is XML-escaped (characters XML forbids become
//! U+FFFD), so the file is well-formed whatever the names hold. The only `<rect>` elements are
//! one per drawn buffer (`class="buffer"`) and one per legend swatch (`class="legend"`).

use super::{
    byte_extent, class_name, format_bytes, format_bytes_short, live_arena_bytes, peak_step,
    placed_buffers, ratio_text,
};
use crate::{BufferClass, Plan};

pub(super) const WIDTH: f64 = 1200.0;
pub(super) const HEIGHT: f64 = 700.0;
pub(super) const PLOT_LEFT: f64 = 110.0;
pub(super) const PLOT_RIGHT: f64 = 1170.0;
pub(super) const PLOT_TOP: f64 = 80.0;
pub(super) const PLOT_BOTTOM: f64 = 630.0;
const ACTIVATION_COLOR: &str = "#0072B2";
const WORKSPACE_COLOR: &str = "#E69F00";
pub(super) const GRID_COLOR: &str = "#e0e0e0";
/// Rectangles narrower or lower than this (pixels) get no edge.
const MIN_EDGED: f64 = 3.0;

/// The SVG dump (see the module doc).
pub fn to_svg(plan: &Plan) -> String {
    let placed = placed_buffers(plan);
    let extent = byte_extent(plan, &placed);
    let steps = plan.schedule.len();
    let peak = peak_step(&live_arena_bytes(plan));
    // Scales; an empty axis still gets a unit so nothing divides by zero.
    let step_width = (PLOT_RIGHT - PLOT_LEFT) / steps.max(1) as f64;
    let x = |step: usize| PLOT_LEFT + step as f64 * step_width;
    let y =
        |bytes: u64| PLOT_BOTTOM - bytes as f64 / extent.max(1) as f64 * (PLOT_BOTTOM - PLOT_TOP);

    let title = format!(
        "{}: arena {}, lower bound {}, arena / lower bound {}",
        plan.program,
        format_bytes(plan.arena_bytes),
        format_bytes(plan.lower_bound_bytes),
        ratio_text(plan)
    );
    let mut svg = header(&title);
    legend(&mut svg, peak);

    byte_grid(&mut svg, extent, &y);

    for p in &placed {
        let color = match p.buffer.class {
            BufferClass::Workspace => WORKSPACE_COLOR,
            _ => ACTIVATION_COLOR,
        };
        let tooltip = format!(
            "{}\n{}, {}, steps {}..{}, offset {}",
            p.buffer.name,
            class_name(p.buffer.class),
            format_bytes(p.buffer.size),
            p.buffer.start,
            p.buffer.end,
            p.offset
        );
        let (width, height) = (x(p.end + 1) - x(p.start), y(p.offset) - y(p.top));
        // A thin white edge tells neighbours apart; on slivers it would hide the color.
        let edge = if width >= MIN_EDGED && height >= MIN_EDGED {
            r#" stroke="white" stroke-width="0.5""#
        } else {
            ""
        };
        svg.push(format!(
            r#"<rect class="buffer" x="{}" y="{}" width="{}" height="{}" fill="{color}"{edge}><title>{}</title></rect>"#,
            num(x(p.start)),
            num(y(p.top)),
            num(width),
            num(height),
            escape(&tooltip)
        ));
    }

    // Axes over the rectangles, x ticks at step centers.
    step_axes(&mut svg, steps, (&x, step_width), "arena offset (bytes)");
    let middle = num((PLOT_TOP + PLOT_BOTTOM) / 2.0);

    if let Some(peak) = peak {
        let at = num(x(peak) + step_width / 2.0);
        svg.push(format!(
            r#"<line class="peak" x1="{at}" y1="{PLOT_TOP}" x2="{at}" y2="{PLOT_BOTTOM}" stroke="black" stroke-width="1.5" stroke-dasharray="6 4"/>"#
        ));
        svg.push(format!(
            r#"<text x="{at}" y="{}" text-anchor="middle">peak step {peak}</text>"#,
            PLOT_TOP - 6.0
        ));
    }
    if placed.is_empty() {
        svg.push(format!(
            r#"<text x="{}" y="{middle}" text-anchor="middle">no arena buffers to draw</text>"#,
            num((PLOT_LEFT + PLOT_RIGHT) / 2.0)
        ));
    }
    finish(svg)
}

/// The color swatches (one `<rect class="legend">` per class) and the peak line's key.
fn legend(svg: &mut Vec<String>, peak: Option<usize>) {
    let y = 44.0;
    for (index, (label, color)) in [
        ("activation", ACTIVATION_COLOR),
        ("workspace", WORKSPACE_COLOR),
    ]
    .into_iter()
    .enumerate()
    {
        let x = PLOT_LEFT + 120.0 * index as f64;
        svg.push(format!(
            r#"<rect class="legend" x="{x}" y="{y}" width="14" height="14" fill="{color}"/>"#
        ));
        svg.push(format!(
            r#"<text x="{}" y="{}">{label}</text>"#,
            x + 20.0,
            y + 11.0
        ));
    }
    if let Some(peak) = peak {
        let x = PLOT_LEFT + 240.0;
        svg.push(format!(
            r#"<line x1="{x}" y1="{}" x2="{}" y2="{}" stroke="black" stroke-width="1.5" stroke-dasharray="6 4"/>"#,
            y + 7.0,
            x + 24.0,
            y + 7.0
        ));
        svg.push(format!(
            r#"<text x="{}" y="{}">peak step {peak} (most live arena bytes)</text>"#,
            x + 30.0,
            y + 11.0
        ));
    }
}

/// A coordinate with two decimals.
/// The opening lines of a picture: the XML declaration, the `<svg>` element at the plot's size,
/// `title` as its tooltip and as the heading.
pub(super) fn header(title: &str) -> Vec<String> {
    vec![
        r#"<?xml version="1.0" encoding="UTF-8"?>"#.to_string(),
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12" style="background-color:white">"#
        ),
        format!("<title>{}</title>", escape(title)),
        format!(
            r#"<text x="{PLOT_LEFT}" y="28" font-size="16" font-weight="bold">{}</text>"#,
            escape(title)
        ),
    ]
}

/// The picture's lines closed and joined, one element a line.
pub(super) fn finish(mut svg: Vec<String>) -> String {
    svg.push("</svg>".to_string());
    let mut text = svg.join("\n");
    text.push('\n');
    text
}

/// The byte axis: a grid line, a tick and a label at every multiple of a power of two (so
/// labels come out round) from 0 to `extent`; `y` maps bytes to the plot's height.
pub(super) fn byte_grid(svg: &mut Vec<String>, extent: u64, y: &dyn Fn(u64) -> f64) {
    let byte_tick = tick_power_of_two(extent, 8);
    let mut bytes = 0u64;
    while bytes <= extent {
        let at = num(y(bytes));
        svg.push(format!(
            r#"<line x1="{PLOT_LEFT}" y1="{at}" x2="{PLOT_RIGHT}" y2="{at}" stroke="{GRID_COLOR}"/>"#
        ));
        svg.push(format!(
            r#"<line x1="{}" y1="{at}" x2="{PLOT_LEFT}" y2="{at}" stroke="black"/>"#,
            PLOT_LEFT - 5.0
        ));
        svg.push(format!(
            r#"<text x="{}" y="{at}" dy="0.35em" text-anchor="end">{}</text>"#,
            PLOT_LEFT - 8.0,
            escape(&format_bytes_short(bytes))
        ));
        bytes = match bytes.checked_add(byte_tick) {
            Some(next) => next,
            None => break,
        };
    }
}

/// The plot's two axes, a tick and label at the center of every few schedule steps (`x` maps a
/// step to its left edge, each `step_width` wide), "schedule step" under them and `y_label`
/// up the left side.
pub(super) fn step_axes(
    svg: &mut Vec<String>,
    steps: usize,
    (x, step_width): (&dyn Fn(usize) -> f64, f64),
    y_label: &str,
) {
    svg.push(format!(
        r#"<line x1="{PLOT_LEFT}" y1="{PLOT_BOTTOM}" x2="{PLOT_RIGHT}" y2="{PLOT_BOTTOM}" stroke="black"/>"#
    ));
    svg.push(format!(
        r#"<line x1="{PLOT_LEFT}" y1="{PLOT_TOP}" x2="{PLOT_LEFT}" y2="{PLOT_BOTTOM}" stroke="black"/>"#
    ));
    for step in (0..steps).step_by(tick_1_2_5(steps, 10)) {
        let at = num(x(step) + step_width / 2.0);
        svg.push(format!(
            r#"<line x1="{at}" y1="{PLOT_BOTTOM}" x2="{at}" y2="{}" stroke="black"/>"#,
            PLOT_BOTTOM + 5.0
        ));
        svg.push(format!(
            r#"<text x="{at}" y="{}" text-anchor="middle">{step}</text>"#,
            PLOT_BOTTOM + 20.0
        ));
    }
    svg.push(format!(
        r#"<text x="{}" y="675" text-anchor="middle">schedule step</text>"#,
        num((PLOT_LEFT + PLOT_RIGHT) / 2.0)
    ));
    let middle = num((PLOT_TOP + PLOT_BOTTOM) / 2.0);
    svg.push(format!(
        r#"<text x="24" y="{middle}" text-anchor="middle" transform="rotate(-90 24 {middle})">{}</text>"#,
        escape(y_label)
    ));
}

pub(super) fn num(value: f64) -> String {
    format!("{value:.2}")
}

/// The smallest power of two that cuts `0..=extent` into at most `ticks` steps (at least 1).
pub(super) fn tick_power_of_two(extent: u64, ticks: u64) -> u64 {
    extent
        .div_ceil(ticks)
        .max(1)
        .checked_next_power_of_two()
        .unwrap_or(1 << 63)
}

/// The smallest 1, 2 or 5 × 10^k that cuts `0..count` into at most `ticks` steps (at least 1).
pub(super) fn tick_1_2_5(count: usize, ticks: usize) -> usize {
    let wanted = count.div_ceil(ticks).max(1);
    let mut decade = 1usize;
    loop {
        for factor in [1, 2, 5] {
            match decade.checked_mul(factor) {
                Some(tick) if tick >= wanted => return tick,
                Some(_) => {}
                None => return wanted,
            }
        }
        decade = match decade.checked_mul(10) {
            Some(next) => next,
            None => return wanted,
        };
    }
}

/// `text` as XML character data or attribute value: markup characters escaped, characters
/// XML 1.0 forbids (control characters other than tab and line breaks, U+FFFE, U+FFFF)
/// replaced by U+FFFD.
pub(super) fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&apos;"),
            '\t' | '\n' | '\r' => escaped.push(c),
            c if c < ' ' || c == '\u{FFFE}' || c == '\u{FFFF}' => escaped.push('\u{FFFD}'),
            c => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
#[path = "svg_tests.rs"]
pub(super) mod tests;
