//! L2 prefetch of the parameters a program is about to read
//! (`LowerOptions::l2_prefetch_bytes`).
//!
//! A decode step reads each weight once, in kernels of a few microseconds whose loads wait on
//! HBM while the kernels between them (RoPE, the cached attention) leave HBM idle. Each host
//! kernel ([`prefetch`]: the cached attention's split) of a block per multiprocessor at least
//! ([`prefetch::spreads`]) is given the parameters that the launches after it on its stream
//! read, up to the next host: in their first reader's order,
//! at most [`prefetch::RANGES`] of them and the option's bytes in all (the last maybe only its
//! first bytes), so that what is fetched still sits in L2 when its reader runs. A prefetch
//! is a hint: it changes no result.

use kiln_ir::InputKind;
use kiln_kernels::gpu::{prefetch, Addr, Launch};

use crate::error::Result;
use crate::program::{Slot, SlotKind, StepLaunches};

/// Parameters smaller than this are not worth a range (norm weights, biases).
pub(crate) const MIN_BYTES: u64 = 64 << 10;

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
        let is_host = |&(s, l): &(usize, usize)| matches!(&steps[s].launches[l], Launch::Kernel(k) if k.prefetch_host);
        let hosts: Vec<usize> = (0..order.len()).filter(|&i| is_host(&order[i])).collect();
        for (n, &host) in hosts.iter().enumerate() {
            let end = hosts.get(n + 1).copied().unwrap_or(order.len());
            let window = order[host + 1..end]
                .iter()
                .map(|&(s, l)| &steps[s].launches[l]);
            let ranges = choose(window, slots, budget);
            let (s, l) = order[host];
            if let Launch::Kernel(kernel) = &mut steps[s].launches[l] {
                if prefetch::spreads(kernel) {
                    prefetch::fill(kernel, &ranges)?;
                }
            }
        }
    }
    Ok(())
}

/// The ranges of the parameters `launches` read (see the module doc).
fn choose<'l>(
    launches: impl Iterator<Item = &'l Launch>,
    slots: &[Slot],
    budget: u64,
) -> Vec<(Addr, u64)> {
    let mut read: Vec<u32> = Vec::new();
    for addr in launches.flat_map(Launch::addresses) {
        let slot = &slots[addr.slot as usize];
        let param = slot.kind == SlotKind::Input(InputKind::Param);
        if param && slot.bytes >= MIN_BYTES && !read.contains(&addr.slot) {
            read.push(addr.slot);
        }
    }
    let mut left = budget;
    let mut ranges = Vec::new();
    for slot in read.into_iter().take(prefetch::RANGES) {
        if left == 0 {
            break;
        }
        let bytes = slots[slot as usize].bytes.min(left);
        ranges.push((Addr { slot, offset: 0 }, bytes));
        left -= bytes;
    }
    ranges
}
