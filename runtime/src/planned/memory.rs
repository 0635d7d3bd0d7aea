//! The run's memory: region 0 is the ONE arena of `plan.arena_bytes` bytes (in an executable
//! group, of the largest plan's); the other regions are output buffers, private copies of
//! in-place updated inputs and, in an executable, slots. Each region is one 8-byte aligned
//! allocation (`Vec<u64>`), seen as bytes, and as typed elements through `bytemuck`.
//!
//! Invariants:
//! 1. Regions never move or change length during a run.
//! 2. A step gets its results and workspace as disjoint mutable byte slices and its operands
//!    as shared slices of the bytes between them ([`Memory::carve`], through `split_at_mut`):
//!    an operand that overlaps bytes the step writes is refused, never aliased.
//! 3. Poison is the byte 0xFF: every float dtype reads it as NaN (and integers as -1), so a
//!    value read from dead bytes breaks bit-equality with the interpreter.

use std::ops::Range;

use kiln_kernels::TensorView;

use super::placement::Placement;
use crate::error::{Error, Result};
use crate::placed::bytes;
use crate::placed::ValueLayout;
use crate::storage::StorageRead;

/// The byte every poisoned byte holds.
pub(super) const POISON: u8 = 0xFF;

/// The regions of one run.
pub(super) struct Memory {
    regions: Vec<Vec<u64>>,
}

impl Memory {
    /// Allocates every region of `placement`; with `poison`, every byte starts poisoned (the
    /// whole arena and the outputs), else zero. Regions of in-place updated inputs then receive
    /// a copy of their tensor's storage.
    pub fn new(placement: &Placement, poison: bool) -> Result<Self> {
        let mut memory = Memory::zeroed(&placement.region_bytes)?;
        if poison {
            for region in &mut memory.regions {
                bytemuck::cast_slice_mut::<u64, u8>(region).fill(POISON);
            }
        }
        for (region, tensor) in &placement.copies {
            let guard = tensor.storage().read()?;
            let source = bytes::of_data(guard.data());
            bytes::prefix_mut(&mut memory.regions[*region], source.len()).copy_from_slice(source);
        }
        Ok(memory)
    }

    /// One zeroed region of each of `region_bytes` bytes.
    pub fn zeroed(region_bytes: &[usize]) -> Result<Self> {
        let mut regions: Vec<Vec<u64>> = Vec::with_capacity(region_bytes.len());
        for &len in region_bytes {
            // A plan can ask for any size; failing to get it is an error, not an abort.
            let mut region = Vec::new();
            region
                .try_reserve_exact(len.div_ceil(8))
                .map_err(|_| Error::Graph {
                    what: format!("execute: region {} of the run's memory", regions.len()),
                    reason: format!("cannot allocate {len} bytes"),
                })?;
            region.resize(len.div_ceil(8), 0u64);
            regions.push(region);
        }
        Ok(Memory { regions })
    }

    /// The bytes `range` of `region` (placement keeps every range inside its region).
    pub fn bytes(&self, region: usize, range: Range<usize>) -> &[u8] {
        &bytemuck::cast_slice::<u64, u8>(&self.regions[region])[range]
    }

    /// Fills bytes `range` of `region` with poison.
    pub fn poison(&mut self, region: usize, range: Range<usize>) {
        bytemuck::cast_slice_mut::<u64, u8>(&mut self.regions[region])[range].fill(POISON);
    }

    /// Splits the regions into the mutable byte ranges `writes` (region, range), in that order,
    /// and shared slices of everything else. Overlapping writes are refused with the indices of
    /// two of them; a range past its region's end is refused with its index twice.
    pub fn carve(
        &mut self,
        writes: &[(usize, Range<usize>)],
    ) -> std::result::Result<Carved<'_>, (usize, usize)> {
        let mut pieces: Vec<Option<&mut [u8]>> = writes.iter().map(|_| None).collect();
        let mut shared = Vec::with_capacity(self.regions.len());
        for (region, words) in self.regions.iter_mut().enumerate() {
            let mut order: Vec<usize> = (0..writes.len())
                .filter(|&w| writes[w].0 == region)
                .collect();
            order.sort_by_key(|&w| (writes[w].1.start, writes[w].1.end));
            let mut rest: &mut [u8] = bytemuck::cast_slice_mut(words);
            let (mut position, mut previous) = (0, None);
            let mut gaps = Vec::new();
            for w in order {
                let range = writes[w].1.clone();
                if range.start < position || range.end < range.start {
                    return Err((previous.unwrap_or(w), w));
                }
                if range.end - position > rest.len() {
                    return Err((w, w));
                }
                let (gap, tail) = rest.split_at_mut(range.start - position);
                let (piece, tail) = tail.split_at_mut(range.len());
                gaps.push((position, &*gap));
                pieces[w] = Some(piece);
                (rest, position, previous) = (tail, range.end, Some(w));
            }
            gaps.push((position, &*rest));
            shared.push(gaps);
        }
        Ok(Carved {
            writes: pieces.into_iter().flatten().collect(),
            shared,
        })
    }
}

/// The regions split for one step (see [`Memory::carve`]).
pub(super) struct Carved<'a> {
    /// The mutable ranges, in the order they were asked for.
    pub writes: Vec<&'a mut [u8]>,
    /// Per region, the bytes between the mutable ranges: (first byte, bytes).
    shared: Vec<Vec<(usize, &'a [u8])>>,
}

impl<'a> Carved<'a> {
    /// Bytes `range` of `region`, if they lie between the mutable ranges.
    pub fn shared(&self, region: usize, range: &Range<usize>) -> Option<&'a [u8]> {
        let gaps = self.shared.get(region)?;
        gaps.iter().find_map(|&(start, gap)| {
            let fits = start <= range.start && range.end <= start + gap.len();
            fits.then(|| &gap[range.start - start..range.end - start])
        })
    }
}

/// A kernel view of the value laid out as `layout` in a bound tensor's storage.
pub(super) fn bound_view<'a>(
    guard: &'a StorageRead<'_>,
    layout: &ValueLayout,
) -> Result<TensorView<'a>> {
    Ok(TensorView::with_layout(
        guard.data(),
        layout.layout.clone(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory(sizes: &[usize]) -> Memory {
        let mut regions: Vec<Vec<u64>> = sizes.iter().map(|&s| bytes::aligned_zeros(s)).collect();
        for (r, region) in regions.iter_mut().enumerate() {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(region);
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = (r * 100 + i) as u8;
            }
        }
        Memory { regions }
    }

    #[test]
    fn carve_gives_disjoint_writes_and_shared_gaps() {
        let mut memory = memory(&[32, 8]);
        let writes = [(0, 16..24), (1, 0..8), (0, 0..4)];
        let mut carved = memory.carve(&writes).unwrap();
        assert_eq!(
            carved.shared(0, &(4..16)).unwrap(),
            &(4u8..16).collect::<Vec<_>>()[..]
        );
        assert_eq!(carved.shared(0, &(24..32)).unwrap()[0], 24);
        // Bytes a write owns are not shared, not even partly.
        assert!(carved.shared(0, &(12..20)).is_none());
        assert!(carved.shared(1, &(0..1)).is_none());
        // Empty ranges at a boundary are fine.
        assert_eq!(carved.shared(0, &(16..16)).unwrap().len(), 0);
        assert_eq!(carved.writes.len(), 3);
        assert_eq!(carved.writes[0][0], 16);
        assert_eq!(carved.writes[1][0], 100);
        carved.writes[2].fill(7);
        assert_eq!(memory.bytes(0, 0..5), &[7, 7, 7, 7, 4]);
    }

    #[test]
    fn carve_refuses_overlaps_and_ranges_past_the_end() {
        let mut memory = memory(&[32]);
        assert_eq!(memory.carve(&[(0, 0..8), (0, 4..12)]).err(), Some((0, 1)));
        assert_eq!(memory.carve(&[(0, 24..40)]).err(), Some((0, 0)));
        memory.poison(0, 2..4);
        assert_eq!(memory.bytes(0, 0..5), &[0, 1, POISON, POISON, 4]);
    }
}
