//! What `kiln eval` reads and says about it, run as a user runs it: a FIFO as the tokens file is
//! refused at once, tokens must be integer ids, the loss line counts the predicted tokens, and
//! the RoPE buffers of old checkpoints are ignored with a note naming them.

use std::fs;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use kiln_frontend::hf::safetensors_io::{write_safetensors, SafetensorsFile};
use kiln_ir::DType;
use kiln_kernels::testing::rng;
use kiln_runtime::Tensor;
use rand::Rng;

/// Runs kiln, killing it and failing if it has not ended within 60 s.
fn kiln(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kiln");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("kiln {args:?} still running after 60 s: it hangs");
        }
        sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

#[track_caller]
fn succeeds(out: &Output) -> (String, String) {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(out.status.success(), "kiln failed: {}", text(&out.stderr));
    (text(&out.stdout), text(&out.stderr))
}

#[track_caller]
fn fails_with(out: &Output, parts: &[&str]) {
    assert!(!out.status.success(), "kiln should have failed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for part in parts {
        assert!(stderr.contains(part), "expected `{part}` in: {stderr}");
    }
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Random token ids of the tiny preset (vocabulary 97).
fn random_tokens(test: &str, rows: usize, columns: usize) -> Tensor {
    let mut rng = rng(test);
    let ids: Vec<i64> = (0..rows * columns)
        .map(|_| rng.random_range(0..97))
        .collect();
    Tensor::from_vec(ids, [rows, columns]).unwrap()
}

fn eval(model: &str, tokens: &Path, out: &Path) -> Output {
    kiln(&[
        "eval",
        "--model",
        model,
        "--tokens",
        s(tokens),
        "--out",
        s(out),
    ])
}

#[test]
fn a_fifo_as_the_tokens_file_is_refused_without_waiting() {
    let scratch = tempfile::tempdir().unwrap();
    let fifo = scratch.path().join("tokens.safetensors");
    let made = Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("skipped: mkfifo is not available here");
        return;
    }
    let out = scratch.path().join("out.safetensors");
    fails_with(
        &eval("tiny", &fifo, &out),
        &[s(&fifo), "a FIFO (named pipe), not a regular file"],
    );
    assert!(!out.exists());
}

#[test]
fn the_loss_line_counts_the_predicted_tokens() {
    let scratch = tempfile::tempdir().unwrap();
    let tokens = scratch.path().join("tokens.safetensors");
    let batch = random_tokens("the_loss_line_counts_the_predicted_tokens", 2, 8);
    write_safetensors(&tokens, &[("tokens".to_string(), batch)], None).unwrap();
    let out = scratch.path().join("out.safetensors");
    let (stdout, _) = succeeds(&eval("tiny", &tokens, &out));
    // Hugging Face's causal-LM loss: logits[:, :-1] against tokens[:, 1:], 2 × 7 targets.
    assert!(
        stdout.contains("over 14 predicted tokens (2 rows × 7"),
        "{stdout}"
    );
    let loss = SafetensorsFile::open(&out)
        .unwrap()
        .tensor("loss", DType::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()[0];
    assert!(stdout.starts_with(&format!("loss {loss:.6} ")), "{stdout}");
}

#[test]
fn tokens_must_be_integer_ids() {
    let scratch = tempfile::tempdir().unwrap();
    let mut rng = rng("tokens_must_be_integer_ids");
    let bytes: Vec<u8> = (0..8).map(|_| rng.random_range(0..97)).collect();
    for (dtype, name) in [
        (safetensors::Dtype::U8, "U8"),
        (safetensors::Dtype::F32, "F32"),
    ] {
        let path = scratch.path().join(format!("{name}.safetensors"));
        let width = if name == "U8" { 1 } else { 4 };
        let data = &bytes[..8 / width * width];
        let view = safetensors::tensor::TensorView::new(dtype, vec![2, 4 / width], data).unwrap();
        fs::write(
            &path,
            safetensors::serialize([("tokens", view)], None).unwrap(),
        )
        .unwrap();
        let out = scratch.path().join(format!("{name}.out"));
        fails_with(
            &eval("tiny", &path, &out),
            &[
                s(&path),
                &format!("tensor `tokens` has dtype {name}"),
                "expected integer token ids, I32 or I64",
            ],
        );
        assert!(!out.exists());
    }
}

#[test]
fn rope_buffers_of_old_checkpoints_are_ignored_with_a_note() {
    let test = "rope_buffers_of_old_checkpoints_are_ignored_with_a_note";
    let scratch = tempfile::tempdir().unwrap();
    let path = |name: &str| scratch.path().join(name);
    let mut rng = rng(test);
    let seed = rng.random_range(0..1000u64).to_string();
    succeeds(&kiln(&[
        "init-model",
        "--preset",
        "tiny",
        "--seed",
        &seed,
        "--out",
        s(&path("new")),
    ]));

    // The same weights as an old checkpoint: every layer's inverse frequencies stored too.
    fs::create_dir(path("old")).unwrap();
    fs::copy(path("new/config.json"), path("old/config.json")).unwrap();
    let new = SafetensorsFile::open(&path("new/model.safetensors")).unwrap();
    let mut tensors: Vec<(String, Tensor)> = new
        .names()
        .into_iter()
        .map(|name| {
            let tensor = new.tensor(&name, DType::F32).unwrap();
            (name, tensor)
        })
        .collect();
    let buffers: Vec<String> = (0..2)
        .map(|layer| format!("model.layers.{layer}.self_attn.rotary_emb.inv_freq"))
        .collect();
    for name in &buffers {
        let values: Vec<f32> = (0..8).map(|_| rng.random_range(0.0..1.0)).collect();
        tensors.push((name.clone(), Tensor::from_vec(values, [8]).unwrap()));
    }
    write_safetensors(&path("old/model.safetensors"), &tensors, None).unwrap();

    let tokens = path("tokens.safetensors");
    let batch = random_tokens(test, 1, 6);
    write_safetensors(&tokens, &[("tokens".to_string(), batch)], None).unwrap();
    let (_, quiet) = succeeds(&eval(s(&path("new")), &tokens, &path("new.out")));
    assert!(!quiet.contains("note:"), "{quiet}");
    let (_, stderr) = succeeds(&eval(s(&path("old")), &tokens, &path("old.out")));
    for part in [
        "note:",
        "transformers ignores too",
        &buffers[0],
        &buffers[1],
    ] {
        assert!(stderr.contains(part), "expected `{part}` in: {stderr}");
    }
    let logits = |out: &str| {
        let file = SafetensorsFile::open(&path(out)).unwrap();
        let values = file.tensor("logits", DType::F32).unwrap();
        values.to_vec::<f32>().unwrap()
    };
    let (a, b) = (logits("new.out"), logits("old.out"));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}
