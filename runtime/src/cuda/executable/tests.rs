//! Capture rules on a real device (skipped, with the reason printed, where none can be used).

use std::sync::Arc;

use kiln_ir::{DType, Graph, InputKind, Op, TensorType};
use kiln_planner::{plan, PlanOptions};

use super::super::{CudaDevice, DeviceAlloc};
use super::CudaExecutable;
use crate::backend::RunMode;
use crate::tensor::Tensor;

fn device() -> Option<Arc<CudaDevice>> {
    match super::super::unavailable() {
        Some(reason) => {
            println!("SKIPPED: no CUDA device: {reason}");
            None
        }
        None => Some(CudaDevice::open(0).expect("a usable CUDA device opens")),
    }
}

/// `out = a + b` over [4, 8] f32.
fn add_program(device: &Arc<CudaDevice>) -> CudaExecutable {
    let mut graph = Graph::new("add");
    let ty = TensorType::new(DType::F32, [4, 8]).unwrap();
    let a = graph.input("a", InputKind::Input, ty.clone()).unwrap();
    let b = graph.input("b", InputKind::Input, ty).unwrap();
    let sum = graph.op1(Op::Add, &[a, b]).unwrap();
    graph.output("out", sum).unwrap();
    let planned = plan(&graph, &PlanOptions::default()).unwrap();
    let mut exe = CudaExecutable::new(device, &graph, &planned).unwrap();
    let a: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 3.0).collect();
    let b: Vec<f32> = (0..32).map(|i| 7.0 - i as f32 * 0.25).collect();
    exe.set("a", &Tensor::from_vec(a, [4, 8]).unwrap()).unwrap();
    exe.set("b", &Tensor::from_vec(b, [4, 8]).unwrap()).unwrap();
    exe
}

fn want() -> Vec<f32> {
    (0..32)
        .map(|i| (i as f32 * 0.5 - 3.0) + (7.0 - i as f32 * 0.25))
        .collect()
}

/// An allocation inside a capture is refused (the capture runs in global mode), the abandoned
/// capture is ended by the guard, and eager runs and a fresh capture work on the same stream.
#[test]
fn an_allocation_inside_a_capture_is_refused_and_the_stream_recovers() {
    let Some(device) = device() else { return };
    let mut exe = add_program(&device);
    let refused = exe.capture_with(|exe| DeviceAlloc::new(exe.device.context(), 256, 0).map(drop));
    let error = refused.expect_err("a device allocation inside a capture must fail");
    println!("refused inside the capture: {error}");
    assert!(exe.graph.is_none());
    exe.run(RunMode::Eager).unwrap();
    assert_eq!(exe.get("out").unwrap().to_vec::<f32>().unwrap(), want());
    exe.run(RunMode::Graph).unwrap();
    assert_eq!(exe.get("out").unwrap().to_vec::<f32>().unwrap(), want());
}
