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
