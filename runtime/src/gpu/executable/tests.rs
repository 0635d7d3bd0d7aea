//! Capture rules and executable groups on a real device (skipped, with the reason printed,
//! where none can be used).

use std::sync::Arc;

use kiln_ir::{DType, Graph, InputKind, Op, TensorType};
use kiln_planner::{plan, Plan, PlanOptions};

use super::super::DeviceAlloc;
use crate::cuda::{CudaDevice, CudaExecutable};

use crate::backend::{Executable, RunMode};
use crate::group::tests::{members_equal_standalone_executables, plans};
use crate::tensor::Tensor;
use crate::Workspaces;

pub(super) fn device() -> Option<Arc<CudaDevice>> {
    match crate::cuda::unavailable() {
        Some(reason) => {
            kiln_kernels::testing::skip_without_gpu("the CUDA executable tests", &reason);
            None
        }
        None => Some(CudaDevice::open(0).expect("a usable CUDA device opens")),
    }
}

/// `out = a + b` over [4, 8] f32.
pub(super) fn add_program(device: &Arc<CudaDevice>) -> CudaExecutable {
    let mut graph = Graph::new("add");
    let ty = TensorType::new(DType::F32, [4, 8]).unwrap();
    let a = graph.input("a", InputKind::Input, ty.clone()).unwrap();
    let b = graph.input("b", InputKind::Input, ty).unwrap();
    let sum = graph.op1(Op::Add, &[a, b]).unwrap();
    graph.output("out", sum).unwrap();
    let planned = plan(&graph, &PlanOptions::default(), &crate::Workspaces::Cuda).unwrap();
    let mut exe = CudaExecutable::new(device, &graph, &planned).unwrap();
    let a: Vec<f32> = (0..32).map(|i| i as f32 * 0.5 - 3.0).collect();
    let b: Vec<f32> = (0..32).map(|i| 7.0 - i as f32 * 0.25).collect();
    exe.set("a", &Tensor::from_vec(a, [4, 8]).unwrap()).unwrap();
    exe.set("b", &Tensor::from_vec(b, [4, 8]).unwrap()).unwrap();
    exe
}

pub(super) fn want() -> Vec<f32> {
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
    let refused = exe.capture_with(|exe| DeviceAlloc::new(&exe.device, 256, 0).map(drop));
    let error = refused.expect_err("a device allocation inside a capture must fail");
    println!("refused inside the capture: {error}");
    assert!(exe.graph.is_none());
    exe.run(RunMode::Eager).unwrap();
    assert_eq!(exe.get("out").unwrap().to_vec::<f32>().unwrap(), want());
    exe.run(RunMode::Graph).unwrap();
    assert_eq!(exe.get("out").unwrap().to_vec::<f32>().unwrap(), want());
}

/// A timeline runs the program (its output is the sum) and times each step from the start.
#[test]
fn a_timeline_runs_the_program_and_times_each_step() {
    let Some(device) = device() else { return };
    let exe = add_program(&device);
    let timeline = exe.timeline().unwrap();
    println!("timeline: {timeline:?}");
    assert_eq!(timeline.len(), 1);
    let step = &timeline[0];
    assert_eq!((step.op.as_str(), step.stream), ("add", 0));
    assert!(0.0 <= step.start_ms && step.start_ms <= step.end_ms && step.end_ms < 1e3);
    assert_eq!(exe.get("out").unwrap().to_vec::<f32>().unwrap(), want());
}

/// `out = embedding(weight [10,4], ids [2,3])`, with the weights set.
pub(super) fn embedding_program(device: &Arc<CudaDevice>, streams: usize) -> CudaExecutable {
    let mut graph = Graph::new("embedding");
    let weight = (graph.input(
        "w",
        InputKind::Param,
        TensorType::new(DType::F32, [10, 4]).unwrap(),
    ))
    .unwrap();
    let ids = (graph.input(
        "ids",
        InputKind::Input,
        TensorType::new(DType::I64, [2, 3]).unwrap(),
    ))
    .unwrap();
    let rows = graph.op1(Op::Embedding, &[weight, ids]).unwrap();
    graph.output("out", rows).unwrap();
    let options = PlanOptions {
        streams,
        ..PlanOptions::default()
    };
    let planned = plan(&graph, &options, &crate::Workspaces::Cuda).unwrap();
    let mut exe = CudaExecutable::new(device, &graph, &planned).unwrap();
    let w: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 - 4.0).collect();
    exe.set("w", &Tensor::from_vec(w, [10, 4]).unwrap())
        .unwrap();
    exe
}

/// An id outside the vocabulary is refused by `set`; one that reaches the device anyway (here
/// written straight into the input's slot) raises the step's fault word, and the next
/// synchronization names the op; the words are cleared, so a valid run follows.
#[test]
fn an_invalid_index_is_refused_on_the_host_and_reported_from_the_device() {
    let Some(device) = device() else { return };
    let mut exe = embedding_program(&device, 1);
    let ids = |v: Vec<i64>| Tensor::from_vec(v, [2, 3]).unwrap();
    let refused = exe.set("ids", &ids(vec![0, 1, 10, 3, 4, 5])).unwrap_err();
    assert!(refused.to_string().contains("outside 0..10"), "{refused}");
    exe.set("ids", &ids(vec![0, 1, 9, 3, 4, 5])).unwrap();
    for mode in [RunMode::Eager, RunMode::Graph] {
        let (slot, _) = exe.input("ids").unwrap();
        let bad: Vec<u8> = [0i64, 1, 12, 3, 4, 5]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        // SAFETY: the slot holds exactly six i64; the streams are idle after `set`.
        unsafe { cudarc::driver::result::memcpy_htod_sync(exe.slots[slot as usize].ptr, &bad) }
            .unwrap();
        exe.run(mode).unwrap();
        let error = exe.get("out").unwrap_err();
        let text = error.to_string();
        println!("{mode:?}: {text}");
        assert!(
            text.contains("embedding") && text.contains("invalid index"),
            "{text}"
        );
        exe.set("ids", &ids(vec![0, 1, 9, 3, 4, 5])).unwrap();
        exe.run(mode).unwrap();
        let out = exe.get("out").unwrap().to_vec::<f32>().unwrap();
        assert_eq!(
            &out[8..12],
            &[5.0, 5.25, 5.5, 5.75],
            "row of id 9 after the fault"
        );
    }
}

/// Every plan stream has a GEMM workspace of its own (GEMMs of two streams may run at once).
#[test]
fn each_stream_has_its_own_gemm_workspace() {
    let Some(device) = device() else { return };
    let exe = embedding_program(&device, 2);
    let pointers: Vec<u64> = exe.gemm_workspaces.iter().map(|w| w.ptr).collect();
    assert_eq!(pointers.len(), 2);
    assert_ne!(pointers[0], pointers[1]);
    assert!(pointers.iter().all(|&p| p % 256 == 0));
}

/// A group on the device, as on the CPU (`group::tests`): members bit-equal standalone
/// executables fed the same values, eager and replayed, with the state and the param shared;
/// and what the group shares is one allocation, one stream 0 and one issue lock, while the
/// per-run inputs and the fault words stay each member's.
#[test]
fn a_group_shares_its_arena_params_state_and_stream() {
    let Some(device) = device() else { return };
    let mut rng = kiln_kernels::testing::rng("cuda_group");
    let group = |programs: &[(&Graph, &Plan)]| {
        let (executables, memory) = CudaExecutable::group(&device, programs).unwrap();
        let boxed = (executables.into_iter())
            .map(|e| Box::new(e) as Box<dyn Executable>)
            .collect();
        (boxed, memory)
    };
    let standalone = |graph: &Graph, plan: &Plan| {
        Box::new(CudaExecutable::new(&device, graph, plan).unwrap()) as Box<dyn Executable>
    };
    for streams in [[1, 1], [2, 1]] {
        let makers = (&group as _, &standalone as _);
        members_equal_standalone_executables(&mut rng, streams, &Workspaces::Cuda, makers);
    }

    let (a, plan_a, b, plan_b) = plans([2, 1], &Workspaces::Cuda);
    let (members, memory) =
        CudaExecutable::group(&device, &[(&a, &plan_a), (&b, &plan_b)]).unwrap();
    let slot = |exe: &CudaExecutable, name: &str| {
        let (slot, _) = exe.input(name).unwrap();
        exe.slots[slot as usize].clone()
    };
    let [first, second] = &members[..] else {
        panic!("two members");
    };
    assert!(Arc::ptr_eq(&first.slots[0], &second.slots[0]));
    assert_eq!(first.slots[0].bytes as u64, memory.arena_bytes);
    for name in ["w", "s"] {
        assert!(
            Arc::ptr_eq(&slot(first, name), &slot(second, name)),
            "{name}"
        );
    }
    assert!(!Arc::ptr_eq(&slot(first, "x"), &slot(second, "x")));
    assert_eq!((first.streams.len(), second.streams.len()), (2, 1));
    assert!(Arc::ptr_eq(&first.streams[0], &second.streams[0]));
    assert!(Arc::ptr_eq(
        &first.gemm_workspaces[0],
        &second.gemm_workspaces[0]
    ));
    assert!(Arc::ptr_eq(&first.issue, &second.issue));
    let faults = |exe: &CudaExecutable| exe.slots[exe.program.fault_slot as usize].ptr;
    assert_ne!(faults(first), faults(second));
}

/// Inputs large enough to go through the pinned staging buffers (two 32 MiB buffers in turn)
/// arrive bit for bit, at sizes that end mid-buffer and on a buffer's edge, and the sum of two
/// of them equals the host's.
#[test]
fn large_inputs_go_through_pinned_staging_bit_for_bit() {
    let Some(device) = device() else { return };
    let mut rng = kiln_kernels::testing::rng("pinned staging");
    let buffer = (32 << 20) / 4;
    for elements in [buffer * 3 + 12_345, buffer * 2, (4 << 20) / 4 - 1] {
        let mut graph = Graph::new("add");
        let ty = TensorType::new(DType::F32, [elements]).unwrap();
        let a = graph.input("a", InputKind::Param, ty.clone()).unwrap();
        let b = graph.input("b", InputKind::Input, ty).unwrap();
        let sum = graph.op1(Op::Add, &[a, b]).unwrap();
        graph.output("out", sum).unwrap();
        let planned = plan(&graph, &PlanOptions::default(), &Workspaces::Cuda).unwrap();
        let mut exe = CudaExecutable::new(&device, &graph, &planned).unwrap();
        let values = |rng: &mut rand::rngs::StdRng| -> Vec<f32> {
            (0..elements)
                .map(|_| rand::Rng::random_range(rng, -4.0..4.0))
                .collect()
        };
        let (a, b) = (values(&mut rng), values(&mut rng));
        exe.set("a", &Tensor::from_vec(a.clone(), [elements]).unwrap())
            .unwrap();
        exe.set("b", &Tensor::from_vec(b.clone(), [elements]).unwrap())
            .unwrap();
        let back = exe.get("a").unwrap().to_vec::<f32>().unwrap();
        assert!(
            back.iter().zip(&a).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{elements}"
        );
        exe.run(RunMode::Eager).unwrap();
        let out = exe.get("out").unwrap().to_vec::<f32>().unwrap();
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        assert!(
            out.iter()
                .zip(&want)
                .all(|(x, y)| x.to_bits() == y.to_bits()),
            "{elements}"
        );
    }
}

/// A device opened on another thread comes back with every kernel module loaded; where no
/// device can be used, waiting for it gives the error that says why (no panic).
#[test]
fn a_device_opened_in_the_background_has_its_kernels_or_says_why_not() {
    let opened = CudaDevice::open_in_background(0).wait();
    match crate::cuda::unavailable() {
        Some(reason) => {
            let error = opened
                .err()
                .expect("no device can be used, so opening fails");
            assert!(error.to_string().contains("no usable device"), "{error}");
            kiln_kernels::testing::skip_without_gpu("opening a device in the background", &reason);
        }
        None => {
            let report = opened.expect("the device opens").kernel_report();
            assert_eq!(
                report.modules,
                kiln_kernels::gpu::SOURCES.len(),
                "{report:?}"
            );
        }
    }
}

/// On the device as on the CPU (runtime/src/planned/executable/tests.rs): setting a param sets
/// its derived copy, the program keeps it derived, and the copy is not set directly.
#[test]
fn a_params_derived_copy_is_set_with_it_on_the_device() {
    let Some(device) = device() else { return };
    let graph = crate::planned::executable::tests::derived_copy_program();
    let plan = plan(&graph, &PlanOptions::default(), &Workspaces::Cuda).unwrap();
    let values: Vec<f32> = (0..12).map(|i| 0.1 + i as f32 / 7.0).collect();
    let w = Tensor::from_vec(values, [3, 4]).unwrap();
    let mut exe = CudaExecutable::new(&device, &graph, &plan).unwrap();
    exe.set("w", &w).unwrap();
    for mode in [RunMode::Eager, RunMode::Graph] {
        let before = exe.get("w").unwrap();
        Executable::run(&mut exe, mode).unwrap();
        let seen = exe.get("seen").unwrap().to_vec::<f32>().unwrap();
        let want = before
            .cast_to(DType::BF16)
            .unwrap()
            .cast_to(DType::F32)
            .unwrap();
        assert_eq!(seen, want.to_vec::<f32>().unwrap(), "{mode:?}");
        let copy = exe.get("bf16.w").unwrap().to_vec::<half::bf16>().unwrap();
        let doubled = exe.get("w").unwrap().cast_to(DType::BF16).unwrap();
        assert_eq!(copy, doubled.to_vec::<half::bf16>().unwrap(), "{mode:?}");
    }
    let error = exe
        .set("bf16.w", &w.cast_to(DType::BF16).unwrap())
        .unwrap_err();
    assert!(error.to_string().contains("derived from `w`"), "{error}");
}
