//! `kiln init-model` and `kiln eval` on presets and directories, run as a user runs them, with
//! every refusal of bad input.

use std::path::Path;
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

#[track_caller]
fn succeeds(out: &Output) -> String {
    assert!(
        out.status.success(),
        "kiln failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[track_caller]
fn fails_with(out: &Output, needle: &str) {
    assert!(!out.status.success(), "kiln should have failed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(needle), "expected `{needle}` in: {stderr}");
}

fn write_tokens(path: &Path, tokens: Tensor) {
    write_safetensors(path, &[("tokens".to_string(), tokens)], None).unwrap();
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

#[test]
fn tiny_preset_and_its_directory_give_the_same_bits() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("tiny");
    succeeds(&kiln(&[
        "init-model",
        "--preset",
        "tiny",
        "--seed",
        "7",
        "--out",
        s(&dir),
    ]));
    assert!(dir.join("config.json").is_file() && dir.join("model.safetensors").is_file());
    let tokens = scratch.path().join("tokens.safetensors");
    write_tokens(
        &tokens,
        Tensor::from_vec(vec![1i32, 5, 9, 96, 0, 3, 3, 42], [2, 4]).unwrap(),
    );

    let from_dir = scratch.path().join("dir.safetensors");
    let from_preset = scratch.path().join("preset.safetensors");
    succeeds(&kiln(&[
        "eval",
        "--model",
        s(&dir),
        "--tokens",
        s(&tokens),
        "--out",
        s(&from_dir),
        "--grads",
    ]));
    succeeds(&kiln(&[
        "eval",
        "--model",
        "tiny",
        "--seed",
        "7",
        "--tokens",
        s(&tokens),
        "--out",
        s(&from_preset),
        "--grads",
    ]));
    let a = SafetensorsFile::open(&from_dir).unwrap();
    let b = SafetensorsFile::open(&from_preset).unwrap();
    assert_eq!(a.names(), b.names());
    assert_eq!(a.info("logits").unwrap().1, vec![2, 4, 97]);
    assert_eq!(a.info("loss").unwrap().1, vec![1]);
    assert!(a.names().contains(&"grad.lm_head.weight".to_string()));
    for name in a.names() {
        let x = a
            .tensor(&name, DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let y = b
            .tensor(&name, DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "{name} differs"
        );
    }
}

#[test]
fn init_model_never_overwrites() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    std::fs::write(dir.join("config.json"), "{\"mine\": true}").unwrap();
    fails_with(
        &kiln(&["init-model", "--preset", "tiny", "--out", s(dir)]),
        "already exists",
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("config.json")).unwrap(),
        "{\"mine\": true}"
    );
    assert!(!dir.join("model.safetensors").exists());
    fails_with(
        &kiln(&["init-model", "--preset", "gpt2", "--out", s(&dir.join("x"))]),
        "unknown preset `gpt2`",
    );
}

#[test]
fn eval_refuses_bad_input() {
    let scratch = tempfile::tempdir().unwrap();
    let path = |name: &str| scratch.path().join(name);
    let good = path("good.safetensors");
    write_tokens(
        &good,
        Tensor::from_vec(vec![1i64, 2, 3, 4], [1, 4]).unwrap(),
    );

    // Token id outside the vocabulary (tiny: 97).
    let bad_id = path("bad_id.safetensors");
    write_tokens(
        &bad_id,
        Tensor::from_vec(vec![1i64, 2, 97, 4], [2, 2]).unwrap(),
    );
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "tiny",
            "--tokens",
            s(&bad_id),
            "--out",
            s(&path("o1")),
        ]),
        "token id 97 at [1, 0] is outside the vocabulary 0..97",
    );
    // Float tokens, wrong rank, too short, missing tensor.
    let float = path("float.safetensors");
    write_tokens(&float, Tensor::from_vec(vec![1f32, 2.0], [1, 2]).unwrap());
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "tiny",
            "--tokens",
            s(&float),
            "--out",
            s(&path("o2")),
        ]),
        "tokens",
    );
    let flat = path("flat.safetensors");
    write_tokens(&flat, Tensor::from_vec(vec![1i64, 2, 3], [3]).unwrap());
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "tiny",
            "--tokens",
            s(&flat),
            "--out",
            s(&path("o3")),
        ]),
        "expected shape [B,T]",
    );
    let short = path("short.safetensors");
    write_tokens(&short, Tensor::from_vec(vec![1i64, 2], [2, 1]).unwrap());
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "tiny",
            "--tokens",
            s(&short),
            "--out",
            s(&path("o4")),
        ]),
        "T >= 2",
    );
    let other = path("other.safetensors");
    write_safetensors(
        &other,
        &[(
            "ids".to_string(),
            Tensor::from_vec(vec![1i64, 2], [1, 2]).unwrap(),
        )],
        None,
    )
    .unwrap();
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "tiny",
            "--tokens",
            s(&other),
            "--out",
            s(&path("o5")),
        ]),
        "no tensor `tokens`",
    );
    // Unknown model, missing tokens file, existing output.
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "nope",
            "--tokens",
            s(&good),
            "--out",
            s(&path("o6")),
        ]),
        "neither a model directory nor a preset",
    );
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "tiny",
            "--tokens",
            s(&path("missing")),
            "--out",
            s(&path("o7")),
        ]),
        "missing",
    );
    std::fs::write(path("taken"), "keep me").unwrap();
    fails_with(
        &kiln(&[
            "eval",
            "--model",
            "tiny",
            "--tokens",
            s(&good),
            "--out",
            s(&path("taken")),
        ]),
        "already exists",
    );
    assert_eq!(std::fs::read_to_string(path("taken")).unwrap(), "keep me");
    // Nothing was written by the failed runs.
    for i in 1..=7 {
        assert!(!path(&format!("o{i}")).exists());
    }
}

/// The official shapes, end to end: init-model writes the bf16 checkpoint, eval reads it back
/// and runs a short sequence. One test, run sequentially, to bound memory.
#[test]
fn official_presets_init_and_eval() {
    let scratch = tempfile::tempdir().unwrap();
    let tokens = scratch.path().join("tokens.safetensors");
    write_tokens(
        &tokens,
        Tensor::from_vec(vec![151_935i64, 0, 42, 100_000], [1, 4]).unwrap(),
    );
    for preset in ["qwen2.5-0.5b", "deepseek-r1-distill-qwen-1.5b"] {
        let dir = scratch.path().join(preset);
        let stdout = succeeds(&kiln(&["init-model", "--preset", preset, "--out", s(&dir)]));
        assert!(stdout.contains("bf16"), "{stdout}");
        let out = scratch.path().join(format!("{preset}.safetensors"));
        succeeds(&kiln(&[
            "eval",
            "--model",
            s(&dir),
            "--tokens",
            s(&tokens),
            "--out",
            s(&out),
        ]));
        let file = SafetensorsFile::open(&out).unwrap();
        assert_eq!(file.info("logits").unwrap().1, vec![1, 4, 151_936]);
        let loss = file
            .tensor("loss", DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap()[0];
        // Random weights predict near-uniformly over 151,936 tokens: ln V ≈ 11.93.
        assert!((loss - 11.93).abs() < 0.5, "{preset}: loss {loss}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
