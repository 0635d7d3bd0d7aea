//! `kiln compile` and `kiln eval --mode interpret`, run as a user runs them.

use std::process::{Command, Output};

use kiln_frontend::hf::safetensors_io::{write_safetensors, SafetensorsFile};
use kiln_ir::DType;
use kiln_runtime::Tensor;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

fn stdout_of(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn compile_summarizes_and_prints_every_program() {
    for program in ["prefill", "decode", "train"] {
        let text = stdout_of(kiln(&[
            "compile",
            "--model",
            "tiny",
            "--program",
            program,
            "--batch",
            "2",
            "--seq",
            "8",
        ]));
        assert!(
            text.starts_with(&format!("program {program} for tiny")),
            "{text}"
        );
        assert!(text.contains("traced and verified"), "{text}");
        let ir = stdout_of(kiln(&[
            "compile",
            "--model",
            "tiny",
            "--program",
            program,
            "--print-ir",
        ]));
        assert!(ir.starts_with(&format!("program {program}\n")), "{ir}");
        assert!(
            ir.contains("param  %0 model.embed_tokens.weight : f32[97,64]"),
            "{ir}"
        );
    }
    let train = stdout_of(kiln(&[
        "compile",
        "--model",
        "tiny",
        "--program",
        "train",
        "--print-ir",
    ]));
    assert!(
        train.contains("adamw{") && train.contains("write adamw.m.lm_head.weight"),
        "train updates inside the graph"
    );
}

#[test]
fn compile_refuses_bad_arguments() {
    let out = kiln(&[
        "compile",
        "--model",
        "tiny",
        "--program",
        "prefill",
        "--seq",
        "100",
        "--max-seq",
        "64",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("does not fit a cache"));
    let out = kiln(&["compile", "--model", "nope", "--program", "decode"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither a model directory nor a preset"));
}

#[test]
fn eval_interpret_planned_and_graph_modes_write_the_oracles_bits() {
    let scratch = tempfile::tempdir().unwrap();
    let tokens = scratch.path().join("tokens.safetensors");
    let ids = Tensor::from_vec(vec![3i64, 14, 15, 92, 65, 35, 89, 79], [2, 4]).unwrap();
    write_safetensors(&tokens, &[("tokens".to_string(), ids)], None).unwrap();
    let mut files = Vec::new();
    // On the CPU the planned executor and its replayed recording run the interpreter's kernels
    // in the interpreter's order: the same bits.
    for mode in ["oracle", "interpret", "planned", "graph"] {
        let out = scratch.path().join(format!("{mode}.safetensors"));
        let args = [
            "eval",
            "--model",
            "tiny",
            "--tokens",
            tokens.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--grads",
            "--mode",
            mode,
        ];
        stdout_of(kiln(&args));
        files.push(SafetensorsFile::open(&out).unwrap());
    }
    assert!(files[0].names().len() > 20);
    let read = |file: &SafetensorsFile, name: &str| {
        file.tensor(name, DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()
    };
    for (index, file) in files.iter().enumerate().skip(1) {
        assert_eq!(files[0].names(), file.names());
        for name in files[0].names() {
            let (a, b) = (read(&files[0], &name), read(file, &name));
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "mode {index}: {name}"
            );
        }
    }
}

/// `--device cuda`: where no CUDA device can be used, a clear error; where one can (the GPU
/// machine), the replayed program within 1e-5 of the oracle.
#[test]
fn eval_on_cuda_runs_or_says_why_not() {
    let scratch = tempfile::tempdir().unwrap();
    let tokens = scratch.path().join("tokens.safetensors");
    let ids = Tensor::from_vec(vec![3i64, 14, 15, 92, 65, 35, 89, 79], [2, 4]).unwrap();
    write_safetensors(&tokens, &[("tokens".to_string(), ids)], None).unwrap();
    let run = |mode: &str, device: &str| {
        let out = scratch.path().join(format!("{mode}-{device}.safetensors"));
        let args = [
            "eval",
            "--model",
            "tiny",
            "--tokens",
            tokens.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--grads",
            "--mode",
            mode,
            "--device",
            device,
        ];
        (kiln(&args), out)
    };
    let (refused, _) = run("interpret", "cuda");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("use --mode planned or --mode graph"));
    let (out, path) = run("graph", "cuda");
    match kiln_runtime::cuda::unavailable() {
        Some(reason) => {
            kiln_kernels::testing::skip_without_gpu("the GPU half of eval", &reason);
            assert!(!out.status.success());
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains("--device cuda") && stderr.contains(&reason),
                "{stderr}"
            );
        }
        None => {
            stdout_of(out);
            let (oracle, oracle_path) = run("oracle", "cpu");
            stdout_of(oracle);
            let (gpu, cpu) = (
                SafetensorsFile::open(&path).unwrap(),
                SafetensorsFile::open(&oracle_path).unwrap(),
            );
            for name in cpu.names() {
                let want = cpu.tensor(&name, DType::F32).unwrap().to_f64_vec().unwrap();
                let got = gpu.tensor(&name, DType::F32).unwrap().to_f64_vec().unwrap();
                let error = kiln_kernels::testing::rel_l2(&got, &want);
                assert!(error <= 1e-5, "{name}: relative error {error:e}");
            }
        }
    }
}

#[test]
fn plan_dumps_every_format() {
    let args = |format: &'static str| {
        vec![
            "plan",
            "--model",
            "tiny",
            "--program",
            "train",
            "--batch",
            "2",
            "--seq",
            "4",
            "--streams",
            "2",
            "--format",
            format,
        ]
    };
    let text = stdout_of(kiln(&[args("text"), vec!["--verify"]].concat()));
    assert!(text.starts_with("plan train\n"), "{text}");
    for needle in [
        "arena / lower bound",
        "at the peak step",
        "time x offset map",
        "verified: the independent plan verifier",
    ] {
        assert!(text.contains(needle), "missing `{needle}` in:\n{text}");
    }
    let json: serde_json::Value = serde_json::from_str(&stdout_of(kiln(&args("json")))).unwrap();
    assert!(json["arena_bytes"].as_u64().unwrap() >= json["lower_bound_bytes"].as_u64().unwrap());
    for key in ["name", "class", "offset", "size", "start", "end"] {
        assert!(
            json["buffers"][0].get(key).is_some(),
            "buffers carry `{key}`"
        );
    }
    let csv = stdout_of(kiln(&args("csv")));
    assert!(
        csv.starts_with("id,name,class,offset,size,start,end,uses\n"),
        "{csv}"
    );
    assert_eq!(
        csv.lines().count() - 1,
        json["buffers"].as_array().unwrap().len()
    );
    let svg = stdout_of(kiln(&args("svg")));
    assert!(
        svg.starts_with("<svg") || svg.starts_with("<?xml"),
        "{}",
        &svg[..80.min(svg.len())]
    );
    assert!(svg.trim_end().ends_with("</svg>"));
}

#[test]
fn plan_writes_to_a_new_file_only() {
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("plan.svg");
    let path = out.to_str().unwrap();
    let args = [
        "plan",
        "--model",
        "tiny",
        "--program",
        "decode",
        "--format",
        "svg",
        "--out",
        path,
    ];
    let run = kiln(&args);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(std::fs::read_to_string(&out).unwrap().contains("</svg>"));
    std::fs::write(&out, "mine").unwrap();
    let again = kiln(&args);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "mine");
}

/// `kiln plan --backend` sizes workspaces for one backend's kernels: with bf16 GEMM inputs the
/// CPU reference widens each GEMM's operands into a workspace and CUDA's GEMMs need none, so
/// the CUDA plan's workspaces are fewer and smaller, and a plan for any backend gives each op
/// the larger of the two. (Arenas follow from each plan's schedule, which the workspaces steer:
/// no order between them is promised.)
#[test]
fn plan_sizes_workspaces_for_the_backend_asked_for() {
    let workspaces = |backend: &str| -> (usize, u64) {
        let args = [
            "plan",
            "--model",
            "tiny",
            "--program",
            "train",
            "--batch",
            "2",
            "--seq",
            "8",
            "--precision",
            "bf16-gemm",
            "--format",
            "json",
            "--verify",
            "--backend",
            backend,
        ];
        let plan: serde_json::Value = serde_json::from_str(&stdout_of(kiln(&args))).unwrap();
        let sizes: Vec<u64> = (plan["buffers"].as_array().unwrap().iter())
            .filter(|b| b["class"] == "workspace")
            .map(|b| b["size"].as_u64().unwrap())
            .collect();
        (sizes.len(), sizes.iter().sum())
    };
    let (any, cpu, cuda) = (workspaces("any"), workspaces("cpu"), workspaces("cuda"));
    assert!(
        cuda.1 < cpu.1,
        "workspace bytes: cuda {cuda:?} vs cpu {cpu:?}"
    );
    assert!(cpu.1 <= any.1 && cuda.1 <= any.1, "any {any:?}");
    // The CUDA plan keeps the workspaces of its own kernels (norm and loss rows) only.
    assert!(
        cuda.0 < any.0 && cuda.0 > 0,
        "workspaces: cuda {cuda:?}, any {any:?}"
    );
    let refused = kiln(&[
        "plan",
        "--model",
        "tiny",
        "--program",
        "train",
        "--backend",
        "tpu",
    ]);
    assert!(!refused.status.success());
}
