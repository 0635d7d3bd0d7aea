//! L2 prefetch ranges: a host kernel's prefetching entry point (`KILN_PREFETCH_PARAMS` in
//! `kernels/cuda/prefetch.cuh`) issues bulk prefetches into L2 of up to [`RANGES`] ranges of
//! bytes before its wait, so that the parameters of the launches after it come from L2 rather
//! than HBM. Its builder launches the plain entry point and names the prefetching one
//! ([`Kernel::prefetch_host`]); the program chooses the ranges ([`fill`]) once every launch is
//! known.

use super::launch::SMS;
use super::{Addr, Arg, Kernel};
use crate::{Error, Result};

/// Ranges a host kernel takes.
pub const RANGES: usize = 8;
/// Its prefetch args: a pointer and a byte count per range.
pub const ARGS: usize = 2 * RANGES;
/// The unit of a range's start and length (the bulk prefetch's).
pub const ALIGN: u64 = 16;

/// Whether host `kernel` has a block for each multiprocessor (of the GPUs the split rules fill),
/// so that the prefetches spread over every multiprocessor's bulk copy unit. A host of fewer
/// blocks (the decode split at batch 1: 32) issues them from a few, which then finish late:
/// measured slower (BENCHMARKS.md), so it is given none.
pub fn spreads(kernel: &Kernel) -> bool {
    let (x, y, z) = kernel.grid;
    u64::from(x) * u64::from(y) * u64::from(z) >= SMS
}

/// Has host `kernel` prefetch `ranges` (address, bytes; each a nonzero multiple of [`ALIGN`]): its
/// prefetching entry point with the ranges after its args, the rest none. No range leaves
/// the kernel as it is.
pub fn fill(kernel: &mut Kernel, ranges: &[(Addr, u64)]) -> Result<()> {
    let refuse = |reason: String| Error::Argument {
        op: kernel.function,
        argument: "prefetch",
        reason,
    };
    let Some(entry) = kernel.prefetch_host else {
        return Err(refuse("the kernel hosts no prefetch".to_string()));
    };
    if kernel.function == entry {
        return Err(refuse("its prefetch ranges are already given".to_string()));
    }
    if ranges.len() > RANGES {
        return Err(refuse(format!(
            "{} ranges, more than {RANGES}",
            ranges.len()
        )));
    }
    let whole = |&(a, n): &(Addr, u64)| a.offset % ALIGN == 0 && n % ALIGN == 0 && n > 0;
    if let Some(range) = ranges.iter().find(|range| !whole(range)) {
        return Err(refuse(format!(
            "{range:?} is not in whole {ALIGN}-byte units"
        )));
    }
    if ranges.is_empty() {
        return Ok(());
    }
    let mut args = [Arg::Null, Arg::I64(0)].repeat(RANGES);
    for (i, &(addr, bytes)) in ranges.iter().enumerate() {
        let bytes = i64::try_from(bytes).map_err(|_| refuse(format!("{bytes} bytes")))?;
        args[2 * i] = Arg::Ptr(addr);
        args[2 * i + 1] = Arg::I64(bytes);
    }
    kernel.function = entry;
    kernel.args.extend(args);
    Ok(())
}

/// The ranges `kernel` prefetches: none unless [`fill`] gave it some.
pub fn ranges(kernel: &Kernel) -> Vec<(Addr, u64)> {
    if kernel.prefetch_host != Some(kernel.function) || kernel.args.len() < ARGS {
        return Vec::new();
    }
    (kernel.args[kernel.args.len() - ARGS..].chunks(2))
        .filter_map(|pair| match pair {
            [Arg::Ptr(addr), Arg::I64(bytes)] if *bytes > 0 => Some((*addr, *bytes as u64)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(blocks: u32) -> Kernel {
        Kernel {
            module: "decode",
            function: "cached_attention_split_f32_bf16",
            grid: (blocks, 1, 1),
            block: (256, 1, 1),
            shared_bytes: 0,
            cluster: (1, 1, 1),
            args: vec![Arg::I32(7)],
            prefetch_host: Some("cached_attention_split_f32_bf16_prefetch"),
        }
    }

    fn at(slot: u32, offset: u64) -> Addr {
        Addr { slot, offset }
    }

    #[test]
    fn filled_ranges_switch_to_the_prefetching_entry_and_read_back() {
        let mut kernel = host(132);
        let given = [(at(3, 0), 4096), (at(5, 32), 16)];
        fill(&mut kernel, &given).unwrap();
        assert_eq!(kernel.function, "cached_attention_split_f32_bf16_prefetch");
        assert_eq!(kernel.args.len(), 1 + ARGS);
        assert_eq!(kernel.args[0], Arg::I32(7));
        assert_eq!(ranges(&kernel), given);
        assert_eq!(
            kernel.args[1 + 4..],
            [Arg::Null, Arg::I64(0)].repeat(RANGES - 2)
        );
        // No range: the plain entry point, unchanged.
        let mut plain = host(132);
        fill(&mut plain, &[]).unwrap();
        assert_eq!(plain, host(132));
        // A plain entry point's args are not ranges, however they look.
        let look_alike = Kernel {
            args: [Arg::Ptr(at(3, 0)), Arg::I64(4096)].repeat(RANGES),
            ..host(132)
        };
        assert!(ranges(&look_alike).is_empty());
    }

    #[test]
    fn fill_refuses_what_a_host_cannot_take() {
        let refused = |kernel: &mut Kernel, ranges: &[(Addr, u64)]| {
            fill(kernel, ranges).unwrap_err().to_string()
        };
        let mut plain = Kernel {
            prefetch_host: None,
            ..host(132)
        };
        assert!(refused(&mut plain, &[(at(1, 0), 16)]).contains("hosts no prefetch"));
        let nine = vec![(at(1, 0), 16); RANGES + 1];
        assert!(refused(&mut host(132), &nine).contains("more than 8"));
        assert!(refused(&mut host(132), &[(at(1, 8), 16)]).contains("16-byte"));
        assert!(refused(&mut host(132), &[(at(1, 0), 24)]).contains("16-byte"));
        assert!(refused(&mut host(132), &[(at(1, 0), 0)]).contains("16-byte"));
        let mut twice = host(132);
        fill(&mut twice, &[(at(1, 0), 16)]).unwrap();
        assert!(refused(&mut twice, &[(at(1, 0), 16)]).contains("already given"));
    }

    #[test]
    fn a_host_spreads_from_a_block_per_multiprocessor() {
        assert!(!spreads(&host(SMS as u32 - 1)));
        assert!(spreads(&host(SMS as u32)));
        let grid = Kernel {
            grid: (16, 2, 8),
            ..host(1)
        };
        assert!(spreads(&grid));
    }
}
