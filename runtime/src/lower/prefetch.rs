//! L2 prefetch of the parameters a program is about to read
//! (`LowerOptions::l2_prefetch_bytes`).
//!
//! A decode step reads each weight once, in kernels of a few microseconds whose loads wait on
//! HBM, while the kernels between them (RoPE, the cached attention) leave HBM idle. Beside
//! each fork kernel (a cached attention's split of at least `l2_prefetch_min_rows` rows,
//! [`decode::split_rows`]), a launch of its own on a side stream
//! ([`prefetch::side_kernel`]) prefetches the parameters that the launches after the fork on
//! its stream read, up to the next fork: whole, in their first reader's order, while they fit
//! `l2_prefetch_bytes`, at most [`prefetch::RANGES`] of them (the [`LowerOptions`]). It waits
//! for the step `l2_prefetch_lead` steps before the fork's (an event that step records), so it runs beside the
//! steps from there. A prefetch is a hint: it changes no result.

use kiln_ir::InputKind;
use kiln_kernels::gpu::{decode, prefetch, Addr, Launch};

use super::LowerOptions;
use crate::error::Result;
use crate::program::{Slot, SlotKind, StepLaunches};

/// Parameters smaller than this are not worth a range (norm weights, biases).
const MIN_BYTES: u64 = 64 << 10;

/// Adds the side launches of the module doc to `steps` as `options` ask, on stream `stream`,
/// waiting for events numbered from `first_event` on (recorded by the steps
/// `options.l2_prefetch_lead` before the forks). Returns the events it added.
pub(crate) fn assign(
    steps: &mut Vec<StepLaunches>,
    slots: &[Slot],
    options: &LowerOptions,
    (stream, first_event): (usize, usize),
) -> Result<usize> {
    let streams = steps.iter().map(|s| s.stream + 1).max().unwrap_or(0);
    // (the step that records its event, the side step).
    let mut side: Vec<(usize, StepLaunches)> = Vec::new();
    for on in 0..streams {
        // (step, launch) of every launch of stream `on`, in issue order.
        let order: Vec<(usize, usize)> = (steps.iter().enumerate())
            .filter(|(_, step)| step.stream == on)
            .flat_map(|(s, step)| (0..step.launches.len()).map(move |l| (s, l)))
            .collect();
        // (position in `order`, rows) of every split.
        let forks: Vec<(usize, u64)> = (order.iter().enumerate())
            .filter_map(|(i, &(s, l))| Some((i, split_rows(&steps[s].launches[l])?)))
            .collect();
        for (n, &(at, rows)) in forks.iter().enumerate() {
            if rows < options.l2_prefetch_min_rows {
                continue;
            }
            let s = order[at].0;
            // The step `lead` steps before the fork's on its stream records the event.
            let mut earlier = (0..s).rev().filter(|&b| steps[b].stream == on);
            let Some(before) = earlier.nth(options.l2_prefetch_lead.max(1) - 1) else {
                continue;
            };
            let end = forks.get(n + 1).map_or(order.len(), |&(next, _)| next);
            let window = order[at + 1..end].iter();
            let ranges = choose(
                window.map(|&(s, l)| &steps[s].launches[l]),
                slots,
                options.l2_prefetch_bytes,
            );
            if ranges.is_empty() {
                continue;
            }
            let event = first_event + side.len();
            steps[before].records.push(event);
            let step = StepLaunches {
                schedule: None,
                node: steps[s].node,
                op: "l2_prefetch".to_string(),
                stream,
                waits: vec![event],
                records: Vec::new(),
                launches: vec![Launch::Kernel(prefetch::side_kernel(&ranges)?)],
            };
            side.push((before, step));
        }
    }
    // Each side step right after the step that records its event: issued in order, eagerly
    // too, it runs beside the steps from there.
    let events = side.len();
    let mut after: Vec<Vec<StepLaunches>> = vec![Vec::new(); steps.len()];
    for (before, step) in side {
        after[before].push(step);
    }
    let program = std::mem::take(steps).into_iter().zip(after);
    *steps = program
        .flat_map(|(step, side)| std::iter::once(step).chain(side))
        .collect();
    Ok(events)
}

/// The rows of `launch` if it is a cached attention's split.
fn split_rows(launch: &Launch) -> Option<u64> {
    match launch {
        Launch::Kernel(kernel) => decode::split_rows(kernel),
        _ => None,
    }
}

/// The ranges of the parameters `launches` read (see the module doc).
fn choose<'l>(
    launches: impl Iterator<Item = &'l Launch>,
    slots: &[Slot],
    budget: u64,
) -> Vec<(Addr, u64)> {
    let mut read: Vec<(u32, u64)> = Vec::new();
    for addr in launches.flat_map(Launch::addresses) {
        let Some(slot) = slots.get(addr.slot as usize) else {
            continue; // the program's address check reports it
        };
        let param = slot.kind == SlotKind::Input(InputKind::Param);
        if param && slot.bytes >= MIN_BYTES && !read.iter().any(|&(s, _)| s == addr.slot) {
            // Whole 16-byte units: the few bytes past the last are not prefetched.
            read.push((addr.slot, slot.bytes / prefetch::ALIGN * prefetch::ALIGN));
        }
    }
    let mut left = budget;
    let mut ranges = Vec::new();
    for (slot, bytes) in read.into_iter().take(prefetch::RANGES) {
        if bytes > left {
            break;
        }
        ranges.push((Addr { slot, offset: 0 }, bytes));
        left -= bytes;
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_kernels::gpu::{Arg, Kernel};

    const MIB: u64 = 1 << 20;
    const SIDE: (usize, usize) = (1, 5);
    const MIN_ROWS: u64 = 8;

    fn fork(l2_prefetch_bytes: u64) -> LowerOptions {
        LowerOptions {
            l2_prefetch_bytes,
            l2_prefetch_lead: 1,
            l2_prefetch_min_rows: MIN_ROWS,
            ..LowerOptions::default()
        }
    }

    /// The arena, then a parameter of each of `sizes` (slot i + 1).
    fn slots(sizes: &[u64]) -> Vec<Slot> {
        let param = |(i, &bytes)| Slot {
            name: format!("w{i}"),
            kind: SlotKind::Input(InputKind::Param),
            bytes,
        };
        let arena = Slot {
            name: "arena".to_string(),
            kind: SlotKind::Arena,
            bytes: 64 * MIB,
        };
        [arena]
            .into_iter()
            .chain(sizes.iter().enumerate().map(param))
            .collect()
    }

    /// A kernel reading `reads` (slots): a split of `rows` rows, or another kernel (`None`).
    fn kernel(split: Option<u32>, reads: &[u32]) -> Launch {
        Launch::Kernel(Kernel {
            module: "decode",
            function: match split {
                Some(_) => "cached_attention_split_f32_bf16",
                None => "cached_attention_combine_f32",
            },
            grid: (16, 2, split.unwrap_or(1)),
            block: (256, 1, 1),
            shared_bytes: 0,
            cluster: (1, 1, 1),
            args: (reads.iter())
                .map(|&slot| Arg::Ptr(Addr { slot, offset: 0 }))
                .collect(),
        })
    }

    fn step(launches: Vec<Launch>) -> StepLaunches {
        StepLaunches {
            schedule: Some(0),
            node: 0,
            op: "op".to_string(),
            stream: 0,
            waits: vec![],
            records: vec![],
            launches,
        }
    }

    /// The (slot, bytes) each side launch prefetches after [`assign`] with `budget`.
    fn prefetched(
        mut steps: Vec<StepLaunches>,
        slots: &[Slot],
        budget: u64,
    ) -> Vec<Vec<(u32, u64)>> {
        let before = steps.len();
        let events = assign(&mut steps, slots, &fork(budget), SIDE).unwrap();
        assert_eq!(steps.len(), before + events);
        (steps.iter().filter(|step| step.schedule.is_none()))
            .map(|step| match &step.launches[..] {
                [Launch::Kernel(k)] => (prefetch::ranges(k).into_iter())
                    .map(|(a, n)| (a.slot, n))
                    .collect(),
                other => panic!("one side kernel: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn side_launches_wait_for_the_step_before_each_fork_and_prefetch_its_window() {
        let slots = slots(&[MIB, 2 * MIB, 3 * MIB]);
        let steps: Vec<StepLaunches> = [
            vec![kernel(None, &[1])],
            vec![kernel(Some(8), &[]), kernel(None, &[2])],
            vec![kernel(None, &[3])],
            vec![kernel(Some(8), &[]), kernel(None, &[1])],
        ]
        .into_iter()
        .enumerate()
        .map(|(index, launches)| StepLaunches {
            schedule: Some(index),
            ..step(launches)
        })
        .collect();
        let mut forked = steps.clone();
        assert_eq!(
            assign(&mut forked, &slots, &fork(64 * MIB), SIDE).unwrap(),
            2
        );
        // Each side step right after the step that records its event; the program's own
        // steps in their order, their launches as they were.
        let order: Vec<Option<usize>> = forked.iter().map(|s| s.schedule).collect();
        assert_eq!(order, [Some(0), None, Some(1), Some(2), None, Some(3)]);
        assert_eq!(
            (forked[0].records.clone(), forked[3].records.clone()),
            (vec![5], vec![6])
        );
        for step in forked.iter().filter(|s| s.schedule.is_some()) {
            let planned = &steps[step.schedule.unwrap()];
            assert_eq!(step.launches, planned.launches);
        }
        for (step, event) in [(&forked[1], 5), (&forked[4], 6)] {
            assert_eq!((step.stream, step.waits.clone()), (1, vec![event]));
        }
        assert_eq!(
            prefetched(steps.clone(), &slots, 64 * MIB),
            [vec![(2, 2 * MIB), (3, 3 * MIB)], vec![(1, MIB)]]
        );
        // Two steps ahead: the second fork's event is recorded by the first fork's step; the
        // first fork has no step two before it.
        let mut ahead = steps;
        let lead = LowerOptions {
            l2_prefetch_lead: 2,
            ..fork(64 * MIB)
        };
        assert_eq!(assign(&mut ahead, &slots, &lead, SIDE).unwrap(), 1);
        assert_eq!(ahead[1].records, vec![5]);
        assert_eq!(ahead[2].schedule, None);
        assert!([0, 3, 4].iter().all(|&s| ahead[s].records.is_empty()));
    }

    #[test]
    fn the_step_before_a_fork_is_the_one_before_it_on_its_stream() {
        let slots = slots(&[MIB]);
        let on = |stream, launches| StepLaunches {
            stream,
            ..step(launches)
        };
        // The split on stream 1, after a step on stream 0 and one on stream 1.
        let steps = vec![
            on(1, vec![kernel(None, &[])]),
            on(0, vec![kernel(None, &[])]),
            on(1, vec![kernel(Some(8), &[]), kernel(None, &[1])]),
        ];
        let mut forked = steps.clone();
        let side = (2, 0);
        assert_eq!(
            assign(&mut forked, &slots, &fork(64 * MIB), side).unwrap(),
            1
        );
        assert_eq!(forked[0].records, vec![0]);
        assert!(forked[2].records.is_empty());
        assert_eq!((forked[1].stream, forked[1].waits.clone()), (2, vec![0]));
    }

    #[test]
    fn side_steps_of_forks_on_two_streams_each_follow_their_own_recording_step() {
        let slots = slots(&[MIB, 2 * MIB]);
        let on = |stream, schedule, launches| StepLaunches {
            stream,
            schedule: Some(schedule),
            ..step(launches)
        };
        // Stream 0's fork is found first but its event is recorded later (step 2) than
        // stream 1's (step 0).
        let steps = vec![
            on(1, 0, vec![kernel(None, &[])]),
            on(1, 1, vec![kernel(Some(8), &[]), kernel(None, &[2])]),
            on(0, 2, vec![kernel(None, &[])]),
            on(0, 3, vec![kernel(Some(8), &[]), kernel(None, &[1])]),
        ];
        let mut forked = steps;
        assert_eq!(
            assign(&mut forked, &slots, &fork(64 * MIB), (2, 0)).unwrap(),
            2
        );
        let order: Vec<Option<usize>> = forked.iter().map(|s| s.schedule).collect();
        assert_eq!(order, [Some(0), None, Some(1), Some(2), None, Some(3)]);
        assert_eq!(
            (forked[3].records.clone(), forked[0].records.clone()),
            (vec![0], vec![1])
        );
        assert_eq!(
            (forked[4].waits.clone(), forked[1].waits.clone()),
            (vec![0], vec![1])
        );
    }

    #[test]
    fn a_fork_takes_whole_weights_in_reading_order_until_one_does_not_fit() {
        // 8 MiB, 20 MiB, 1 MiB, a 4 KiB bias, and the arena: with 16 MiB, the first alone (the
        // second does not fit; the third is not taken past it).
        let slots = slots(&[8 * MIB, 20 * MIB, MIB, 4096]);
        let steps = vec![
            step(vec![kernel(None, &[])]),
            step(vec![kernel(Some(8), &[0])]),
            step(vec![kernel(None, &[4, 1, 0]), kernel(None, &[2, 3, 1])]),
        ];
        assert_eq!(
            prefetched(steps.clone(), &slots, 16 * MIB),
            [vec![(1, 8 * MIB)]]
        );
        assert_eq!(
            prefetched(steps.clone(), &slots, 40 * MIB),
            [vec![(1, 8 * MIB), (2, 20 * MIB), (3, MIB)]]
        );
        // Nothing fits: no side launch, nothing recorded.
        let mut none = steps.clone();
        assert_eq!(assign(&mut none, &slots, &fork(MIB / 2), SIDE).unwrap(), 0);
        assert_eq!(none, steps);
    }

    #[test]
    fn a_fork_takes_at_most_its_ranges_up_to_the_next_fork() {
        let slots = slots(&[MIB; 11]);
        let all: Vec<u32> = (1..=10).collect();
        let steps = vec![
            step(vec![kernel(None, &[])]),
            step(vec![kernel(Some(8), &[]), kernel(None, &all)]),
            step(vec![kernel(Some(8), &[]), kernel(None, &[11])]),
        ];
        let got = prefetched(steps, &slots, 64 * MIB);
        assert_eq!(got[0].len(), prefetch::RANGES);
        assert_eq!(got[0][0], (1, MIB));
        assert_eq!(got[1], [(11, MIB)]);
    }

    #[test]
    fn no_fork_from_a_split_of_too_few_rows_or_with_no_step_before_it() {
        let slots = slots(&[MIB]);
        let few = vec![
            step(vec![kernel(None, &[])]),
            step(vec![
                kernel(Some(MIN_ROWS as u32 - 1), &[]),
                kernel(None, &[1]),
            ]),
        ];
        assert!(prefetched(few, &slots, 64 * MIB).is_empty());
        let first = vec![step(vec![kernel(Some(8), &[]), kernel(None, &[1])])];
        assert!(prefetched(first, &slots, 64 * MIB).is_empty());
    }
}
