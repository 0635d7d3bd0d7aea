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
fn eval_interpret_mode_writes_the_oracles_bits() {
    let scratch = tempfile::tempdir().unwrap();
    let tokens = scratch.path().join("tokens.safetensors");
    let ids = Tensor::from_vec(vec![3i64, 14, 15, 92, 65, 35, 89, 79], [2, 4]).unwrap();
    write_safetensors(&tokens, &[("tokens".to_string(), ids)], None).unwrap();
    let mut files = Vec::new();
    for mode in ["oracle", "interpret"] {
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
    assert_eq!(files[0].names(), files[1].names());
    assert!(files[0].names().len() > 20);
    for name in files[0].names() {
        let a = files[0]
            .tensor(&name, DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let b = files[1]
            .tensor(&name, DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{name}"
        );
    }
}
