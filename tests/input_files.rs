//! What `kiln eval` reads, run as a user runs it: a FIFO as the tokens file is refused at once.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

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
