//! `kiln train` and `kiln tokenize` from the command line: a run lowers the loss; a run
//! resumed from a checkpoint continues bit for bit; a run killed at any moment (`kill -9`,
//! saves included) resumes from its newest complete checkpoint and ends where an uninterrupted
//! run ends; bad input is refused before training, naming the problem; text to a trained
//! model in two commands.

#[path = "support/tokenized_model.rs"]
mod tokenized_model;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use kiln_frontend::hf::source::ModelSource;
use kiln_ir::DType;
use kiln_trainer::checkpoint;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run kiln")
}

#[track_caller]
fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "kiln failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[track_caller]
fn refused(out: &Output, fragments: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "kiln succeeded: {stderr}");
    for fragment in fragments {
        assert!(stderr.contains(fragment), "`{fragment}` not in: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A flat u16 file of `n` ids below 97 (the tiny preset's vocabulary) with a pattern a model
/// can learn: each id follows from the one before it, with a slow drift.
fn pattern_data(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("data.bin");
    let ids = (0..n).map(|i| ((i * 7 + i / 13) % 97) as u16);
    std::fs::write(&path, ids.flat_map(u16::to_le_bytes).collect::<Vec<u8>>()).unwrap();
    path
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The metrics file's lines of steps after `after`, without their wall-clock seconds.
fn steps_after(run: &Path, after: u64) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    (text.lines())
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .filter(|v| v["step"].as_u64().unwrap() > after)
        .map(|mut v| {
            v.as_object_mut().unwrap().remove("seconds");
            v
        })
        .collect()
}

/// Options of a small run: clipped, warmed up, validated every 4 steps.
fn run_args<'a>(
    data: &'a Path,
    out: &'a Path,
    steps: &'a str,
    save_every: &'a str,
) -> Vec<&'a str> {
    vec![
        "train",
        "--model",
        "tiny",
        "--data",
        s(data),
        "--steps",
        steps,
        "--batch",
        "2",
        "--seq",
        "12",
        "--lr",
        "3e-3",
        "--warmup",
        "3",
        "--clip-grad-norm",
        "1.0",
        "--val-every",
        "4",
        "--save-every",
        save_every,
        "--keep",
        "100",
        "--out",
        s(out),
    ]
}

#[test]
fn a_run_lowers_the_loss_and_writes_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern_data(dir.path(), 4000);
    let run = dir.path().join("run");
    ok(&kiln(&run_args(&data, &run, "40", "20")));
    let steps = steps_after(&run, 0);
    let losses: Vec<f64> = (steps.iter())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect();
    assert_eq!(losses.len(), 40);
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    assert!(mean(&losses[35..]) < 0.8 * mean(&losses[..5]), "{losses:?}");
    // The first step runs at rate 0 (warmup from 0, as transformers' schedules), the fourth at
    // the peak; every clipped step reports its norm.
    assert_eq!(steps[0]["lr"].as_f64(), Some(0.0));
    assert_eq!(
        steps.iter().find(|v| v["step"] == 4).unwrap()["lr"].as_f64(),
        Some(3e-3)
    );
    assert!(steps
        .iter()
        .filter(|v| v.get("loss").is_some())
        .all(|v| v["grad_norm"].is_f64()));
    let validations = steps.iter().filter(|v| v.get("val_loss").is_some()).count();
    assert_eq!(validations, 10);
    let names: Vec<String> = (checkpoint::list(&run).unwrap().into_iter())
        .map(|(step, _)| checkpoint::dir_name(step))
        .collect();
    assert_eq!(names, ["step-000020", "step-000040"]);
    let svg = std::fs::read_to_string(run.join("loss.svg")).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("validation loss") && svg.contains("<polyline")
    );
    // A checkpoint is a model directory kiln loads, its weights those the run ended with.
    let last = run.join("step-000040");
    let (config, loaded) = ModelSource::Dir(last.clone()).load(0, DType::F32).unwrap();
    assert_eq!(config.vocab_size, 97);
    let state = checkpoint::read_state(&last).unwrap();
    assert_eq!(state.step, 40);
    let (_, initial) = ModelSource::Preset("tiny".into())
        .load(0, DType::F32)
        .unwrap();
    let first = |w: &kiln_frontend::model::ModelWeights<kiln_frontend::Var>| {
        w.named()[0].1.value().to_vec::<f32>().unwrap()
    };
    assert_ne!(first(&loaded.weights), first(&initial.weights));
}

/// `tools/golden/train_golden.py`: 20 steps of transformers' Qwen2 with torch.optim.AdamW,
/// clipping, decay exemptions and a cosine schedule with warmup, in float64. kiln's f32 run
/// (CPU) matches its loss at every step within 1e-4 relative, its rates exactly, its gradient
/// norms within 1e-4 and its final weights within 1e-3 (relative to weights above 1).
#[test]
fn losses_and_weights_match_transformers_and_torch_adamw_in_float64() {
    let golden_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/train_qwen2");
    let options: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir.join("train.json")).unwrap())
            .unwrap();
    let get = |key: &str| options[key].to_string();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let data = golden_dir.join("data.bin");
    let steps = get("steps");
    ok(&kiln(&[
        "train",
        "--model",
        s(&golden_dir),
        "--data",
        s(&data),
        "--steps",
        &steps,
        "--batch",
        &get("batch"),
        "--seq",
        &get("seq"),
        "--lr",
        &get("lr"),
        "--warmup",
        &get("warmup"),
        "--clip-grad-norm",
        &get("clip_grad_norm"),
        "--weight-decay",
        &get("weight_decay"),
        "--beta1",
        &get("beta1"),
        "--beta2",
        &get("beta2"),
        "--eps",
        &get("eps"),
        "--sampling",
        "sequential",
        "--val-fraction",
        "0",
        "--val-every",
        "0",
        "--out",
        s(&run),
    ]));
    let golden = kiln_frontend::hf::safetensors_io::SafetensorsFile::open(
        &golden_dir.join("golden.safetensors"),
    )
    .unwrap();
    let column = |name: &str| {
        golden
            .tensor(name, DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap()
    };
    let (losses, rates, norms) = (column("loss"), column("lr"), column("grad_norm"));
    let rows = steps_after(&run, 0);
    assert_eq!(rows.len(), losses.len());
    for (k, row) in rows.iter().enumerate() {
        let rel = |key: &str, want: f64| (row[key].as_f64().unwrap() - want).abs() / want.abs();
        assert!(
            rel("loss", losses[k]) < 1e-4,
            "step {}: {row} vs loss {}",
            k + 1,
            losses[k]
        );
        assert!(
            rel("grad_norm", norms[k]) < 1e-4,
            "step {}: {row} vs norm {}",
            k + 1,
            norms[k]
        );
        assert!(
            (row["lr"].as_f64().unwrap() - rates[k]).abs() <= 1e-18,
            "step {}: {row}",
            k + 1
        );
    }
    let last = run.join(checkpoint::dir_name(losses.len() as u64));
    let (_, loaded) = ModelSource::Dir(last).load(0, DType::F32).unwrap();
    let mut checked = 0;
    for (name, var) in loaded.weights.named() {
        let got = var.value().to_f64_vec().unwrap();
        let want = column(&format!("final.{name}"));
        let worst = (got.iter().zip(&want))
            .map(|(g, w)| (g - w).abs() / w.abs().max(1.0))
            .fold(0.0, f64::max);
        assert!(worst < 1e-3, "{name}: {worst:e}");
        checked += 1;
    }
    assert_eq!(
        checked,
        golden.names().len() - 3,
        "every parameter compared"
    );
}

#[test]
fn a_resumed_run_continues_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern_data(dir.path(), 3000);
    let (whole, resumed) = (dir.path().join("whole"), dir.path().join("resumed"));
    ok(&kiln(&run_args(&data, &whole, "16", "6")));
    // Resumed from step 6 into a new directory, and from step 12 in place (a copy).
    let checkpoint6 = whole.join("step-000006");
    ok(&kiln(&[
        "train",
        "--resume",
        s(&checkpoint6),
        "--out",
        s(&resumed),
    ]));
    assert_eq!(steps_after(&resumed, 0), steps_after(&whole, 6));
    let in_place = dir.path().join("in-place");
    std::fs::create_dir(&in_place).unwrap();
    std::fs::rename(whole.join("step-000012"), in_place.join("step-000012")).unwrap();
    std::fs::copy(whole.join("metrics.jsonl"), in_place.join("metrics.jsonl")).unwrap();
    // A run directory is one kiln train made: without its marker, a resume in place is refused.
    let refused_here = kiln(&["train", "--resume", s(&in_place)]);
    refused(&refused_here, &["was not made by kiln train", "--out"]);
    std::fs::copy(whole.join("kiln-run.json"), in_place.join("kiln-run.json")).unwrap();
    ok(&kiln(&["train", "--resume", s(&in_place)]));
    // In place from an older checkpoint, the later ones would clash: refused.
    let older = whole.join("step-000006");
    refused(
        &kiln(&["train", "--resume", s(&older)]),
        &["later checkpoints", "[16]"],
    );
    assert_eq!(steps_after(&in_place, 0), steps_after(&whole, 0));
    for run in [&resumed, &in_place] {
        for file in ["model.safetensors", "optimizer.safetensors"] {
            let read = |r: &Path| std::fs::read(r.join("step-000016").join(file)).unwrap();
            assert!(read(run) == read(&whole), "{file} of {}", run.display());
        }
    }
}

/// Gradient accumulation over micro-batches equals one batch of all their rows, to f32
/// rounding (the sums run in another order): sequential windows make the rows the same.
#[test]
fn accumulated_micro_batches_equal_one_batch_of_their_rows() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern_data(dir.path(), 3000);
    for micro in ["2", "3"] {
        let run = |batch: &str, accumulate: &str| {
            let out = dir.path().join(format!("b{batch}-a{accumulate}"));
            ok(&kiln(&[
                "train",
                "--model",
                "tiny",
                "--data",
                s(&data),
                "--steps",
                "6",
                "--batch",
                batch,
                "--accumulate",
                accumulate,
                "--seq",
                "12",
                "--lr",
                "3e-3",
                "--clip-grad-norm",
                "0.5",
                "--sampling",
                "sequential",
                "--val-every",
                "0",
                "--out",
                s(&out),
            ]));
            steps_after(&out, 0)
        };
        let (accumulated, whole) = (run("1", micro), run(micro, "1"));
        for (a, w) in accumulated.iter().zip(&whole) {
            for key in ["loss", "grad_norm"] {
                let (a, w) = (a[key].as_f64().unwrap(), w[key].as_f64().unwrap());
                assert!(
                    (a - w).abs() <= 2e-5 * w.abs(),
                    "{micro} micro-batches, {key}: {a} vs {w}"
                );
            }
            assert_eq!(a["tokens"], w["tokens"]);
        }
        assert_ne!(
            accumulated, whole,
            "the sums differ in rounding at least once"
        );
    }
}

/// Every checkpoint directory of `run` is whole: its state, weights and moments load.
fn assert_checkpoints_whole(run: &Path) -> u64 {
    let all = checkpoint::list(run).unwrap();
    for (step, dir) in &all {
        let state = checkpoint::read_state(dir).unwrap();
        assert_eq!(state.step, *step);
        let (_, loaded) = ModelSource::Dir(dir.clone()).load(0, DType::F32).unwrap();
        let shapes: Vec<(String, Vec<usize>)> = (loaded.weights.named().into_iter())
            .map(|(n, v)| (n, v.dims().to_vec()))
            .collect();
        checkpoint::read_moments(dir, &shapes).unwrap();
    }
    all.last().map_or(0, |(step, _)| *step)
}

#[test]
fn a_run_killed_at_any_moment_resumes_from_its_newest_whole_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern_data(dir.path(), 3000);
    let whole = dir.path().join("whole");
    ok(&kiln(&run_args(&data, &whole, "60", "1")));
    for (k, delay_ms) in [40u64, 110, 230].into_iter().enumerate() {
        let run = dir.path().join(format!("killed-{k}"));
        let mut child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(run_args(&data, &run, "60", "1"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let newest = assert_checkpoints_whole(&run);
        eprintln!("killed after {delay_ms} ms: newest whole checkpoint at step {newest}");
        if newest == 0 {
            continue; // killed before its first save: nothing to resume
        }
        ok(&kiln(&["train", "--resume", s(&run)]));
        assert_checkpoints_whole(&run);
        assert_eq!(
            steps_after(&run, 0),
            steps_after(&whole, 0),
            "killed after {delay_ms} ms"
        );
        let leftovers: Vec<_> = (std::fs::read_dir(&run).unwrap())
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }
}

/// Ctrl-C (SIGINT) stops a run at the next step boundary with a checkpoint of that step; the
/// exit is a success that says where it stopped, and the run resumes from there.
#[test]
fn ctrl_c_stops_at_a_step_and_saves_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern_data(dir.path(), 3000);
    let run = dir.path().join("run");
    let child = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(run_args(&data, &run, "100000", "0"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the first steps, then interrupt.
    let metrics = run.join("metrics.jsonl");
    for _ in 0..200 {
        if std::fs::read_to_string(&metrics).is_ok_and(|m| m.lines().count() > 3) {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let pid = child.id().to_string();
    let signalled = Command::new("kill").args(["-INT", &pid]).status().unwrap();
    assert!(signalled.success());
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.starts_with("stopped at step"),
        "{said}"
    );
    let newest = assert_checkpoints_whole(&run);
    assert!(newest > 0 && newest < 100000, "{newest}");
    assert!(said.contains(&checkpoint::dir_name(newest)), "{said}");
    let steps = steps_after(&run, 0);
    let last = steps
        .iter()
        .filter_map(|v| v.get("loss").map(|_| v["step"].as_u64().unwrap()))
        .max();
    assert_eq!(
        last,
        Some(newest),
        "the last step recorded is the one saved"
    );
}

#[test]
fn bad_input_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let data = pattern_data(dir.path(), 400);
    let run = dir.path().join("run");
    // A file shorter than one window.
    let short = pattern_data(&dir.path().join("short").tap_dir(), 10);
    let out = kiln(&[
        "train",
        "--model",
        "tiny",
        "--data",
        s(&short),
        "--steps",
        "2",
        "--seq",
        "16",
        "--out",
        s(&run),
        "--val-fraction",
        "0",
    ]);
    refused(
        &out,
        &["data file", "fewer than one window of --seq 16 + 1 = 17"],
    );
    // An id outside the vocabulary.
    let wide = dir.path().join("wide.bin");
    std::fs::write(&wide, [1u8, 0, 200, 0, 3, 0]).unwrap();
    let out = kiln(&[
        "train",
        "--model",
        "tiny",
        "--data",
        s(&wide),
        "--steps",
        "2",
        "--out",
        s(&run),
    ]);
    refused(&out, &["token 1 is 200", "vocabulary of 97"]);
    // A directory that holds files is never written into.
    let taken = dir.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("notes.txt"), "mine").unwrap();
    let out = kiln(&[
        "train",
        "--model",
        "tiny",
        "--data",
        s(&data),
        "--steps",
        "2",
        "--out",
        s(&taken),
    ]);
    refused(&out, &["not empty", "--resume"]);
    assert_eq!(
        std::fs::read_to_string(taken.join("notes.txt")).unwrap(),
        "mine"
    );
    // A resume refuses a missing optimizer file, moments of another model, other data, and
    // changed options.
    let good = dir.path().join("good");
    ok(&kiln(&[
        "train",
        "--model",
        "tiny",
        "--data",
        s(&data),
        "--steps",
        "2",
        "--batch",
        "2",
        "--seq",
        "8",
        "--val-every",
        "0",
        "--out",
        s(&good),
    ]));
    let checkpoint = good.join("step-000002");
    let broken = dir.path().join("broken");
    copy_dir(&checkpoint, &broken);
    std::fs::remove_file(broken.join("optimizer.safetensors")).unwrap();
    refused(
        &kiln(&[
            "train",
            "--resume",
            s(&broken),
            "--out",
            s(&dir.path().join("o1")),
        ]),
        &["optimizer.safetensors", "no optimizer state"],
    );
    let other_model = dir.path().join("other-model");
    let golden_model = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/qwen2_gqa_bias");
    let other_data = dir.path().join("other.bin");
    std::fs::write(
        &other_data,
        (0..400u16)
            .map(|i| i % 61)
            .flat_map(u16::to_le_bytes)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    ok(&kiln(&[
        "train",
        "--model",
        s(&golden_model),
        "--data",
        s(&other_data),
        "--steps",
        "1",
        "--batch",
        "1",
        "--seq",
        "8",
        "--val-every",
        "0",
        "--out",
        s(&other_model),
    ]));
    copy_dir(&checkpoint, &broken.tap_clear());
    std::fs::copy(
        other_model.join("step-000001/optimizer.safetensors"),
        broken.join("optimizer.safetensors"),
    )
    .unwrap();
    refused(
        &kiln(&[
            "train",
            "--resume",
            s(&broken),
            "--out",
            s(&dir.path().join("o2")),
        ]),
        &["optimizer.safetensors", "adamw.m.model.embed_tokens.weight"],
    );
    refused(
        &kiln(&[
            "train",
            "--resume",
            s(&checkpoint),
            "--data",
            s(&other_data),
            "--out",
            s(&dir.path().join("o3")),
        ]),
        &["not the 400 tokens the checkpoint trained on"],
    );
    refused(
        &kiln(&["train", "--resume", s(&checkpoint), "--lr", "1"]),
        &["--lr", "--resume"],
    );
    refused(
        &kiln(&["train", "--resume", s(&dir.path().join("nothing"))]),
        &["--resume", "No such file"],
    );
}

#[test]
fn text_to_a_trained_model_in_two_commands() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    tokenized_model::tokenized_tiny_model(&model, 3);
    let corpus = dir.path().join("corpus.txt");
    let text = "the potter fires the glazed pots in the kiln\n".repeat(200);
    std::fs::write(&corpus, &text).unwrap();
    let data = dir.path().join("data.bin");
    let said = ok(&kiln(&[
        "tokenize",
        "--tokenizer",
        s(&model),
        "--in",
        s(&corpus),
        "--out",
        s(&data),
    ]));
    assert!(said.contains("u16"), "{said}");
    let ids = std::fs::metadata(&data).unwrap().len() / 2;
    assert!(ids > 200, "{ids} tokens for 200 lines");
    refused(
        &kiln(&[
            "tokenize",
            "--tokenizer",
            s(&model),
            "--in",
            s(&corpus),
            "--out",
            s(&data),
        ]),
        &["already exists"],
    );
    let run = dir.path().join("run");
    ok(&kiln(&[
        "train",
        "--model",
        s(&model),
        "--data",
        s(&data),
        "--steps",
        "30",
        "--batch",
        "2",
        "--seq",
        "16",
        "--lr",
        "3e-3",
        "--val-every",
        "10",
        "--out",
        s(&run),
    ]));
    let losses: Vec<f64> = (steps_after(&run, 0).iter())
        .filter_map(|v| v.get("loss").and_then(|l| l.as_f64()))
        .collect();
    assert!(losses[29] < 0.5 * losses[0], "{losses:?}");
    // The checkpoint carries the tokenizer along: it is a model directory to generate from.
    assert!(run.join("step-000030/tokenizer.json").is_file());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

/// Small path helpers for the tests above.
trait PathTap {
    /// Creates the directory and returns it.
    fn tap_dir(&self) -> PathBuf;
    /// Removes the directory if it exists and returns it.
    fn tap_clear(&self) -> PathBuf;
}

impl PathTap for PathBuf {
    fn tap_dir(&self) -> PathBuf {
        std::fs::create_dir_all(self).unwrap();
        self.clone()
    }

    fn tap_clear(&self) -> PathBuf {
        let _ = std::fs::remove_dir_all(self);
        self.clone()
    }
}
