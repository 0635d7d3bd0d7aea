//! L2 prefetch: a launch of its own ([`side_kernel`], `prefetch_l2` in
//! `kernels/cuda/prefetch.cu`) issues bulk prefetches into L2 of up to [`RANGES`] ranges of
//! bytes, so that the parameters a program's next launches read come from L2 rather than HBM.
//! The program runs it on a side stream beside the kernels before those launches and chooses
//! the ranges once every launch is known (`runtime/src/lower/prefetch.rs`).

use super::launch::SMS;
use super::{Addr, Arg, Kernel};
use crate::{Error, Result};

const MODULE: &str = "prefetch";
const FUNCTION: &str = "prefetch_l2";

/// Ranges a side kernel takes.
pub const RANGES: usize = 8;
/// Its args: a pointer and a byte count per range.
pub const ARGS: usize = 2 * RANGES;
/// The unit of a range's start and length (the bulk prefetch's).
pub const ALIGN: u64 = 16;
/// Threads of a side kernel's block: one warp.
const THREADS: u32 = 32;

/// A launch that prefetches `ranges` (address, bytes; each a nonzero multiple of [`ALIGN`]; one
/// to [`RANGES`] of them) and does nothing else: a block per multiprocessor, so that every
/// multiprocessor's bulk copy unit takes a share of the pieces.
pub fn side_kernel(ranges: &[(Addr, u64)]) -> Result<Kernel> {
    let refuse = |reason: String| Error::Argument {
        op: FUNCTION,
        argument: "ranges",
        reason,
    };
    if ranges.is_empty() || ranges.len() > RANGES {
        return Err(refuse(format!(
            "{} ranges, not 1 to {RANGES}",
            ranges.len()
        )));
    }
    let whole = |&(a, n): &(Addr, u64)| a.offset % ALIGN == 0 && n % ALIGN == 0 && n > 0;
    if let Some(range) = ranges.iter().find(|range| !whole(range)) {
        return Err(refuse(format!(
            "{range:?} is not in whole {ALIGN}-byte units"
        )));
    }
    let mut args = [Arg::Null, Arg::I64(0)].repeat(RANGES);
    for (i, &(addr, bytes)) in ranges.iter().enumerate() {
        let bytes = i64::try_from(bytes).map_err(|_| refuse(format!("{bytes} bytes")))?;
        args[2 * i] = Arg::Ptr(addr);
        args[2 * i + 1] = Arg::I64(bytes);
    }
    Ok(Kernel {
        module: MODULE,
        function: FUNCTION,
        grid: (SMS as u32, 1, 1),
        block: (THREADS, 1, 1),
        shared_bytes: 0,
        cluster: (1, 1, 1),
        args,
    })
}

/// The ranges `kernel` prefetches: those of a [`side_kernel`], none for any other kernel.
pub fn ranges(kernel: &Kernel) -> Vec<(Addr, u64)> {
    if (kernel.module, kernel.function) != (MODULE, FUNCTION) || kernel.args.len() != ARGS {
        return Vec::new();
    }
    (kernel.args.chunks(2))
        .filter_map(|pair| match pair {
            [Arg::Ptr(addr), Arg::I64(bytes)] if *bytes > 0 => Some((*addr, *bytes as u64)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(slot: u32, offset: u64) -> Addr {
        Addr { slot, offset }
    }

    #[test]
    fn a_side_kernel_prefetches_its_ranges_and_reads_them_back() {
        let given = [(at(3, 0), 4096), (at(5, 32), 16)];
        let kernel = side_kernel(&given).unwrap();
        assert_eq!((kernel.module, kernel.function), (MODULE, FUNCTION));
        assert_eq!(kernel.grid, (SMS as u32, 1, 1));
        assert_eq!(ranges(&kernel), given);
        assert_eq!(
            kernel.args[4..],
            [Arg::Null, Arg::I64(0)].repeat(RANGES - 2)
        );
        // Another kernel's args are not ranges, however they look.
        let look_alike = Kernel {
            module: "decode",
            ..kernel.clone()
        };
        assert!(ranges(&look_alike).is_empty());
    }

    #[test]
    fn a_side_kernel_refuses_no_range_too_many_or_partial_units() {
        let refused = |ranges: &[(Addr, u64)]| side_kernel(ranges).unwrap_err().to_string();
        assert!(refused(&[]).contains("0 ranges"));
        assert!(refused(&vec![(at(1, 0), 16); RANGES + 1]).contains("9 ranges"));
        for partial in [(at(1, 8), 16), (at(1, 0), 24), (at(1, 0), 0)] {
            assert!(refused(&[partial]).contains("16-byte"), "{partial:?}");
        }
    }
}
