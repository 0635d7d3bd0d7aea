//! Compiles tests/c/abi_test.c with `cc` against include/kiln.h and the static library, runs
//! it (every bad call must answer with its status, none may crash), and compares the logits
//! it wrote with the session layer's, bit for bit.

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_capi::session::{DeviceKind, Model};
use kiln_frontend::programs::ProgramKind;
use kiln_runtime::{RunMode, Tensor};

/// The directory cargo built this crate's libraries into for this test: `deps/`, beside the
/// test binary (the copies in the profile directory above it only `cargo build` refreshes).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .expect("the test binary is in deps/")
        .to_path_buf()
}

/// The tiny preset's prefill logits for the C program's tokens, through the session layer.
fn session_logits() -> Vec<u8> {
    let model = Model::load("tiny", DeviceKind::Cpu, Default::default(), 0).unwrap();
    let options = (model.program_options(ProgramKind::Prefill, (1, 8, None), true)).unwrap();
    let mut program = model
        .compile(ProgramKind::Prefill, &options, RunMode::Eager)
        .unwrap();
    let tokens = Tensor::from_vec(vec![1i64, 5, 9, 2, 70, 3, 3, 8], [1, 8]).unwrap();
    let positions = Tensor::from_vec((0..8i64).collect(), [1, 8]).unwrap();
    program.set("tokens", &tokens).unwrap();
    program.set("positions", &positions).unwrap();
    let start = Tensor::from_vec(vec![0i64], [1]).unwrap();
    program.set("cache_positions", &start).unwrap();
    program.run().unwrap();
    let logits = program.get("logits").unwrap().to_vec::<f32>().unwrap();
    logits.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn run(command: &mut Command, what: &str) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{text}",
        output.status
    );
    text
}

#[test]
fn the_c_program_runs_the_tiny_prefill_and_every_bad_call_returns_an_error() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let library = library_dir().join("libkiln_capi.a");
    assert!(
        library.exists(),
        "{} is missing: cargo builds it with this crate",
        library.display()
    );
    let scratch = tempfile::tempdir().unwrap();
    let exe = scratch.path().join("abi_test");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    run(
        Command::new(&cc)
            .args(["-std=c99", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(crate_dir.join("include"))
            .arg(crate_dir.join("tests/c/abi_test.c"))
            .arg(&library)
            .args(["-pthread", "-ldl", "-lm", "-o"])
            .arg(&exe),
        "compiling tests/c/abi_test.c",
    );
    let logits_path = scratch.path().join("logits.bin");
    let report = run(Command::new(&exe).arg(&logits_path), "running abi_test");
    println!("{report}");
    assert!(report.contains(" passed, 0 failed"), "{report}");
    let written = std::fs::read(&logits_path).unwrap();
    assert_eq!(written.len(), 97 * 4);
    assert!(
        written == session_logits(),
        "the C program's logits differ from the session's"
    );
}
