//! The C ABI on the GPU: device descriptors and a caller's stream. A caller-owned CUDA stream
//! and device buffers (made with the driver, as a C program would) feed the tiny prefill; the
//! logits written into device memory on that stream equal the host path's bit for bit, and bad
//! device descriptors and streams are refused with their status.

use std::ffi::{c_void, CString};

use cudarc::driver::CudaContext;
use kiln_capi::abi::*;

use super::device;

const SEQ: usize = 8;
const VOCAB: usize = 97;

fn ok(status: KilnStatus, what: &str) {
    assert_eq!(status, KILN_STATUS_OK, "{what}: {}", last_error());
}

fn last_error() -> String {
    // SAFETY: kiln_last_error returns a NUL-terminated string valid until the next call.
    unsafe { std::ffi::CStr::from_ptr(kiln_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn descriptor(data: u64, bytes: usize, shape: &[i64], dtype: KilnDType, cuda: bool) -> KilnTensor {
    KilnTensor {
        data: data as *mut c_void,
        accessible_bytes: bytes as u64,
        rank: shape.len() as u32,
        shape: shape.as_ptr(),
        strides: std::ptr::null(),
        dtype,
        device: KilnDevice {
            device_type: if cuda {
                KILN_DEVICE_CUDA
            } else {
                KILN_DEVICE_CPU
            },
            index: 0,
        },
    }
}

/// A caller's device buffer holding `bytes`, written on `stream` (the caller's).
fn caller_buffer(bytes: &[u8], stream: cudarc::driver::sys::CUstream) -> u64 {
    // SAFETY: a plain allocation freed at the end of the test; a copy from pageable memory
    // has read `bytes` when it returns, and it is ordered on the caller's stream.
    unsafe {
        let ptr = cudarc::driver::result::malloc_sync(bytes.len()).unwrap();
        cudarc::driver::result::memcpy_htod_async(ptr, bytes, stream).unwrap();
        ptr
    }
}

fn le<T: Copy>(values: &[T], to: impl Fn(T) -> [u8; 8]) -> Vec<u8> {
    values.iter().flat_map(|&v| to(v)).collect()
}

#[test]
fn device_descriptors_on_a_callers_stream_equal_the_host_path() {
    let Some(_device) = device() else { return };
    let ctx = CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let caller = ctx.new_stream().unwrap();
    let cu_stream = caller.cu_stream();
    let on_stream = KilnStream {
        device: KilnDevice {
            device_type: KILN_DEVICE_CUDA,
            index: 0,
        },
        handle: cu_stream as *mut c_void,
    };
    let sync = KilnStream {
        device: KilnDevice {
            device_type: KILN_DEVICE_CPU,
            index: 0,
        },
        handle: std::ptr::null_mut(),
    };

    let (name, precision) = (CString::new("tiny").unwrap(), CString::new("f32").unwrap());
    let mut model = KilnModel { id: 0 };
    let cuda = KilnDevice {
        device_type: KILN_DEVICE_CUDA,
        index: 0,
    };
    // SAFETY: NUL-terminated strings and a writable handle.
    ok(
        unsafe { kiln_model_load(name.as_ptr(), cuda, precision.as_ptr(), 0, &mut model) },
        "load",
    );
    let options = KilnProgramOptions {
        batch: 1,
        seq: SEQ as u64,
        max_seq: 0,
        fusion: 1,
        replay: 1,
    };
    let mut prefill = KilnProgram { id: 0 };
    let kind = CString::new("prefill").unwrap();
    // SAFETY: as above.
    ok(
        unsafe { kiln_program_compile(model, kind.as_ptr(), &options, &mut prefill) },
        "compile",
    );

    let tokens: Vec<i64> = vec![1, 5, 9, 2, 70, 3, 3, 8];
    let positions: Vec<i64> = (0..SEQ as i64).collect();
    let start = vec![0i64];
    let row = [1i64, SEQ as i64];
    let one = [1i64];
    let logits_shape = [1i64, VOCAB as i64];
    let inputs = [
        ("tokens", &tokens, &row[..]),
        ("positions", &positions, &row[..]),
        ("cache_positions", &start, &one[..]),
    ];

    // The host path.
    for (input, values, shape) in inputs {
        let input = CString::new(input).unwrap();
        let t = descriptor(
            values.as_ptr() as u64,
            values.len() * 8,
            shape,
            KILN_DTYPE_I64,
            false,
        );
        // SAFETY: the descriptor's memory lives through the synchronous call.
        ok(
            unsafe { kiln_program_set_input(prefill, input.as_ptr(), &t, sync) },
            "host input",
        );
    }
    ok(kiln_program_run(prefill, sync), "host run");
    let mut host_logits = vec![0f32; VOCAB];
    let logits = CString::new("logits").unwrap();
    let out = descriptor(
        host_logits.as_mut_ptr() as u64,
        VOCAB * 4,
        &logits_shape,
        KILN_DTYPE_F32,
        false,
    );
    // SAFETY: as above.
    ok(
        unsafe { kiln_program_get_output(prefill, logits.as_ptr(), &out, sync) },
        "host get",
    );

    // The device path, every call ordered on the caller's stream, twice (replay reuses slots).
    let buffers: Vec<u64> = (inputs.iter())
        .map(|(_, values, _)| caller_buffer(&le(values, i64::to_le_bytes), cu_stream))
        .collect();
    // SAFETY: a plain allocation, freed below.
    let logits_dev = unsafe { cudarc::driver::result::malloc_sync(VOCAB * 4) }.unwrap();
    for round in 0..2 {
        for ((input, values, shape), &ptr) in inputs.iter().zip(&buffers) {
            let input = CString::new(*input).unwrap();
            let t = descriptor(ptr, values.len() * 8, shape, KILN_DTYPE_I64, true);
            // SAFETY: the caller's device memory outlives the stream's work.
            ok(
                unsafe { kiln_program_set_input(prefill, input.as_ptr(), &t, on_stream) },
                "device input",
            );
        }
        ok(
            kiln_program_run(prefill, on_stream),
            "run on the caller's stream",
        );
        let out = descriptor(logits_dev, VOCAB * 4, &logits_shape, KILN_DTYPE_F32, true);
        // SAFETY: as above.
        ok(
            unsafe { kiln_program_get_output(prefill, logits.as_ptr(), &out, on_stream) },
            "device get",
        );
        let mut got = vec![0u8; VOCAB * 4];
        // SAFETY: ordered after kiln's copy on the caller's stream; synchronized before reading.
        unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut got, logits_dev, cu_stream) }
            .unwrap();
        caller.synchronize().unwrap();
        let got: Vec<f32> = (got.chunks(4))
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(
            got.iter()
                .zip(&host_logits)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "round {round}"
        );
    }

    // Bad device descriptors and streams, each with its status.
    let input = CString::new("tokens").unwrap();
    let mut short = descriptor(buffers[0], 8 * 4, &row, KILN_DTYPE_I64, true);
    let strides = [16i64, 2];
    let mut strided = descriptor(buffers[0], 8 * 8, &row, KILN_DTYPE_I64, true);
    strided.strides = strides.as_ptr();
    let host_as_cuda = descriptor(tokens.as_ptr() as u64, 8 * 8, &row, KILN_DTYPE_I64, true);
    let past_end = descriptor(buffers[0] + 32, 8 * 8, &row, KILN_DTYPE_I64, true);
    let mut other_device = descriptor(buffers[0], 8 * 8, &row, KILN_DTYPE_I64, true);
    other_device.device.index = 7;
    let cases = [
        (
            &mut short as &KilnTensor,
            on_stream,
            KILN_STATUS_SHAPE,
            "accessible_bytes",
        ),
        (&strided, on_stream, KILN_STATUS_SHAPE, "row-major"),
        (
            &host_as_cuda,
            on_stream,
            KILN_STATUS_DEVICE,
            "not CUDA device memory",
        ),
        (
            &past_end,
            sync,
            KILN_STATUS_DEVICE,
            "run past its allocation",
        ),
        (&other_device, sync, KILN_STATUS_DEVICE, "device 7"),
    ];
    for (t, stream, status, message) in cases {
        // SAFETY: the descriptors' fields are valid; the memory checks refuse them.
        let got = unsafe { kiln_program_set_input(prefill, input.as_ptr(), t, stream) };
        let text = last_error();
        assert_eq!(got, status, "{text}");
        assert!(text.contains(message), "{text}");
    }
    let mut wrong_stream = on_stream;
    wrong_stream.device.index = 3;
    assert_eq!(kiln_program_run(prefill, wrong_stream), KILN_STATUS_DEVICE);
    assert!(last_error().contains("CUDA device 0"), "{}", last_error());

    ok(kiln_program_free(prefill), "free program");
    ok(kiln_model_free(model), "free model");
    for ptr in buffers.into_iter().chain([logits_dev]) {
        // SAFETY: allocated above, freed once, no work pending (the stream was synchronized).
        unsafe { cudarc::driver::result::free_sync(ptr) }.unwrap();
    }
}
