//! A vendor GEMM's algorithm chosen by timing (`LowerOptions::tune_gemms`): cuBLASLt's
//! heuristic names up to [`MAX_CANDIDATES`](super::gemm::MAX_CANDIDATES) algorithms for a
//! matmul, in the order it expects them to run fastest, and for the small matmuls of a
//! prefill (512 rows against 128 or 896 columns) its first is not always the fastest. Each
//! candidate runs on the matmul's own A and B, into scratch memory of C's extent (nothing the
//! program owns is written: C may hold live values when a member of a group is bound), with a
//! workspace and a stream of the tuner's own; the fastest mean of the rounds wins, the
//! heuristic's order breaking ties. The choice is kept for the rest of the process under the
//! matmul's description (shapes, types, strides and the pointers' alignments), so that every
//! executable of a program, and every later build of it, runs the same algorithm and gives
//! the same bits.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::CudaStream;
use kiln_kernels::gpu::{Addr, Gemm};

use super::gemm::{self, Algo, PreparedGemm};
use super::{CudaDevice, GEMM_WORKSPACE_BYTES};
use crate::error::Result;
use crate::gpu::Driver;

/// Issues of a candidate before it is timed, timed rounds, and issues a round.
const WARMUP: usize = 1;
const ROUNDS: usize = 3;
const ISSUES: usize = 3;

/// The choices made so far, by [`key`].
static CHOSEN: LazyLock<Mutex<BTreeMap<String, Algo>>> = LazyLock::new(Default::default);

/// What determines a matmul's candidates and their speed: the device, the descriptor without
/// its addresses, and each pointer's alignment (the heuristic's preference).
fn key(device: &CudaDevice, gemm: &Gemm, (a, b, c): (u64, u64, u64)) -> String {
    let unplaced = Addr { slot: 0, offset: 0 };
    let shape = Gemm {
        a: unplaced,
        b: unplaced,
        c: unplaced,
        ..gemm.clone()
    };
    let residues = [a, b, c].map(|pointer| pointer % 256);
    let ordinal = device.ordinal();
    format!("{} {ordinal} {shape:?} {residues:?}", device.describe())
}

/// Device memory of the tuner's, freed when dropped.
struct Scratch<'d> {
    device: &'d CudaDevice,
    ptr: u64,
}

impl<'d> Scratch<'d> {
    fn new(device: &'d CudaDevice, bytes: usize) -> Result<Self> {
        Ok(Scratch {
            device,
            ptr: device.malloc(bytes.max(1))?,
        })
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        self.device.free(self.ptr);
    }
}

/// Sets `prepared`'s algorithm to the fastest of `candidates` (the heuristic's, first the one
/// it prefers), timed now or chosen before for the same [`key`].
pub(crate) fn tune(
    device: &CudaDevice,
    gemm: &Gemm,
    prepared: &mut PreparedGemm,
    candidates: &[Algo],
) -> Result<()> {
    if candidates.len() < 2 {
        return Ok(());
    }
    let key = key(device, gemm, (prepared.a, prepared.b, prepared.c));
    let known = CHOSEN.lock().map(|chosen| chosen.get(&key).copied());
    let algo = match known.ok().flatten() {
        Some(algo) => algo,
        None => {
            let algo = fastest(device, gemm, prepared, candidates)?;
            if let Ok(mut chosen) = CHOSEN.lock() {
                // Another thread may have chosen first: keep its choice, and use it.
                *chosen.entry(key).or_insert(algo)
            } else {
                algo
            }
        }
    };
    prepared.set_algo(algo);
    Ok(())
}

/// The candidate with the least mean time over the best of [`ROUNDS`] rounds, C redirected
/// to scratch memory at the real C's alignment for the timing; `prepared` keeps its addresses.
fn fastest(
    device: &CudaDevice,
    gemm: &Gemm,
    prepared: &mut PreparedGemm,
    candidates: &[Algo],
) -> Result<Algo> {
    let stream: Arc<CudaStream> = device.new_stream()?;
    let workspace = Scratch::new(device, GEMM_WORKSPACE_BYTES)?;
    let c_bytes = gemm.spans()[2] as usize;
    let scratch = Scratch::new(device, c_bytes + 256)?;
    let real_c = prepared.c;
    prepared.c = scratch.ptr + real_c % 256;
    let timed = time_each(device, prepared, candidates, (&stream, workspace.ptr));
    prepared.c = real_c;
    device.synchronize(&stream)?;
    Ok(candidates[pick(&timed?)])
}

/// The index of the least time, the earliest among equals; a candidate that failed to issue
/// has none, and with no time at all the heuristic's first (0) stays.
fn pick(times: &[Option<f32>]) -> usize {
    let timed = times
        .iter()
        .enumerate()
        .filter_map(|(i, t)| t.map(|t| (i, t)));
    let best = timed.fold((0, f32::INFINITY), |best, (i, t)| match t < best.1 {
        true => (i, t),
        false => best,
    });
    best.0
}

/// Each candidate's best round mean in milliseconds, or `None` where cuBLASLt refused to
/// issue it.
fn time_each(
    device: &CudaDevice,
    prepared: &mut PreparedGemm,
    candidates: &[Algo],
    (stream, workspace): (&Arc<CudaStream>, u64),
) -> Result<Vec<Option<f32>>> {
    let (start, end) = (device.timing_event()?, device.timing_event()?);
    let handle = &device.lt;
    let raw = stream.cu_stream() as _;
    let mut times = Vec::with_capacity(candidates.len());
    for &algo in candidates {
        prepared.set_algo(algo);
        let issue = |prepared: &PreparedGemm| {
            gemm::issue(handle, prepared, (workspace, GEMM_WORKSPACE_BYTES), raw)
        };
        if (0..WARMUP).try_for_each(|_| issue(prepared)).is_err() {
            times.push(None);
            continue;
        }
        let mut best = f32::INFINITY;
        for _ in 0..ROUNDS {
            start.record(stream)?;
            for _ in 0..ISSUES {
                issue(prepared)?;
            }
            end.record(stream)?;
            best = best.min(start.elapsed_ms(&end)? / ISSUES as f32);
        }
        times.push(Some(best));
    }
    prepared.set_algo(candidates[0]);
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::pick;

    #[test]
    fn the_fastest_candidate_wins_and_the_heuristic_breaks_ties() {
        assert_eq!(pick(&[Some(3.0), Some(1.0), Some(2.0)]), 1);
        assert_eq!(pick(&[Some(1.0), Some(2.0), Some(1.0)]), 0);
        assert_eq!(pick(&[Some(2.0), Some(1.5), Some(1.5)]), 1);
        // Refused candidates have no time; with none timed the first stays.
        assert_eq!(pick(&[None, Some(4.0), None]), 1);
        assert_eq!(pick(&[None, None]), 0);
        assert_eq!(pick(&[Some(f32::NAN), Some(1.0)]), 1);
    }
}
