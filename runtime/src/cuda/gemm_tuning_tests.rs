//! The tuner's parts on the CPU (the pick, the graphs' length, the records on disk), and on a
//! device (skipped with
//! the reason printed where none can be used): every candidate cuBLASLt names for a matmul
//! computes it, and the choice made is the one made again.

use half::bf16;

use super::*;
use crate::cuda::gemm::MAX_CANDIDATES;
use kiln_kernels::gpu::GemmDType;

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

fn algo(first: u64) -> Algo {
    let mut data = [0u64; 8];
    data[0] = first;
    data[7] = u64::MAX - first;
    Algo(cudarc::cublaslt::sys::cublasLtMatmulAlgo_t { data })
}

/// A recorded choice is used where it is one of the heuristic's candidates now, never
/// otherwise; a record that cannot be read is no choice (timed again, then replaced).
#[test]
fn a_recorded_choice_counts_only_among_the_candidates() {
    let dir = tempfile::tempdir().unwrap();
    let cache = KernelCache::at(dir.path());
    let candidates = [algo(1), algo(2), algo(3)];
    let first = |found: Option<Algo>| found.map(|a| a.0.data[0]);
    assert_eq!(first(recorded(&cache, "k", &candidates)), None);
    record(&cache, "k", algo(2));
    assert_eq!(first(recorded(&cache, "k", &candidates)), Some(2));
    assert_eq!(first(recorded(&cache, "another", &candidates)), None);
    assert_eq!(first(recorded(&cache, "k", &[algo(1), algo(3)])), None);
    record(&cache, "k", algo(9));
    assert_eq!(first(recorded(&cache, "k", &candidates)), None);
    record(&cache, "k", algo(3));
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() - 1;
    bytes[at] ^= 0x80;
    std::fs::write(&file, bytes).unwrap();
    assert_eq!(first(recorded(&cache, "k", &candidates)), None);
    record(&cache, "k", algo(1));
    assert_eq!(first(recorded(&cache, "k", &candidates)), Some(1));
}

fn product(m: u64, n: u64, k: u64, out: GemmDType, accumulate: bool) -> Gemm {
    let at = |slot| Addr { slot, offset: 0 };
    Gemm {
        dtype: GemmDType::BF16,
        out,
        a: at(0),
        b: at(1),
        c: at(2),
        m,
        n,
        k,
        batch: 1,
        transpose_a: false,
        transpose_b: true,
        lda: k,
        ldb: k,
        ldc: n,
        stride_a: 0,
        stride_b: 0,
        stride_c: m * n,
        accumulate,
    }
}

#[test]
fn a_graph_holds_about_a_hundred_microseconds_of_products() {
    // 2·512·128·896 flops: latency-bound, the most issues.
    assert_eq!(issues(&product(512, 128, 896, GemmDType::F32, false)), 20);
    // 2·2048·4864·896 = 17.9 GFLOP, 45 µs at 400 TFLOP/s: three.
    assert_eq!(issues(&product(2048, 4864, 896, GemmDType::F32, false)), 3);
    // A logits chunk, 2·2048·8192·896 = 30 GFLOP: two, the least.
    assert_eq!(issues(&product(2048, 8192, 896, GemmDType::F32, false)), 2);
    assert_eq!(issues(&product(0, 8, 8, GemmDType::F32, false)), 20);
}

fn device() -> Option<Arc<CudaDevice>> {
    match crate::cuda::unavailable() {
        Some(reason) => {
            kiln_kernels::testing::skip_without_gpu("the GEMM tuning test", &reason);
            None
        }
        None => Some(CudaDevice::open(0).expect("a usable CUDA device opens")),
    }
}

fn bytes<T: Copy>(values: &[T]) -> &[u8] {
    // SAFETY: plain numbers, read as their bytes.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast(), std::mem::size_of_val(values)) }
}

/// bf16 `[m,k] · [n,k]ᵀ` into f32 C and into bf16 C, each overwritten and accumulated: each
/// algorithm the heuristic names gives the f64 product within f32 (bf16) rounding, and tuning
/// the same description twice chooses the same one.
#[test]
fn every_candidate_computes_the_product_and_the_choice_is_kept() {
    let Some(device) = device() else { return };
    let (m, n, k) = (48u64, 40u64, 96u64);
    let value = |i: u64, scale: f32| ((i * 37 % 101) as f32 - 50.0) * scale;
    let a: Vec<bf16> = (0..m * k).map(|i| bf16::from_f32(value(i, 0.02))).collect();
    let b: Vec<bf16> = (0..n * k)
        .map(|i| bf16::from_f32(value(i + 7, 0.03)))
        .collect();
    let c0: Vec<f32> = (0..m * n).map(|i| value(i + 3, 0.5)).collect();
    // A bf16 C holds c0 rounded.
    let c0_bf16: Vec<bf16> = c0.iter().map(|&c| bf16::from_f32(c)).collect();
    let c_start = |out: GemmDType| match out {
        GemmDType::F32 => (bytes(&c0), c0.clone()),
        GemmDType::BF16 => (
            bytes(&c0_bf16),
            c0_bf16.iter().map(|c| c.to_f32()).collect(),
        ),
    };
    let stream = device.new_stream().unwrap();
    let buffer = |data: &[u8]| {
        let ptr = device.malloc(data.len()).unwrap();
        device.upload(ptr, data, &stream).unwrap();
        ptr
    };
    let (pa, pb) = (buffer(bytes(&a)), buffer(bytes(&b)));
    let pc = buffer(bytes(&c0));
    let workspace = device.malloc(GEMM_WORKSPACE_BYTES).unwrap();
    for (out, accumulate) in [
        (GemmDType::F32, false),
        (GemmDType::F32, true),
        (GemmDType::BF16, false),
        (GemmDType::BF16, true),
    ] {
        let gemm = product(m, n, k, out, accumulate);
        let (c_bytes, c_values) = c_start(out);
        let want: Vec<f64> = (0..m * n)
            .map(|i| {
                let (r, col) = (i / n, i % n);
                let dot: f64 = (0..k)
                    .map(|j| {
                        f64::from(a[(r * k + j) as usize]) * f64::from(b[(col * k + j) as usize])
                    })
                    .sum();
                dot + if accumulate {
                    f64::from(c_values[i as usize])
                } else {
                    0.0
                }
            })
            .collect();
        let candidates = || {
            let pointers = (pa, pb, pc);
            gemm::prepare(
                &device.lt,
                &gemm,
                pointers,
                GEMM_WORKSPACE_BYTES,
                MAX_CANDIDATES,
            )
            .unwrap()
        };
        let (mut prepared, algos) = candidates();
        for (index, &algo) in algos.iter().enumerate() {
            device.upload(pc, c_bytes, &stream).unwrap();
            prepared.set_algo(algo);
            let raw = stream.cu_stream() as _;
            let ws = (workspace, GEMM_WORKSPACE_BYTES);
            gemm::issue(&device.lt, &prepared, ws, raw).unwrap();
            device.synchronize(&stream).unwrap();
            let got: Vec<f64> = match out {
                GemmDType::F32 => {
                    let mut host = vec![0f32; (m * n) as usize];
                    let view = unsafe {
                        // SAFETY: the f32s' own bytes, written whole by the download.
                        std::slice::from_raw_parts_mut(host.as_mut_ptr().cast(), host.len() * 4)
                    };
                    device.download(view, pc, Some(&stream)).unwrap();
                    host.iter().map(|&x| f64::from(x)).collect()
                }
                GemmDType::BF16 => {
                    let mut host = vec![bf16::ZERO; (m * n) as usize];
                    let view = unsafe {
                        // SAFETY: the bf16s' own bytes, written whole by the download.
                        std::slice::from_raw_parts_mut(host.as_mut_ptr().cast(), host.len() * 2)
                    };
                    device.download(view, pc, Some(&stream)).unwrap();
                    host.iter().map(|&x| f64::from(x)).collect()
                }
            };
            // f32 sums of 96 terms; a bf16 result is that rounded once, and where it is added
            // to a bf16 C, cuBLASLt may round the product first (measured on an H100: the
            // heuristic's first algorithm gave -0.625 for 3.5 + -4.140), so within a rounding
            // of the product and one of the sum.
            let unit = if out == GemmDType::BF16 {
                2f64.powi(-8)
            } else {
                1e-5
            };
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let product = w - if accumulate {
                    f64::from(c_values[i])
                } else {
                    0.0
                };
                let bound = match (out, accumulate) {
                    (GemmDType::BF16, true) => unit * (product.abs() + w.abs()) + 1e-4,
                    _ => unit * w.abs() + 1e-4,
                };
                assert!(
                    (g - w).abs() <= bound,
                    "{out:?} accumulate={accumulate} candidate {index}: [{i}] {g} vs {w}"
                );
            }
        }
        println!(
            "{out:?} accumulate={accumulate}: {} candidates compute the product",
            algos.len()
        );
        // Timing works here (`tune` would fall back to the heuristic's first), and writes
        // nothing of the program's: C keeps its bits.
        device.upload(pc, c_bytes, &stream).unwrap();
        device.synchronize(&stream).unwrap();
        let fastest = fastest(&device, &gemm, &mut prepared, &algos).unwrap();
        let left = prepared.algo() == algos[0].0 && prepared.c == pc;
        assert!(left, "timing leaves the matmul as it was");
        let mut kept = vec![0u8; c_bytes.len()];
        device.download(&mut kept, pc, Some(&stream)).unwrap();
        assert!(kept == c_bytes, "timing wrote the matmul's C");
        tune(&device, &gemm, &mut prepared, &algos);
        let (mut again, algos_again) = candidates();
        tune(&device, &gemm, &mut again, &algos_again);
        assert!(
            prepared.algo() == again.algo(),
            "the same choice for the same matmul"
        );
        assert!(algos.iter().any(|algo| algo.0 == prepared.algo()));
        println!(
            "{out:?} accumulate={accumulate}: timed, chosen as fastest: {}",
            { prepared.algo() == fastest.0 }
        );
    }
    for ptr in [pa, pb, pc, workspace] {
        device.free(ptr);
    }
}
