//! L2 prefetch ranges: a host kernel (`KILN_PREFETCH_PARAMS` in `common.cuh`) issues bulk
//! prefetches into L2 of up to [`RANGES`] ranges of bytes before its wait, so that the
//! parameters of the launches after it come from L2 rather than HBM. Its builder passes
//! [`none`]; the program chooses the ranges ([`fill`]) once every launch is known.

use super::{Addr, Arg, Kernel};
use crate::{Error, Result};

/// Ranges a host kernel takes.
pub const RANGES: usize = 8;
/// Its prefetch args: a pointer and a byte count per range.
pub const ARGS: usize = 2 * RANGES;

/// The prefetch args of no range (a null pointer and 0 bytes each), the last args of a host.
pub fn none() -> [Arg; ARGS] {
    [Arg::Null, Arg::I64(0)]
        .repeat(RANGES)
        .try_into()
        .expect("ARGS args")
}

/// Whether host `kernel` has a block for each multiprocessor (of the GPUs the split rules fill),
/// so that the prefetches spread over every multiprocessor's bulk copy unit. A host of fewer
/// blocks (the decode split at batch 1: 32) issues them from a few, which then finish late:
/// measured slower (BENCHMARKS.md), so it is given none.
pub fn spreads(kernel: &Kernel) -> bool {
    let (x, y, z) = kernel.grid;
    u64::from(x) * u64::from(y) * u64::from(z) >= super::launch::SMS
}

/// Writes `ranges` (address, bytes) into host `kernel`'s prefetch args, the rest none.
pub fn fill(kernel: &mut Kernel, ranges: &[(Addr, u64)]) -> Result<()> {
    let refuse = |reason: String| Error::Argument {
        op: kernel.function,
        argument: "prefetch",
        reason,
    };
    if !kernel.prefetch_host || kernel.args.len() < ARGS {
        return Err(refuse("the kernel takes no prefetch ranges".to_string()));
    }
    if ranges.len() > RANGES {
        return Err(refuse(format!(
            "{} ranges, more than {RANGES}",
            ranges.len()
        )));
    }
    let first = kernel.args.len() - ARGS;
    kernel.args[first..].copy_from_slice(&none());
    for (i, &(addr, bytes)) in ranges.iter().enumerate() {
        let bytes = i64::try_from(bytes).map_err(|_| refuse(format!("{bytes} bytes")))?;
        kernel.args[first + 2 * i] = Arg::Ptr(addr);
        kernel.args[first + 2 * i + 1] = Arg::I64(bytes);
    }
    Ok(())
}

/// The ranges `kernel` prefetches (none unless it is a host whose ranges were filled).
pub fn ranges(kernel: &Kernel) -> Vec<(Addr, u64)> {
    if !kernel.prefetch_host || kernel.args.len() < ARGS {
        return Vec::new();
    }
    let args = &kernel.args[kernel.args.len() - ARGS..];
    (args.chunks(2))
        .filter_map(|pair| match pair {
            [Arg::Ptr(addr), Arg::I64(bytes)] if *bytes > 0 => Some((*addr, *bytes as u64)),
            _ => None,
        })
        .collect()
}
