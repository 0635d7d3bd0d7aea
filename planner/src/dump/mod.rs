//! Plan dumps: the same [`Plan`] as JSON (for tools), text (for people), CSV (for
//! spreadsheets) and SVG (a time × offset picture of the arena for a browser).
//!
//! Invariants:
//! 1. Every dump is a pure function of the plan (the text dump also of the planning time it is
//!    handed): the same plan gives the same bytes. Lists are walked in their stored order or
//!    sorted with a full tie-break; nothing iterates a hash map; floats are printed with a
//!    fixed number of decimals.
//! 2. Dumps never panic, even on a plan the verifier would reject (a lifetime past the
//!    schedule, an arena buffer without an offset, sizes near `u64::MAX`): arithmetic
//!    saturates or widens, out-of-range lifetimes are clamped to the schedule, and buffers
//!    that cannot be drawn are left out of the pictures (they still appear in the tables).
//! 3. All dumps agree on the shared facts: the live arena bytes of a step are the sizes of the
//!    arena buffers whose lifetime contains it, and the peak step is the FIRST step where they
//!    are maximal.

mod attribution;
mod attribution_svg;
mod csv;
mod svg;
mod text;

#[cfg(test)]
mod fixture;
#[cfg(test)]
mod tests;

pub use attribution::{
    attribute, Attribution, ByCategory, Category, GroupBytes, Source, CATEGORIES,
};
pub use csv::to_csv;
pub use svg::to_svg;
pub use text::to_text;

use crate::{Buffer, BufferClass, Plan};

/// The plan as pretty-printed JSON (the serde form of [`Plan`]; it reads back to the same
/// plan), ending in a newline.
pub fn to_json(plan: &Plan) -> String {
    // Plan is plain data: strings, integers, lists and tuples, no maps and no floats, so
    // serde_json has nothing it could refuse; an error here is a bug in the data model.
    let mut json = serde_json::to_string_pretty(plan).expect("a Plan always serializes to JSON");
    json.push('\n');
    json
}

/// The class as it is spelled in JSON (serde's lowercase names).
fn class_name(class: BufferClass) -> &'static str {
    match class {
        BufferClass::Param => "param",
        BufferClass::Input => "input",
        BufferClass::Output => "output",
        BufferClass::State => "state",
        BufferClass::Activation => "activation",
        BufferClass::Workspace => "workspace",
    }
}

/// Every class, in declaration order (the order summaries list them in).
const CLASSES: [BufferClass; 6] = [
    BufferClass::Param,
    BufferClass::Input,
    BufferClass::Output,
    BufferClass::State,
    BufferClass::Activation,
    BufferClass::Workspace,
];

/// Binary units, largest first.
const UNITS: [(&str, u64); 6] = [
    ("EiB", 1 << 60),
    ("PiB", 1 << 50),
    ("TiB", 1 << 40),
    ("GiB", 1 << 30),
    ("MiB", 1 << 20),
    ("KiB", 1 << 10),
];

/// `bytes` in the largest binary unit it reaches, two decimals: "1.50 MiB"; under 1 KiB the
/// exact count: "512 B".
fn format_bytes_short(bytes: u64) -> String {
    for (unit, scale) in UNITS {
        if bytes >= scale {
            return format!("{:.2} {unit}", bytes as f64 / scale as f64);
        }
    }
    format!("{bytes} B")
}

/// `bytes` for people, with the exact count when rounded: "1.50 MiB (1572864 B)", "512 B".
fn format_bytes(bytes: u64) -> String {
    if bytes < 1024 {
        format_bytes_short(bytes)
    } else {
        format!("{} ({bytes} B)", format_bytes_short(bytes))
    }
}

/// Live arena bytes at every schedule step (see invariant 3). Lifetimes past the schedule are
/// clamped to it; a buffer whose lifetime is empty or starts past the schedule counts nowhere.
fn live_arena_bytes(plan: &Plan) -> Vec<u64> {
    let steps = plan.schedule.len();
    // Difference arrays: a buffer adds its size at its start and takes it back after its end.
    // u128 so that no sum of u64 sizes can overflow.
    let mut born = vec![0u128; steps];
    let mut dead = vec![0u128; steps + 1];
    for buffer in plan.buffers.iter().filter(|b| b.class.in_arena()) {
        if let Some((start, end)) = clamped_lifetime(buffer, steps) {
            born[start] += u128::from(buffer.size);
            dead[end + 1] += u128::from(buffer.size);
        }
    }
    let mut live = 0u128;
    let mut per_step = Vec::with_capacity(steps);
    for step in 0..steps {
        live = live + born[step] - dead[step];
        per_step.push(u64::try_from(live).unwrap_or(u64::MAX));
    }
    per_step
}

/// The first step with the most live arena bytes; `None` for an empty schedule.
fn peak_step(live: &[u64]) -> Option<usize> {
    let max = live.iter().copied().max()?;
    live.iter().position(|&bytes| bytes == max)
}

/// The buffer's lifetime `[start, end]` clamped to a schedule of `steps` steps; `None` when
/// nothing of it lies inside (empty lifetime, or it starts past the end).
fn clamped_lifetime(buffer: &Buffer, steps: usize) -> Option<(usize, usize)> {
    if buffer.start > buffer.end || buffer.start >= steps {
        return None;
    }
    Some((buffer.start, buffer.end.min(steps - 1)))
}

/// An arena buffer as the pictures draw it: steps `[start, end]` (clamped to the schedule) by
/// bytes `[offset, top)`.
struct Placed<'a> {
    buffer: &'a Buffer,
    start: usize,
    end: usize,
    offset: u64,
    top: u64,
}

/// The arena buffers that can be drawn (they have an offset and a lifetime inside the
/// schedule), in buffer order.
fn placed_buffers(plan: &Plan) -> Vec<Placed<'_>> {
    let steps = plan.schedule.len();
    plan.buffers
        .iter()
        .filter(|b| b.class.in_arena())
        .filter_map(|buffer| {
            let offset = buffer.offset?;
            let (start, end) = clamped_lifetime(buffer, steps)?;
            Some(Placed {
                buffer,
                start,
                end,
                offset,
                top: offset.saturating_add(buffer.size),
            })
        })
        .collect()
}

/// Bytes the pictures span: the arena, or more if a (bad) placement reaches past it, so that
/// everything placed is drawn.
fn byte_extent(plan: &Plan, placed: &[Placed]) -> u64 {
    placed
        .iter()
        .map(|p| p.top)
        .fold(plan.arena_bytes, u64::max)
}

/// `arena / lower bound` with four decimals, or why there is none.
fn ratio_text(plan: &Plan) -> String {
    if plan.lower_bound_bytes == 0 {
        "n/a (lower bound is 0)".to_string()
    } else {
        format!(
            "{:.4}",
            plan.arena_bytes as f64 / plan.lower_bound_bytes as f64
        )
    }
}
