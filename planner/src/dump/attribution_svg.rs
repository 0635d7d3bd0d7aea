//! The stacked picture of an [`Attribution`]: live arena bytes over the schedule, one band per
//! category, to open in a browser.
//!
//! x is the schedule step, y the live arena bytes (0 at the bottom, the peak near the top).
//! Each category is one `<path class="category">` stacked in [`CATEGORIES`] order: over step
//! `s` (the span `[s, s + 1)`) it covers the bytes of the categories below it up to its own;
//! its `<title>` tooltip names the category, its bytes at the peak and its own maximum. Colors
//! are Okabe–Ito (distinct under the common color-vision deficiencies); a legend names them and
//! a dashed line marks the peak step. Canvas, margins, ticks and escaping follow the arena
//! picture (`svg.rs`), so both read alike.

use super::attribution::{Attribution, ByCategory, CATEGORIES};
use super::format_bytes;
use super::svg::{
    byte_grid, escape, finish, header, num, step_axes, PLOT_BOTTOM, PLOT_LEFT, PLOT_RIGHT, PLOT_TOP,
};

/// One color per category, in [`CATEGORIES`] order.
const COLORS: [&str; 6] = [
    "#56B4E9", // activation: sky blue
    "#0072B2", // saved activation: blue
    "#D55E00", // gradient: vermillion
    "#CC79A7", // optimizer update: reddish purple
    "#009E73", // logits/loss: bluish green
    "#E69F00", // workspace: orange
];

impl Attribution {
    /// The stacked SVG (see the module doc).
    pub fn to_svg(&self) -> String {
        let steps = self.per_step.len();
        let extent = self.peak_bytes.max(1);
        let step_width = (PLOT_RIGHT - PLOT_LEFT) / steps.max(1) as f64;
        let x = |step: usize| PLOT_LEFT + step as f64 * step_width;
        let y = |bytes: u64| PLOT_BOTTOM - bytes as f64 / extent as f64 * (PLOT_BOTTOM - PLOT_TOP);
        let title = format!(
            "{}: live arena bytes by source, peak {} (the lower bound), arena {}",
            self.program,
            format_bytes(self.peak_bytes),
            format_bytes(self.arena_bytes)
        );
        let mut svg = header(&title);
        self.legend(&mut svg);

        byte_grid(&mut svg, extent, &y);

        // Running sums: `below[s]` is the top of the bands drawn so far at step `s`.
        let mut below = vec![0u64; steps];
        for (index, category) in CATEGORIES.iter().enumerate() {
            let top: Vec<u64> = (below.iter().zip(&self.per_step))
                .map(|(&b, bytes): (&u64, &ByCategory)| b.saturating_add(bytes[index]))
                .collect();
            if top != below {
                let at_peak = self.peak_step.map_or(0, |p| self.per_step[p][index]);
                let most = self.per_step.iter().map(|b| b[index]).max().unwrap_or(0);
                let tooltip = format!(
                    "{}: {} at the peak, at most {}",
                    category.name(),
                    format_bytes(at_peak),
                    format_bytes(most)
                );
                svg.push(format!(
                    r#"<path class="category" d="{}" fill="{}"><title>{}</title></path>"#,
                    band(&below, &top, &x, &y),
                    COLORS[index],
                    escape(&tooltip)
                ));
            }
            below = top;
        }

        step_axes(&mut svg, steps, (&x, step_width), "live arena bytes");
        let middle = num((PLOT_TOP + PLOT_BOTTOM) / 2.0);
        match self.peak_step {
            Some(peak) => {
                let at = num(x(peak) + step_width / 2.0);
                svg.push(format!(
                    r#"<line class="peak" x1="{at}" y1="{PLOT_TOP}" x2="{at}" y2="{PLOT_BOTTOM}" stroke="black" stroke-width="1.5" stroke-dasharray="6 4"/>"#
                ));
                svg.push(format!(
                    r#"<text x="{at}" y="{}" text-anchor="middle">peak step {peak}</text>"#,
                    PLOT_TOP - 6.0
                ));
            }
            None => svg.push(format!(
                r#"<text x="{}" y="{middle}" text-anchor="middle">the schedule is empty</text>"#,
                num((PLOT_LEFT + PLOT_RIGHT) / 2.0)
            )),
        }
        finish(svg)
    }

    /// One swatch (`<rect class="legend">`) and name per category, in two rows of three.
    fn legend(&self, svg: &mut Vec<String>) {
        for (index, category) in CATEGORIES.iter().enumerate() {
            let x = PLOT_LEFT + 170.0 * (index % 3) as f64;
            let y = 40.0 + 18.0 * (index / 3) as f64;
            svg.push(format!(
                r#"<rect class="legend" x="{x}" y="{y}" width="14" height="14" fill="{}"/>"#,
                COLORS[index]
            ));
            svg.push(format!(
                r#"<text x="{}" y="{}">{}</text>"#,
                x + 20.0,
                y + 11.0,
                escape(category.name())
            ));
        }
    }
}

/// The outline of a band between `below` and `top` (one entry per step, at least one): the
/// top edge left to right as a staircase, then the bottom edge back; a corner only where the
/// bytes change, so long schedules stay small files.
fn band(below: &[u64], top: &[u64], x: &dyn Fn(usize) -> f64, y: &dyn Fn(u64) -> f64) -> String {
    let mut points = staircase(top, x, y);
    let mut back = staircase(below, x, y);
    back.reverse();
    points.extend(back);
    let mut path = String::new();
    for (index, (px, py)) in points.iter().enumerate() {
        path.push_str(if index == 0 { "M" } else { " L" });
        path.push_str(&format!("{} {}", num(*px), num(*py)));
    }
    path.push_str(" Z");
    path
}

/// The corners of the step function `bytes` (step `s` spans `[x(s), x(s + 1))`), left to
/// right.
fn staircase(bytes: &[u64], x: &dyn Fn(usize) -> f64, y: &dyn Fn(u64) -> f64) -> Vec<(f64, f64)> {
    let mut points = Vec::new();
    let mut previous = None;
    for (step, &value) in bytes.iter().enumerate() {
        if previous != Some(value) {
            if let Some(before) = previous {
                points.push((x(step), y(before)));
            }
            points.push((x(step), y(value)));
            previous = Some(value);
        }
    }
    if let Some(last) = previous {
        points.push((x(bytes.len()), y(last)));
    }
    points
}
