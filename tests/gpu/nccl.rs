//! 6 of the module doc: a world of one rank through NCCL on one GPU (several GPUs are checked
//! where a machine has them). The data-parallel train step and the tensor-parallel decode of
//! the tiny model, their all-reduces run by NCCL on the communication stream, eager and
//! captured into the device graph, against the interpreter (a world of one there too); and
//! the host side of the communicator.

#[cfg(feature = "nccl")]
use super::*;

#[cfg(not(feature = "nccl"))]
#[test]
fn a_world_of_one_runs_through_nccl() {
    // Not a GPU skip: this build has no NCCL to check (the device runs build with it).
    println!("SKIPPED: the NCCL checks: this kiln was built without --features nccl");
}

#[cfg(feature = "nccl")]
#[test]
fn a_world_of_one_runs_through_nccl() {
    use kiln_frontend::programs::DataParallel;
    use kiln_runtime::collective::Communicator;
    use kiln_runtime::cuda::nccl;

    if device().is_none() {
        return;
    }
    // A device of its own: its communicator is joined once.
    let device = CudaDevice::open(0).unwrap();
    let id = match nccl::unique_id() {
        Ok(id) => id,
        Err(e) => return testing::skip_without_gpu("the NCCL checks", &e.to_string()),
    };
    device.join_nccl(&id, 0, 1).unwrap();
    let error = device.join_nccl(&id, 0, 1).unwrap_err().to_string();
    assert!(error.contains("already joined"), "{error}");

    let host = nccl::NcclCommunicator::new(device.clone()).unwrap();
    assert_eq!((host.rank(), host.world_size()), (0, 1));
    let x = Tensor::from_vec(vec![1.5f32, -2.25, 1e-3, 7.0, -0.0], [5]).unwrap();
    assert_eq!(
        bits(&host.all_reduce(std::slice::from_ref(&x)).unwrap()[0]),
        bits(&x)
    );

    let config = ModelConfig::tiny();
    let base = ProgramOptions {
        batch: 2,
        seq: 6,
        max_seq: Some(12),
        ..Default::default()
    };
    let cases = [
        (
            ProgramKind::Train,
            ProgramOptions {
                data_parallel: Some(DataParallel {
                    bucket_bytes: 40_000,
                }),
                ..base.clone()
            },
        ),
        (
            ProgramKind::Train,
            ProgramOptions {
                precision: Precision::Bf16Gemm,
                data_parallel: Some(DataParallel::default()),
                ..base.clone()
            },
        ),
        (
            ProgramKind::Decode,
            ProgramOptions {
                tensor_parallel: Some(1),
                ..base.clone()
            },
        ),
    ];
    for (kind, options) in cases {
        let graph = build(kind, &config, &options).unwrap();
        let values = programs::program_inputs(&graph, &config, kind, &options, 17);
        let mut cpu_values = values.clone();
        interpret(&graph, &mut cpu_values).unwrap();
        let want = interpret(&graph, &mut cpu_values).unwrap();
        for streams in [1, 2] {
            let planned = programs::gpu_plan(&graph, streams);
            assert_eq!(planned.communication_stream, Some(streams));
            let backend = Backend::Cuda(device.clone());
            let eager = backend
                .run(&graph, &planned, &values, RunMode::Eager, 2)
                .unwrap();
            let replayed = backend
                .run(&graph, &planned, &values, RunMode::Graph, 2)
                .unwrap();
            for (name, got) in &eager {
                let reference = want.get(name).unwrap_or_else(|| &cpu_values[name]);
                let error =
                    testing::rel_l2(&got.to_f64_vec().unwrap(), &reference.to_f64_vec().unwrap());
                let what = format!(
                    "{} {:?} streams={streams}: {name}",
                    kind.name(),
                    options.precision
                );
                let limit = programs::program_limit(options.precision, kind, name);
                assert!(error <= limit, "{what}: relative error {error:e}");
                assert_eq!(bits(got), bits(&replayed[name]), "{what}: replay != eager");
            }
            println!(
                "{} {:?} streams={streams} through NCCL: {} values checked",
                kind.name(),
                options.precision,
                eager.len()
            );
        }
    }
}
