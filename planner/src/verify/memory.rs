//! The rules about arena bytes: `alignment`, `bounds`, `lower_bound` and `overlap`.
//!
//! Only arena buffers (activations and workspaces; `classes` has checked they, and only they,
//! have offsets) take part. Sums and ends are computed in `u128`, which no sum of `u64` sizes
//! over fewer than 2^64 buffers overflows.

use super::order::{HappensBefore, Lifetimes};
use super::{describe_buffer, fail, PlanError};
use crate::{Buffer, Plan};

/// Arena buffers with their offsets.
fn arena(plan: &Plan) -> impl Iterator<Item = (&Buffer, u64)> {
    plan.buffers
        .iter()
        .filter_map(|b| b.offset.map(|offset| (b, offset)))
}

/// Checks `alignment`.
pub(super) fn check_alignment(plan: &Plan) -> Result<(), PlanError> {
    let alignment = plan.options.alignment;
    if alignment == 0 {
        // Offsets are multiples of the alignment; nothing is a multiple of 0 but 0.
        return fail("alignment", "options.alignment is 0".to_string());
    }
    if let Some((buffer, offset)) = arena(plan).find(|(_, offset)| offset % alignment != 0) {
        // Kernels assume aligned pointers (vector loads, tensor-core tiles).
        let what = describe_buffer(plan, buffer.id);
        let detail = format!("{what} is at offset {offset}, not a multiple of {alignment}");
        return fail("alignment", detail);
    }
    Ok(())
}

/// Checks `bounds`.
pub(super) fn check_bounds(plan: &Plan) -> Result<(), PlanError> {
    let arena_bytes = plan.arena_bytes;
    for (buffer, offset) in arena(plan) {
        let end = u128::from(offset) + u128::from(buffer.size);
        if end > u128::from(arena_bytes) {
            // The buffer would run past the end of the arena.
            let what = describe_buffer(plan, buffer.id);
            let detail = format!("{what} ends at byte {end}, past the arena's {arena_bytes}");
            return fail("bounds", detail);
        }
    }
    if arena_bytes < plan.lower_bound_bytes {
        // No placement fits in less than the peak of live bytes.
        let bound = plan.lower_bound_bytes;
        let detail = format!("arena_bytes {arena_bytes} is below lower_bound_bytes {bound}");
        return fail("bounds", detail);
    }
    Ok(())
}

/// Checks `lower_bound`.
pub(super) fn check_lower_bound(plan: &Plan) -> Result<(), PlanError> {
    let alignment = u128::from(plan.options.alignment.max(1));
    // Live bytes change by +size at `start` and by -size after `end` (a difference array).
    let mut change = vec![0i128; plan.schedule.len() + 1];
    for (buffer, _) in arena(plan) {
        // At most 2^64 · 2: far inside i128.
        let rounded = (u128::from(buffer.size).div_ceil(alignment) * alignment) as i128;
        // `lifetimes` has checked start <= end < steps; the test only skips the no-step case.
        if buffer.end < plan.schedule.len() {
            change[buffer.start] += rounded;
            change[buffer.end + 1] -= rounded;
        }
    }
    let (mut live, mut peak, mut peak_step) = (0i128, 0i128, 0);
    for (step, delta) in change.iter().enumerate() {
        live += delta;
        if live > peak {
            (peak, peak_step) = (live, step);
        }
    }
    if peak != i128::from(plan.lower_bound_bytes) {
        // The reported bound is the exact peak of live bytes, which this schedule forces.
        let bound = plan.lower_bound_bytes;
        let detail =
            format!("lower_bound_bytes is {bound} but {peak} bytes are live at step {peak_step}");
        return fail("lower_bound", detail);
    }
    Ok(())
}

/// Checks `overlap`.
pub(super) fn check_overlap(
    plan: &Plan,
    lifetimes: &Lifetimes,
    order: &HappensBefore,
) -> Result<(), PlanError> {
    // Arena buffers that occupy bytes, by offset: only neighbors in this order can share one.
    let mut placed: Vec<(&Buffer, u128, u128)> = arena(plan)
        .filter(|(b, _)| b.size > 0)
        .map(|(b, offset)| {
            (
                b,
                u128::from(offset),
                u128::from(offset) + u128::from(b.size),
            )
        })
        .collect();
    placed.sort_by_key(|(b, offset, _)| (*offset, b.id));
    // Whether every touch of `a` happens before `b` is first written.
    let done_before = |a: &Buffer, b: &Buffer| {
        let first = lifetimes.first_write[b.id];
        !lifetimes.kept[a.id]
            && first.is_some_and(|f| lifetimes.touches[a.id].iter().all(|t| order.before(*t, f)))
    };
    for (i, &(a, a_start, a_end)) in placed.iter().enumerate() {
        for &(b, b_start, b_end) in placed[i + 1..].iter().take_while(|(_, s, _)| *s < a_end) {
            let shared = format!(
                "{} and {} share bytes {}..{}",
                describe_buffer(plan, a.id),
                describe_buffer(plan, b.id),
                a_start.max(b_start),
                a_end.min(b_end),
            );
            if plan.streams() <= 1 && !(a.end < b.start || b.end < a.start) {
                // One stream: both are live at this step, so one would clobber the other.
                let step = a.start.max(b.start);
                return fail(
                    "overlap",
                    format!("{shared} while both live at step {step}"),
                );
            }
            if plan.streams() > 1 && !done_before(a, b) && !done_before(b, a) {
                // Several streams: nothing orders all uses of one before the other's first write.
                let detail = format!(
                    "{shared} and no event orders one's uses before the other's first write"
                );
                return fail("overlap", detail);
            }
        }
    }
    Ok(())
}
