//! What `kiln` writes never replaces anything: `eval --out`, `plan --out` and the files of
//! `init-model --out` refuse an existing path (a dangling symbolic link included) with an error
//! naming it, two runs racing for one path leave one result and one refusal, and a run stopped
//! by SIGTERM or SIGINT leaves no temporary file behind.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use kiln_frontend::hf::safetensors_io::{write_safetensors, SafetensorsFile};
use kiln_kernels::testing::rng;
use kiln_runtime::Tensor;
use rand::Rng;

fn kiln(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
    command.args(args);
    command
}

fn run(args: &[&str]) -> Output {
    kiln(args).output().expect("run kiln")
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The names in `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Checks `out` failed, refusing `path` as already existing.
#[track_caller]
fn refuses(out: &Output, path: &Path) {
    assert!(!out.status.success(), "kiln should have refused {path:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for part in [s(path), "already exists", "never replaces"] {
        assert!(stderr.contains(part), "expected `{part}` in: {stderr}");
    }
}

/// Random token ids of the tiny preset (vocabulary 97), [2, 8].
fn write_tokens(path: &Path, test: &str) {
    let mut rng = rng(test);
    let ids: Vec<i64> = (0..16).map(|_| rng.random_range(0..97)).collect();
    let tokens = Tensor::from_vec(ids, [2, 8]).unwrap();
    write_safetensors(path, &[("tokens".to_string(), tokens)], None).unwrap();
}

#[test]
fn a_dangling_symbolic_link_at_any_output_is_kept() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let tokens = dir.join("tokens.safetensors");
    write_tokens(&tokens, "a_dangling_symbolic_link_at_any_output_is_kept");
    let nowhere = dir.join("nowhere");

    let out = dir.join("eval.safetensors");
    symlink(&nowhere, &out).unwrap();
    let args = ["eval", "--model", "tiny", "--tokens", s(&tokens), "--out"];
    refuses(&run(&[&args[..], &[s(&out)]].concat()), &out);

    let plan = dir.join("plan.json");
    symlink(&nowhere, &plan).unwrap();
    let args = ["plan", "--model", "tiny", "--program", "decode"];
    let args = [&args[..], &["--format", "json", "--out", s(&plan)]].concat();
    refuses(&run(&args), &plan);

    let model = dir.join("model");
    fs::create_dir(&model).unwrap();
    let config = model.join("config.json");
    symlink(&nowhere, &config).unwrap();
    refuses(
        &run(&["init-model", "--preset", "tiny", "--out", s(&model)]),
        &config,
    );
    assert_eq!(listing(&model), ["config.json"], "no weights written");

    for link in [&out, &plan, &config] {
        assert_eq!(fs::read_link(link).unwrap(), nowhere);
    }
    assert!(!nowhere.exists(), "nothing written through a link");
    assert_eq!(
        listing(dir),
        [
            "eval.safetensors",
            "model",
            "plan.json",
            "tokens.safetensors"
        ]
    );
}

#[test]
fn two_evals_racing_for_one_output_leave_one_result_and_one_refusal() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let tokens = dir.join("tokens.safetensors");
    write_tokens(&tokens, "two_evals_racing_for_one_output");
    let out = dir.join("out.safetensors");
    let args = [
        "eval",
        "--model",
        "tiny",
        "--tokens",
        s(&tokens),
        "--out",
        s(&out),
        "--grads",
    ];
    let spawn = || {
        kiln(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let results = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    let won: Vec<&Output> = results.iter().filter(|r| r.status.success()).collect();
    let lost: Vec<&Output> = results.iter().filter(|r| !r.status.success()).collect();
    assert_eq!(won.len(), 1, "exactly one run publishes the file");
    refuses(lost[0], &out);
    let file = SafetensorsFile::open(&out).unwrap();
    assert_eq!(file.info("logits").unwrap().1, vec![2, 8, 97]);
    assert_eq!(listing(dir), ["out.safetensors", "tokens.safetensors"]);
}

/// Waits for `child` until `deadline`; kills it and fails past that.
fn wait_until(child: &mut Child, deadline: Instant, what: &str) -> ExitStatus {
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what}: still running at the deadline");
        }
        sleep(Duration::from_millis(10));
    }
}

/// Starts writing the 0.5B preset (about 1 GB) into a fresh directory, sends `signal` once the
/// temporary weights file exists, and checks the exit status and that nothing is left. Returns
/// `false` (skipped) where it cannot be done here.
fn interrupted_write_leaves_nothing(signal: &str, status: i32) -> bool {
    if Command::new("kill").arg("-l").output().is_err() {
        eprintln!("skipped: no `kill` command to send {signal}");
        return false;
    }
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path().join("qwen");
    let mut child = kiln(&["init-model", "--preset", "qwen2.5-0.5b", "--out", s(&dir)])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let is_temp = |name: &str| name.starts_with(".model.safetensors.tmp-");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        if dir.is_dir() && listing(&dir).iter().any(|n| is_temp(n)) {
            break;
        }
        if let Some(done) = child.try_wait().unwrap() {
            assert!(done.success(), "init-model failed before writing: {done}");
            eprintln!("skipped: init-model finished before its temporary file was seen");
            return false;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("init-model wrote no temporary file within 300 s");
        }
        sleep(Duration::from_millis(5));
    }
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} failed");
    let exit = wait_until(
        &mut child,
        Instant::now() + Duration::from_secs(60),
        "after the signal",
    );
    assert_eq!(exit.code(), Some(status), "{signal}: {exit}");
    let left = listing(&dir);
    assert!(
        left.iter()
            .all(|n| !n.contains(".tmp-") && n != "model.safetensors"),
        "{signal} left {left:?}"
    );
    true
}

#[test]
fn a_write_stopped_by_sigterm_or_sigint_leaves_no_temporary_file() {
    if interrupted_write_leaves_nothing("TERM", 143) {
        interrupted_write_leaves_nothing("INT", 130);
    }
}
