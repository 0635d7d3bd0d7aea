//! A vendor GEMM's algorithm chosen by timing (`LowerOptions::tune_gemms`): cuBLASLt's
//! heuristic names up to [`MAX_CANDIDATES`](super::gemm::MAX_CANDIDATES) algorithms for a
//! matmul, in the order it expects them to run fastest, and for the small matmuls of a
//! prefill (512 rows against 128 or 896 columns) its first is not always the fastest.
//!
//! Each candidate runs reading the matmul's A and B (whatever they hold when the program is
//! bound) and writing scratch memory of C's extent at C's alignment: nothing the program owns
//! is written, since C may hold live values when a member of a group is bound. It has a
//! workspace and a stream of the tuner's own. Its issues are captured into a graph (thread-local
//! capture: other threads' calls are not affected), as a replayed program runs them, with no
//! host time between them. Each timed graph is launched while the one before it still runs, so
//! the interval holds no launch latency either. The rounds take the candidates in turn, so a
//! clock change falls on all of them; the first round only warms. The least mean time wins,
//! the heuristic's order breaking ties.
//!
//! The choice is kept for the rest of the process under the matmul's description (the
//! device, cuBLASLt's version, shapes, types, strides and the pointers' alignments), so every
//! executable of a program, and every later build of it, runs the same algorithm and gives the
//! same bits; and on disk as a record of the kernel cache (`crate::kernel_cache`), so that
//! later processes sharing the cache make the same choice without timing. A record is used
//! only where it names one of the heuristic's candidates now; one that is not, or cannot be
//! read, is timed again and replaced. Where timing fails (no memory for the scratch, say), the
//! heuristic's first stays, and nothing is kept.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use kiln_kernels::gpu::{Addr, Gemm};

use super::gemm::{self, Algo, PreparedGemm};
use super::{error, CudaDevice, GEMM_WORKSPACE_BYTES};
use crate::error::Result;
use crate::gpu::Driver;
use crate::kernel_cache::KernelCache;

/// Timed rounds after the warm-up round.
const ROUNDS: usize = 3;
/// The work a candidate's graph holds, in microseconds at [`FLOPS_PER_MICRO`]; the issues a
/// graph holds are kept within [`ISSUES`].
const GRAPH_MICROS: f64 = 100.0;
const FLOPS_PER_MICRO: f64 = 4e8;
const ISSUES: (usize, usize) = (2, 20);

/// The choices made so far, by [`key`].
static CHOSEN: LazyLock<Mutex<BTreeMap<String, Algo>>> = LazyLock::new(Default::default);

/// How many matmul descriptions have had their algorithm chosen by timing in this process.
pub fn tuned_gemms() -> usize {
    CHOSEN.lock().map(|chosen| chosen.len()).unwrap_or(0)
}

/// The kernel cache's kind of record for a choice.
const RECORD: &str = "gemm-algo";

/// What determines a matmul's candidates and their speed: the device, cuBLASLt's version, the
/// descriptor without its addresses, and each pointer's alignment (the heuristic's
/// preference).
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
    let version = gemm::version();
    format!(
        "{} {ordinal} cuBLASLt {version} {shape:?} {residues:?}",
        device.describe()
    )
}

/// The choice recorded in `cache` under `key`, where it is one of `candidates`.
fn recorded(cache: &KernelCache, key: &str, candidates: &[Algo]) -> Option<Algo> {
    let bytes = cache.record(RECORD, key).ok()??;
    candidates
        .iter()
        .copied()
        .find(|algo| algo.bytes() == bytes)
}

/// Records `algo` as the choice under `key`. A record that cannot be written costs later
/// processes a timing, nothing else: it is reported, and the choice stands.
fn record(cache: &KernelCache, key: &str, algo: Algo) {
    if let Err(reason) = cache.store_record(RECORD, key, &algo.bytes()) {
        eprintln!("warning: kernel cache: could not record a GEMM algorithm: {reason}");
    }
}

/// The issues in one candidate's graph: about [`GRAPH_MICROS`] of work.
fn issues(gemm: &Gemm) -> usize {
    let flops = 2.0 * (gemm.m * gemm.n) as f64 * (gemm.k * gemm.batch) as f64;
    let fit = (GRAPH_MICROS * FLOPS_PER_MICRO / flops.max(1.0)).ceil();
    (fit.min(ISSUES.1 as f64) as usize).max(ISSUES.0)
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
) {
    if candidates.len() < 2 {
        return;
    }
    let key = key(device, gemm, (prepared.a, prepared.b, prepared.c));
    let known = CHOSEN
        .lock()
        .ok()
        .and_then(|chosen| chosen.get(&key).copied());
    let found = known.or_else(|| {
        recorded(&device.cache, &key, candidates).or_else(|| {
            let algo = fastest(device, gemm, prepared, candidates).ok()?;
            record(&device.cache, &key, algo);
            Some(algo)
        })
    });
    let algo = match (known, found) {
        (Some(algo), _) => algo,
        // Another thread may have chosen first: keep its choice, and use it.
        (None, Some(algo)) => match CHOSEN.lock() {
            Ok(mut chosen) => *chosen.entry(key).or_insert(algo),
            Err(_) => algo,
        },
        (None, None) => candidates[0],
    };
    prepared.set_algo(algo);
}

/// The candidate with the least mean time, C redirected to scratch memory at the real C's
/// alignment for the timing; `prepared` keeps its addresses and the heuristic's first.
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
    let timed = time_each(
        device,
        (gemm, prepared, candidates),
        (&stream, workspace.ptr),
    );
    prepared.c = real_c;
    prepared.set_algo(candidates[0]);
    // The scratch is freed (dropped) only after the stream's work.
    let synced = device.synchronize(&stream);
    let times = timed?;
    synced?;
    Ok(candidates[pick(&times)])
}

/// Each candidate's least mean time over the rounds in milliseconds, or `None` where cuBLASLt
/// refused to issue it.
fn time_each(
    device: &CudaDevice,
    (gemm, prepared, candidates): (&Gemm, &mut PreparedGemm, &[Algo]),
    (stream, workspace): (&Arc<CudaStream>, u64),
) -> Result<Vec<Option<f32>>> {
    let count = issues(gemm);
    let mut graphs = Vec::with_capacity(candidates.len());
    for &algo in candidates {
        prepared.set_algo(algo);
        graphs.push(capture(device, prepared, count, (stream, workspace))?);
    }
    let (start, end) = (device.timing_event()?, device.timing_event()?);
    let launch = |graph: &CudaGraph| graph.launch().map_err(|e| error("tuning graph", e));
    let mut best = vec![f32::INFINITY; graphs.len()];
    for round in 0..=ROUNDS {
        for (i, graph) in graphs.iter().enumerate() {
            let Some(graph) = graph else { continue };
            // The timed launch queues behind a running one: no launch latency in between.
            launch(graph)?;
            start.record(stream)?;
            launch(graph)?;
            end.record(stream)?;
            let ms = start.elapsed_ms(&end)?;
            if round > 0 {
                best[i] = best[i].min(ms / count as f32);
            }
        }
    }
    Ok((graphs.iter().zip(best))
        .map(|(graph, time)| graph.as_ref().map(|_| time))
        .collect())
}

/// `count` issues of `prepared` captured on `stream` as a graph, or `None` where cuBLASLt
/// refuses to issue it.
fn capture(
    device: &CudaDevice,
    prepared: &PreparedGemm,
    count: usize,
    (stream, workspace): (&Arc<CudaStream>, u64),
) -> Result<Option<CudaGraph>> {
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    stream
        .begin_capture(mode)
        .map_err(|e| error("begin the tuning capture", e))?;
    let raw = stream.cu_stream() as _;
    let issued = (0..count).try_for_each(|_| {
        gemm::issue(&device.lt, prepared, (workspace, GEMM_WORKSPACE_BYTES), raw)
    });
    let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
    let graph = stream.end_capture(flags);
    match (issued, graph) {
        (Ok(()), Ok(graph)) => Ok(graph),
        (Ok(()), Err(e)) => Err(error("end the tuning capture", e)),
        // Refused: the capture is ended, what it held discarded.
        (Err(_), _) => Ok(None),
    }
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

#[cfg(test)]
#[path = "gemm_tuning_tests.rs"]
mod tests;
