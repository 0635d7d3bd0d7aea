//! Memory attribution: the live arena bytes of every schedule step split by what they hold —
//! a [`Category`] and a group (a layer, say) that the caller derives for each arena buffer from
//! the program's provenance; the planner only adds up sizes over lifetimes.
//!
//! Invariants:
//! 1. Bytes are counted as the arena holds them: each buffer's size rounded up to the plan's
//!    alignment, live over `[start, end]` — the rule of `lower_bound_bytes`, so the total at
//!    the peak step IS the plan's lower bound (the peak of live arena bytes), exactly.
//! 2. The peak step is the FIRST step where the total is maximal.
//! 3. Groups are listed in order of first appearance (buffer id order), categories in
//!    declaration order: the same plan and sources give the same report, byte for byte.
//! 4. Params, inputs, outputs and state live outside the arena: they are reported apart and
//!    never counted in the totals.

use serde::Serialize;

use super::{clamped_lifetime, class_name, format_bytes, format_bytes_short, CLASSES};
use crate::{Buffer, Plan};

/// What an arena buffer holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Category {
    /// A forward value no backward op reads (it dies within the forward).
    Activation,
    /// A forward value kept for the backward (read across the forward/backward boundary).
    SavedActivation,
    /// A value of the backward: a gradient, or a step on the way to one.
    Gradient,
    /// A result of the optimizer (new params and moments that are not written in place).
    Optimizer,
    /// The logits and the loss.
    Logits,
    /// Scratch of one op.
    Workspace,
}

/// Every category, in declaration order (the columns of the table, the stack of the picture).
pub const CATEGORIES: [Category; 6] = [
    Category::Activation,
    Category::SavedActivation,
    Category::Gradient,
    Category::Optimizer,
    Category::Logits,
    Category::Workspace,
];

impl Category {
    /// The name tables and legends use.
    pub fn name(self) -> &'static str {
        match self {
            Category::Activation => "activation",
            Category::SavedActivation => "saved activation",
            Category::Gradient => "gradient",
            Category::Optimizer => "optimizer update",
            Category::Logits => "logits/loss",
            Category::Workspace => "workspace",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where one arena buffer's bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub category: Category,
    /// A group of the program (`layer 3`, `head`).
    pub group: String,
}

/// Bytes per category, in [`CATEGORIES`] order.
pub type ByCategory = [u64; 6];

/// One group's bytes at the peak step.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct GroupBytes {
    pub group: String,
    /// By category, in [`CATEGORIES`] order.
    pub bytes: ByCategory,
    pub total: u64,
}

/// The live arena bytes of a plan by source (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attribution {
    pub program: String,
    /// Category names, the order of every `ByCategory`.
    pub categories: Vec<&'static str>,
    /// The first step with the most live arena bytes; `None` for an empty schedule.
    pub peak_step: Option<usize>,
    /// Live arena bytes at the peak step (invariant 1: the plan's lower bound).
    pub peak_bytes: u64,
    /// The plan's arena (at least `peak_bytes`; more where placement or streams cost bytes).
    pub arena_bytes: u64,
    /// Each group's bytes at the peak step, in order of first appearance.
    pub at_peak: Vec<GroupBytes>,
    /// Live bytes per category at every schedule step.
    pub per_step: Vec<ByCategory>,
    /// Bytes outside the arena by buffer class (`param`, `input`, `output`, `state`).
    pub outside_arena: Vec<(&'static str, u64)>,
}

/// Attributes the arena bytes of `plan`; `source` is asked about each arena buffer once, in
/// buffer order.
pub fn attribute(plan: &Plan, mut source: impl FnMut(&Buffer) -> Source) -> Attribution {
    let steps = plan.schedule.len();
    let alignment = plan.options.alignment.max(1);
    let mut per_step = vec![[0u64; 6]; steps];
    let mut groups: Vec<String> = Vec::new();
    // Per arena buffer: its group index, category and lifetime.
    let mut placed = Vec::new();
    for buffer in plan.buffers.iter().filter(|b| b.class.in_arena()) {
        let Source { category, group } = source(buffer);
        let group = match groups.iter().position(|g| *g == group) {
            Some(index) => index,
            None => {
                groups.push(group);
                groups.len() - 1
            }
        };
        let size = aligned(buffer.size, alignment);
        if let Some((start, end)) = clamped_lifetime(buffer, steps) {
            for bytes in &mut per_step[start..=end] {
                bytes[category.index()] = bytes[category.index()].saturating_add(size);
            }
            placed.push((group, category, start, end, size));
        }
    }
    let totals: Vec<u64> = per_step.iter().map(total).collect();
    let peak_bytes = totals.iter().copied().max().unwrap_or(0);
    let peak_step = totals.iter().position(|&t| t == peak_bytes);
    let mut at_peak: Vec<GroupBytes> = (groups.into_iter())
        .map(|group| GroupBytes {
            group,
            bytes: [0; 6],
            total: 0,
        })
        .collect();
    if let Some(peak) = peak_step {
        for &(group, category, start, end, size) in &placed {
            if (start..=end).contains(&peak) {
                let row = &mut at_peak[group];
                row.bytes[category.index()] = row.bytes[category.index()].saturating_add(size);
                row.total = row.total.saturating_add(size);
            }
        }
    }
    let outside_arena = CLASSES
        .iter()
        .filter(|class| !class.in_arena())
        .map(|&class| {
            let bytes = (plan.buffers.iter())
                .filter(|b| b.class == class)
                .fold(0u64, |sum, b| sum.saturating_add(b.size));
            (class_name(class), bytes)
        })
        .collect();
    Attribution {
        program: plan.program.clone(),
        categories: CATEGORIES.iter().map(|c| c.name()).collect(),
        peak_step,
        peak_bytes,
        arena_bytes: plan.arena_bytes,
        at_peak,
        per_step,
        outside_arena,
    }
}

/// `size` rounded up to a multiple of `alignment` (> 0), saturating.
fn aligned(size: u64, alignment: u64) -> u64 {
    size.div_ceil(alignment).saturating_mul(alignment)
}

fn total(bytes: &ByCategory) -> u64 {
    bytes.iter().fold(0u64, |sum, &b| sum.saturating_add(b))
}

impl Attribution {
    /// The table for people: each group's bytes at the peak step by category, a total row
    /// (equal to the peak), each category's bytes at the peak and at its own maximum, and
    /// what lives outside the arena.
    pub fn to_text(&self) -> String {
        let mut lines = vec![format!("memory by source: {}", self.program)];
        let Some(peak) = self.peak_step else {
            lines.push("  the schedule is empty: no arena bytes are ever live".into());
            return lines.join("\n") + "\n";
        };
        lines.push(format!(
            "  peak step {peak}: {} live in the arena (the plan's lower bound; arena {})",
            format_bytes(self.peak_bytes),
            format_bytes(self.arena_bytes)
        ));
        lines.push(
            "  sizes as the arena holds them (rounded up to the alignment); a buffer counts for \
             the first value it holds"
                .into(),
        );
        lines.push(String::new());
        let cell = |bytes: u64| match bytes {
            0 => "-".to_string(),
            b => format_bytes_short(b),
        };
        let mut header = vec!["group".to_string()];
        header.extend(CATEGORIES.iter().map(|c| c.name().to_string()));
        header.push("total".into());
        let mut rows = vec![header];
        let mut sums = [0u64; 6];
        for row in &self.at_peak {
            let mut cells = vec![row.group.clone()];
            cells.extend(row.bytes.iter().map(|&b| cell(b)));
            cells.push(cell(row.total));
            rows.push(cells);
            for (sum, &b) in sums.iter_mut().zip(&row.bytes) {
                *sum = sum.saturating_add(b);
            }
        }
        let mut last = vec!["total".to_string()];
        last.extend(sums.iter().map(|&b| cell(b)));
        last.push(cell(total(&sums)));
        rows.push(last);
        lines.extend(aligned_rows(&rows));

        lines.push(String::new());
        let mut over_time = vec![vec![
            "category".to_string(),
            "at the peak".into(),
            "most".into(),
            "at step".into(),
        ]];
        for category in CATEGORIES {
            let index = category.index();
            let (most_step, most) = (self.per_step.iter().enumerate())
                .map(|(step, bytes)| (step, bytes[index]))
                .fold(
                    (0, 0),
                    |best, (step, b)| if b > best.1 { (step, b) } else { best },
                );
            let at = match most {
                0 => "-".to_string(),
                _ => most_step.to_string(),
            };
            over_time.push(vec![
                category.name().to_string(),
                cell(sums[index]),
                cell(most),
                at,
            ]);
        }
        lines.extend(aligned_rows(&over_time));
        lines.push(String::new());
        let outside: Vec<String> = (self.outside_arena.iter())
            .map(|(class, bytes)| format!("{class} {}", format_bytes_short(*bytes)))
            .collect();
        lines.push(format!(
            "  outside the arena (not counted above): {}",
            outside.join(", ")
        ));
        lines.join("\n") + "\n"
    }

    /// The report as pretty-printed JSON, ending in a newline.
    pub fn to_json(&self) -> String {
        // Plain data (strings, integers, lists): serde_json has nothing it could refuse.
        let mut json =
            serde_json::to_string_pretty(self).expect("an Attribution always serializes to JSON");
        json.push('\n');
        json
    }
}

/// `rows` as lines with aligned columns: the first left-aligned, the others right-aligned.
fn aligned_rows(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            (rows.iter())
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let cells: Vec<String> = (row.iter().enumerate())
                .map(|(c, text)| match c {
                    0 => format!("{text:<width$}", width = widths[c]),
                    _ => format!("{text:>width$}", width = widths[c]),
                })
                .collect();
            format!("  {}", cells.join("  ").trim_end())
        })
        .collect()
}

#[cfg(test)]
#[path = "attribution_tests.rs"]
mod tests;
