//! The text dump, for people: a summary, a table of every buffer, the buffers live at the peak
//! step and who writes them, and an ASCII time × offset map of the arena.
//!
//! Layout (sections separated by a blank line; every table's columns aligned):
//!
//! ```text
//! plan tiny
//!   streams                2
//!   ...
//!
//! buffers
//!   id  class       offset  size  start  end  stream  uses  name
//!   ...
//!
//! at the peak step
//!   step 3 (node 7, stream 0): silu
//!   ...
//!
//! time x offset map: ...
//!   2944 |..w...|
//!   ...
//!      0 |##.###|
//!            ^ peak step 3
//! ```
//!
//! The map has one row per band of arena offsets (24 bands; high offsets on top) and one column
//! per schedule step (at most 100 columns: longer schedules are split into runs of steps). A
//! cell shows '#' or 'w' if any activation or workspace touches it, whichever covers more of
//! the cell (bytes × steps; ties go to '#'), and '.' if nothing does; so a buffer never
//! vanishes from the map, however small.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{
    byte_extent, clamped_lifetime, class_name, format_bytes, format_bytes_short, live_arena_bytes,
    peak_step, placed_buffers, ratio_text, CLASSES,
};
use crate::{Buffer, BufferClass, Plan};

/// Rows of the ASCII map (fewer only if the arena has fewer bytes).
const MAP_ROWS: u64 = 24;
/// Most columns of the ASCII map.
const MAP_COLUMNS: usize = 100;
/// Buffers listed at the peak step.
const PEAK_BUFFERS: usize = 10;

/// The text dump (see the module doc). `planning_time` is printed when given; it is the only
/// input that is not part of the plan (timings differ between machines, so tests pass `None`).
pub fn to_text(plan: &Plan, planning_time: Option<Duration>) -> String {
    let live = live_arena_bytes(plan);
    let peak = peak_step(&live);
    let mut sections = vec![summary(plan, planning_time)];
    if !plan.recomputed.is_empty() {
        sections.push(recomputed_section(plan));
    }
    sections.extend([
        buffer_table(plan),
        peak_section(plan, &live, peak),
        ascii_map(plan, peak),
    ]);
    let mut text = (sections.iter().map(|lines| lines.join("\n")))
        .collect::<Vec<_>>()
        .join("\n\n");
    text.push('\n');
    text
}

/// One `key  value` line of the summary.
fn entry(key: &str, value: impl std::fmt::Display) -> String {
    format!("  {key:<22} {value}")
}

fn summary(plan: &Plan, planning_time: Option<Duration>) -> Vec<String> {
    let mut lines = vec![
        format!("plan {}", plan.program),
        entry("streams", plan.options.streams),
    ];
    if let Some(stream) = plan.communication_stream {
        let collectives = (plan.schedule.iter())
            .filter(|s| s.stream == stream)
            .count();
        let text = format!("{stream} ({collectives} all_reduce steps)");
        lines.push(entry("communication stream", text));
    }
    lines.extend([
        entry("steps", plan.schedule.len()),
        entry("buffers", plan.buffers.len()),
    ]);
    for class in CLASSES {
        let of_class = plan.buffers.iter().filter(|b| b.class == class);
        let count = of_class.clone().count();
        let bytes = of_class.fold(0u64, |sum, b| sum.saturating_add(b.size));
        lines.push(format!(
            "    {:<12} {count:>6}  {}",
            class_name(class),
            format_bytes(bytes)
        ));
    }
    let arena = plan.arena_bytes;
    let lower_bound = plan.lower_bound_bytes;
    let fragmentation = if arena == 0 {
        "n/a (empty arena)".to_string()
    } else {
        format!(
            "{:.2} % (1 - lower bound / arena)",
            (1.0 - lower_bound as f64 / arena as f64) * 100.0
        )
    };
    lines.extend([
        entry("arena", format_bytes(arena)),
        entry("lower bound", format_bytes(lower_bound)),
        entry("arena / lower bound", ratio_text(plan)),
        entry("fragmentation", fragmentation),
        entry("events", plan.events),
        entry("writes in place", plan.in_place_writes.len()),
        entry("schedule strategy", &plan.schedule_strategy),
        entry("offset strategy", &plan.offset_strategy),
        entry("offset candidates", plan.offset_candidates.len()),
    ]);
    let name_width = plan
        .offset_candidates
        .iter()
        .map(|(name, _)| name.chars().count())
        .max()
        .unwrap_or(0);
    for (name, bytes) in &plan.offset_candidates {
        let chosen = if *name == plan.offset_strategy {
            "  (chosen)"
        } else {
            ""
        };
        lines.push(format!(
            "    {name:<name_width$}  {}{chosen}",
            format_bytes(*bytes)
        ));
    }
    if let Some(time) = planning_time {
        lines.push(entry(
            "planning time",
            format!("{:.3} ms", time.as_secs_f64() * 1e3),
        ));
    }
    lines
}

/// The values recomputed in the backward to fit a memory budget: what each frees and costs.
fn recomputed_section(plan: &Plan) -> Vec<String> {
    let bytes: u64 = plan.recomputed.iter().map(|r| r.bytes).sum();
    let ns: u64 = plan.recomputed.iter().map(|r| r.estimated_ns).sum();
    let mut lines = vec![format!(
        "recomputed in the backward: {} values, {} no longer kept, ~{:.1} us of added work \
         (estimated from bytes moved and FLOPs)",
        plan.recomputed.len(),
        format_bytes(bytes),
        ns as f64 / 1e3
    )];
    lines.push(format!(
        "  {:<10} {:<10} {:>12} {:>6} {:>10}  ops",
        "value", "clone", "bytes", "clones", "est. us"
    ));
    for r in &plan.recomputed {
        lines.push(format!(
            "  {:<10} {:<10} {:>12} {:>6} {:>10.2}  {}",
            r.value,
            r.clone,
            format_bytes_short(r.bytes),
            r.ops,
            r.estimated_ns as f64 / 1e3,
            r.op
        ));
    }
    lines
}

/// Whether a column's cells line up on their left or right edge.
#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// `header` and `rows` as aligned columns (two spaces apart, indented by two); the last
/// column is not padded, so lines carry no trailing blanks.
fn table(header: &[(&str, Align)], rows: &[Vec<String>]) -> Vec<String> {
    let mut widths: Vec<usize> = header
        .iter()
        .map(|(name, _)| name.chars().count())
        .collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header_row: Vec<String> = header.iter().map(|(name, _)| name.to_string()).collect();
    std::iter::once(&header_row)
        .chain(rows)
        .map(|row| {
            let last = row.len().saturating_sub(1);
            let cells: Vec<String> = row
                .iter()
                .enumerate()
                .map(|(column, cell)| {
                    let width = widths.get(column).copied().unwrap_or(0);
                    match header.get(column).map(|&(_, align)| align) {
                        _ if column == last => cell.clone(),
                        Some(Align::Right) => format!("{cell:>width$}"),
                        _ => format!("{cell:<width$}"),
                    }
                })
                .collect();
            format!("  {}", cells.join("  "))
        })
        .collect()
}

fn buffer_table(plan: &Plan) -> Vec<String> {
    use Align::{Left, Right};
    let header = [
        ("id", Right),
        ("class", Left),
        ("offset", Right),
        ("size", Right),
        ("start", Right),
        ("end", Right),
        ("stream", Right),
        ("uses", Right),
        ("name", Left),
    ];
    let rows: Vec<Vec<String>> = plan
        .buffers
        .iter()
        .map(|b| {
            vec![
                b.id.to_string(),
                class_name(b.class).to_string(),
                b.offset.map_or("-".to_string(), |o| o.to_string()),
                b.size.to_string(),
                b.start.to_string(),
                b.end.to_string(),
                b.stream.to_string(),
                b.uses.to_string(),
                b.name.clone(),
            ]
        })
        .collect();
    let mut lines = vec!["buffers".to_string()];
    lines.extend(table(&header, &rows));
    lines
}

/// The steps that write `buffer`: those whose node produces one of its values ("node.port"),
/// in schedule order; failing that (a workspace has no values), the step where it starts.
fn writers(plan: &Plan, steps_of_node: &BTreeMap<usize, Vec<usize>>, buffer: &Buffer) -> String {
    let mut steps: Vec<usize> = buffer
        .values
        .iter()
        .filter_map(|value| value.split('.').next()?.parse::<usize>().ok())
        .filter_map(|node| steps_of_node.get(&node))
        .flatten()
        .copied()
        .collect();
    steps.sort_unstable();
    steps.dedup();
    if steps.is_empty() && buffer.start < plan.schedule.len() {
        steps.push(buffer.start);
    }
    let described: Vec<String> = steps
        .iter()
        .filter_map(|&step| Some(format!("step {step} {}", plan.schedule.get(step)?.op)))
        .collect();
    if described.is_empty() {
        "-".to_string()
    } else {
        described.join("; ")
    }
}

fn peak_section(plan: &Plan, live: &[u64], peak: Option<usize>) -> Vec<String> {
    let mut lines = vec!["at the peak step".to_string()];
    let (Some(peak), Some(step)) = (peak, peak.and_then(|p| plan.schedule.get(p))) else {
        lines.push("  none: the schedule is empty".to_string());
        return lines;
    };
    let steps = plan.schedule.len();
    let mut at_peak: Vec<&Buffer> = plan
        .buffers
        .iter()
        .filter(|b| b.class.in_arena())
        .filter(|b| clamped_lifetime(b, steps).is_some_and(|(s, e)| s <= peak && peak <= e))
        .collect();
    // Largest first; equal sizes in id order, so the list is the same on every run.
    at_peak.sort_by_key(|b| (std::cmp::Reverse(b.size), b.id));
    let live_bytes = live.get(peak).copied().unwrap_or(0);
    lines.push(format!(
        "  step {peak} (node {}, stream {}): {}",
        step.node, step.stream, step.op
    ));
    lines.push(format!(
        "  live arena bytes {} in {} buffers",
        format_bytes(live_bytes),
        at_peak.len()
    ));

    let mut steps_of_node: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (index, step) in plan.schedule.iter().enumerate() {
        steps_of_node.entry(step.node).or_default().push(index);
    }
    use Align::{Left, Right};
    let header = [
        ("rank", Right),
        ("id", Right),
        ("class", Left),
        ("size", Right),
        ("steps", Left),
        ("name", Left),
        ("written by", Left),
    ];
    let rows: Vec<Vec<String>> = at_peak
        .iter()
        .take(PEAK_BUFFERS)
        .enumerate()
        .map(|(rank, b)| {
            vec![
                (rank + 1).to_string(),
                b.id.to_string(),
                class_name(b.class).to_string(),
                format_bytes(b.size),
                format!("{}..{}", b.start, b.end),
                b.name.clone(),
                writers(plan, &steps_of_node, b),
            ]
        })
        .collect();
    lines.extend(table(&header, &rows));
    if let Some(rest) = at_peak.get(PEAK_BUFFERS..).filter(|rest| !rest.is_empty()) {
        let bytes = rest.iter().fold(0u64, |sum, b| sum.saturating_add(b.size));
        lines.push(format!(
            "  ... and {} more buffers, {}",
            rest.len(),
            format_bytes(bytes)
        ));
    }
    lines
}

/// `[lo, hi)` of part `index` when `0..total` is cut into `parts` near-equal parts.
fn part(total: u64, parts: u64, index: u64) -> (u64, u64) {
    let bound = |i: u64| {
        let at = u128::from(total) * u128::from(i) / u128::from(parts.max(1));
        u64::try_from(at).unwrap_or(u64::MAX)
    };
    (bound(index), bound(index + 1))
}

/// Length of the overlap of `[a_lo, a_hi)` and `[b_lo, b_hi)`.
fn overlap(a_lo: u64, a_hi: u64, b_lo: u64, b_hi: u64) -> u64 {
    a_hi.min(b_hi).saturating_sub(a_lo.max(b_lo))
}

fn ascii_map(plan: &Plan, peak: Option<usize>) -> Vec<String> {
    let placed = placed_buffers(plan);
    let extent = byte_extent(plan, &placed);
    let steps = plan.schedule.len() as u64;
    if extent == 0 || steps == 0 {
        return vec!["time x offset map: nothing to draw (empty arena or empty schedule)".into()];
    }
    let rows = MAP_ROWS.min(extent);
    let columns = (MAP_COLUMNS as u64).min(steps);
    let each = |total: u64, parts: u64, unit: &str| {
        // (`is_multiple_of` would need Rust 1.87; the workspace supports 1.85.)
        let exact = if total / parts * parts == total {
            ""
        } else {
            "about "
        };
        format!("{exact}{} {unit}", total / parts)
    };
    let mut lines = vec![format!(
        "time x offset map: {rows} rows of {} (offset 0 at the bottom), {columns} columns of {}; \
         '#' activation, 'w' workspace, '.' free",
        each(extent, rows, "B"),
        each(steps, columns, "step(s)"),
    )];

    // Coverage (bytes × steps) of every cell by activations [0] and workspaces [1].
    let mut cover = vec![[0u128; 2]; (rows * columns) as usize];
    for p in &placed {
        let class = usize::from(p.buffer.class == BufferClass::Workspace);
        let (first, last) = (p.start as u64, p.end as u64 + 1);
        for row in 0..rows {
            let (lo, hi) = part(extent, rows, row);
            let bytes = overlap(p.offset, p.top, lo, hi);
            if bytes == 0 {
                continue;
            }
            for column in 0..columns {
                let (s_lo, s_hi) = part(steps, columns, column);
                let span = overlap(first, last, s_lo, s_hi);
                if span > 0 {
                    let cell = &mut cover[(row * columns + column) as usize][class];
                    *cell += u128::from(bytes) * u128::from(span);
                }
            }
        }
    }

    let label_width = part(extent, rows, rows - 1).0.to_string().len();
    for row in (0..rows).rev() {
        let cells: String = (0..columns)
            .map(|column| match cover[(row * columns + column) as usize] {
                [0, 0] => '.',
                [activation, workspace] if activation >= workspace => '#',
                _ => 'w',
            })
            .collect();
        let lo = part(extent, rows, row).0;
        lines.push(format!("  {lo:>label_width$} |{cells}|"));
    }
    if let Some(peak) = peak {
        let peak = peak as u64;
        let column = (0..columns)
            .find(|&c| part(steps, columns, c).1 > peak)
            .unwrap_or(0);
        let indent = " ".repeat(2 + label_width + 2 + column as usize);
        lines.push(format!("{indent}^ peak step {peak}"));
    }
    lines
}

#[cfg(test)]
#[path = "text_tests.rs"]
mod tests;
