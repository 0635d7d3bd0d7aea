//! Device copies in and out of a CUDA executable and their ordering against a caller's stream,
//! on a real device (skipped, with the reason printed, where none can be used).

use cudarc::driver::CudaStream;

use super::super::tests::{add_program, device, embedding_program, want};
use crate::backend::RunMode;
use crate::cuda::CudaExecutable;
use crate::device_io::{DeviceBuffer, DeviceIo, DeviceSpan};
use crate::tensor::Tensor;

fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `values` in a fresh device buffer, written on `stream` and waited for.
fn on_device(exe: &CudaExecutable, values: &[f32], stream: &CudaStream) -> DeviceBuffer {
    let buffer = exe.alloc(values.len() * 4).unwrap();
    let host = bytes_of(values);
    // SAFETY: the buffer holds the bytes; `host` outlives the copy (the caller synchronizes
    // `stream` before the end of the test).
    unsafe { cudarc::driver::result::memcpy_htod_async(buffer.ptr(), &host, stream.cu_stream()) }
        .unwrap();
    stream.synchronize().unwrap();
    buffer
}

fn read(buffer: &DeviceBuffer, stream: &CudaStream) -> Vec<f32> {
    let mut host = vec![0u8; buffer.bytes()];
    // SAFETY: the buffer's own range; the stream is synchronized before `host` is read.
    unsafe {
        cudarc::driver::result::memcpy_dtoh_async(&mut host, buffer.ptr(), stream.cu_stream())
    }
    .unwrap();
    stream.synchronize().unwrap();
    (host.chunks(4))
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Inputs copied from device memory and outputs copied into it, ordered on a caller's stream
/// by events alone, equal the host path; eager and replayed.
#[test]
fn device_inputs_and_outputs_equal_host_copies_ordered_on_the_callers_stream() {
    let Some(device) = device() else { return };
    let mut exe = add_program(&device);
    let caller = device.context().new_stream().unwrap();
    let a: Vec<f32> = (0..32).map(|i| i as f32 * 1.5 - 9.0).collect();
    let b: Vec<f32> = (0..32).map(|i| 2.0 - i as f32 * 0.75).collect();
    let (a_dev, b_dev) = (on_device(&exe, &a, &caller), on_device(&exe, &b, &caller));
    let out = exe.alloc(32 * 4).unwrap();
    for mode in [RunMode::Eager, RunMode::Graph] {
        let stream = caller.cu_stream() as u64;
        exe.wait_for(stream).unwrap();
        exe.set_from_device("a", a_dev.span()).unwrap();
        exe.set_from_device("b", b_dev.span()).unwrap();
        exe.run(mode).unwrap();
        exe.get_to_device("out", out.span()).unwrap();
        exe.signal(stream).unwrap();
        let got = read(&out, &caller);
        let sums: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert_eq!(got, sums, "{mode:?}");
        assert_eq!(exe.get("out").unwrap().to_vec::<f32>().unwrap(), sums);
    }
    // A host input after device ones: the host path still works on the same slots.
    exe.set(
        "a",
        &Tensor::from_vec((0..32).map(|i| i as f32 * 0.5 - 3.0).collect(), [4, 8]).unwrap(),
    )
    .unwrap();
    exe.set(
        "b",
        &Tensor::from_vec((0..32).map(|i| 7.0 - i as f32 * 0.25).collect(), [4, 8]).unwrap(),
    )
    .unwrap();
    exe.run(RunMode::Graph).unwrap();
    exe.get_to_device("out", out.span()).unwrap();
    exe.synchronize().unwrap();
    assert_eq!(read(&out, &caller), want());
}

/// A span of the wrong size, host memory, a range past its allocation and an index input out of
/// range are each refused with a message naming the problem; nothing is copied.
#[test]
fn bad_device_spans_and_bad_device_indices_are_refused() {
    let Some(device) = device() else { return };
    let mut exe = add_program(&device);
    let buffer = exe.alloc(32 * 4).unwrap();
    let host = [0f32; 32];
    let cases = [
        (
            DeviceSpan {
                ptr: buffer.ptr(),
                bytes: 64,
            },
            "takes 128",
        ),
        (
            DeviceSpan {
                ptr: host.as_ptr() as u64,
                bytes: 128,
            },
            "not CUDA device memory",
        ),
        (
            DeviceSpan {
                ptr: buffer.ptr() + 64,
                bytes: 128,
            },
            "run past its allocation",
        ),
    ];
    for (span, expected) in cases {
        let error = exe.set_from_device("a", span).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
        let error = exe.get_to_device("out", span).unwrap_err().to_string();
        assert!(error.contains(expected), "{error}");
    }
    let error = exe
        .set_from_device("nope", buffer.span())
        .unwrap_err()
        .to_string();
    assert!(error.contains("no input `nope`"), "{error}");

    let mut exe = embedding_program(&device, 1);
    let ids = exe.alloc(6 * 8).unwrap();
    let caller = device.context().new_stream().unwrap();
    let put = |values: [i64; 6]| {
        let host: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // SAFETY: the buffer holds six i64; synchronized before `host` goes.
        unsafe { cudarc::driver::result::memcpy_htod_async(ids.ptr(), &host, caller.cu_stream()) }
            .unwrap();
        caller.synchronize().unwrap();
    };
    put([0, 1, 10, 3, 4, 5]);
    let refused = exe
        .set_from_device("ids", ids.span())
        .unwrap_err()
        .to_string();
    assert!(refused.contains("outside 0..10"), "{refused}");
    put([0, 1, 9, 3, 4, 5]);
    exe.set_from_device("ids", ids.span()).unwrap();
    exe.run(RunMode::Eager).unwrap();
    let out = exe.get("out").unwrap().to_vec::<f32>().unwrap();
    assert_eq!(&out[8..12], &[5.0, 5.25, 5.5, 5.75], "row of id 9");
}
