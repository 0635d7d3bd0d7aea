//! L2 prefetch of the parameters a program is about to read
//! (`LowerOptions::l2_prefetch_bytes`).
//!
//! A decode step reads each weight once, in kernels of a few microseconds whose loads wait on
//! HBM while the kernels between them (RoPE, the cached attention) leave HBM idle. Each host
//! kernel ([`prefetch`]: the cached attention's split) of a block per multiprocessor at least
//! ([`prefetch::spreads`]) is given the parameters that the launches after it on its stream
//! read, up to the next host: whole, in their first reader's order, while they fit the
//! option's bytes, at most [`prefetch::RANGES`] of them. A prefetch is a hint: it changes no
//! result.

use kiln_ir::InputKind;
use kiln_kernels::gpu::{prefetch, Addr, Launch};

use crate::error::Result;
use crate::program::{Slot, SlotKind, StepLaunches};

/// Parameters smaller than this are not worth a range (norm weights, biases).
const MIN_BYTES: u64 = 64 << 10;

/// Fills every host kernel's ranges in `steps`, at most `budget` bytes a host (see the module
/// doc).
pub(crate) fn assign(steps: &mut [StepLaunches], slots: &[Slot], budget: u64) -> Result<()> {
    let streams = steps.iter().map(|s| s.stream + 1).max().unwrap_or(0);
    for stream in 0..streams {
        // (step, launch) of every launch of the stream, in issue order.
        let order: Vec<(usize, usize)> = (steps.iter().enumerate())
            .filter(|(_, step)| step.stream == stream)
            .flat_map(|(s, step)| (0..step.launches.len()).map(move |l| (s, l)))
            .collect();
        let hosts: Vec<usize> = (0..order.len())
            .filter(|&i| is_host(&steps[order[i].0].launches[order[i].1]))
            .collect();
        for (n, &host) in hosts.iter().enumerate() {
            let (s, l) = order[host];
            if !matches!(&steps[s].launches[l], Launch::Kernel(k) if prefetch::spreads(k)) {
                continue;
            }
            let end = hosts.get(n + 1).copied().unwrap_or(order.len());
            let window = order[host + 1..end].iter();
            let ranges = choose(window.map(|&(s, l)| &steps[s].launches[l]), slots, budget);
            if let Launch::Kernel(kernel) = &mut steps[s].launches[l] {
                prefetch::fill(kernel, &ranges)?;
            }
        }
    }
    Ok(())
}

/// Whether `launch` is a kernel that can host prefetches.
fn is_host(launch: &Launch) -> bool {
    matches!(launch, Launch::Kernel(kernel) if kernel.prefetch_host.is_some())
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

    fn kernel(blocks: u32, host: bool, reads: &[u32]) -> Launch {
        Launch::Kernel(Kernel {
            module: "decode",
            function: "cached_attention_split_f32_bf16",
            grid: (blocks, 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
            cluster: (1, 1, 1),
            args: (reads.iter())
                .map(|&slot| Arg::Ptr(Addr { slot, offset: 0 }))
                .collect(),
            prefetch_host: host.then_some("cached_attention_split_f32_bf16_prefetch"),
        })
    }

    fn step(launches: Vec<Launch>) -> StepLaunches {
        StepLaunches {
            node: 0,
            op: "op".to_string(),
            stream: 0,
            waits: vec![],
            records: vec![],
            launches,
        }
    }

    /// The (slot, bytes) each host prefetches after [`assign`] with `budget`.
    fn assigned(mut steps: Vec<StepLaunches>, slots: &[Slot], budget: u64) -> Vec<Vec<(u32, u64)>> {
        assign(&mut steps, slots, budget).unwrap();
        (steps.iter().flat_map(|s| &s.launches))
            .filter_map(|launch| match launch {
                Launch::Kernel(k) if k.prefetch_host.is_some() => Some(
                    (prefetch::ranges(k).into_iter())
                        .map(|(a, n)| (a.slot, n))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_host_takes_whole_weights_in_reading_order_until_one_does_not_fit() {
        // 8 MiB, 20 MiB, 1 MiB, a 4 KiB bias, and the arena: with 16 MiB, the first alone (the
        // second does not fit; the third is not taken past it).
        let slots = slots(&[8 * MIB, 20 * MIB, MIB, 4096]);
        let steps = vec![
            step(vec![kernel(132, true, &[0])]),
            step(vec![
                kernel(4, false, &[4, 1, 0]),
                kernel(4, false, &[2, 3, 1]),
            ]),
        ];
        assert_eq!(
            assigned(steps.clone(), &slots, 16 * MIB),
            [vec![(1, 8 * MIB)]]
        );
        assert_eq!(
            assigned(steps, &slots, 40 * MIB),
            [vec![(1, 8 * MIB), (2, 20 * MIB), (3, MIB)]]
        );
    }

    #[test]
    fn a_host_takes_at_most_its_ranges_up_to_the_next_host() {
        let slots = slots(&[MIB; 11]);
        let all: Vec<u32> = (1..=10).collect();
        let steps = vec![
            step(vec![kernel(132, true, &[]), kernel(4, false, &all)]),
            step(vec![kernel(132, true, &[]), kernel(4, false, &[11])]),
        ];
        let got = assigned(steps, &slots, 64 * MIB);
        assert_eq!(got[0].len(), prefetch::RANGES);
        assert_eq!(got[0][0], (1, MIB));
        assert_eq!(got[1], [(11, MIB)]);
    }

    #[test]
    fn a_host_of_fewer_blocks_than_multiprocessors_takes_none() {
        let slots = slots(&[MIB]);
        let steps = vec![step(vec![kernel(131, true, &[]), kernel(4, false, &[1])])];
        assert_eq!(
            assigned(steps, &slots, 64 * MIB),
            [Vec::<(u32, u64)>::new()]
        );
    }
}
