//! `kiln launch` from the command line: the environment each rank gets, a failing rank
//! stopping the others, signals passed on, and `kiln train` refusing what a launch cannot run
//! here (CPU ranks; a build without NCCL) before it writes anything.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn launch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("launch")
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .env("NCCL_NVLS_ENABLE", "1")
        .output()
        .expect("run kiln launch")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `kiln launch --nproc 3 -- sh -c SCRIPT DIR`: each rank runs `script` with `$0` = `dir`.
fn launch_script(script: &str, dir: &Path) -> Output {
    launch(&[
        "--nproc",
        "3",
        "--",
        "sh",
        "-c",
        script,
        dir.to_str().unwrap(),
    ])
}

#[test]
fn every_rank_gets_its_rank_one_rendezvous_and_nvls_off() {
    let dir = tempfile::tempdir().unwrap();
    let script = "echo $KILN_RANK $KILN_WORLD_SIZE $KILN_LOCAL_RANK $NCCL_NVLS_ENABLE \
                  $KILN_RENDEZVOUS $KILN_RENDEZVOUS_DEADLINE > \"$0/rank$KILN_RANK\"";
    let out = launch_script(script, dir.path());
    assert!(out.status.success(), "{}", stderr(&out));
    let mut rendezvous = Vec::new();
    for rank in 0..3 {
        let line = std::fs::read_to_string(dir.path().join(format!("rank{rank}"))).unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        // NVLink multicast off although the caller's environment turned it on.
        assert_eq!(
            words[..4],
            [rank.to_string().as_str(), "3", &rank.to_string(), "0"]
        );
        rendezvous.push(words[4].to_string());
        let deadline: u64 = words[5].parse().unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap();
        assert!(
            deadline > now.as_secs() && deadline <= now.as_secs() + 301,
            "{deadline}"
        );
    }
    assert!(rendezvous.iter().all(|r| r == &rendezvous[0]));
    // The launcher's rendezvous directory is gone with it.
    assert!(!Path::new(&rendezvous[0]).parent().unwrap().exists());
}

#[test]
fn a_failing_rank_stops_the_others_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // Rank 1 fails at once; the others would run for a minute and then leave a mark.
    let script =
        "if [ $KILN_RANK = 1 ]; then exit 3; fi; sleep 60; touch \"$0/finished$KILN_RANK\"";
    let started = Instant::now();
    let out = launch_script(script, dir.path());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(!out.status.success());
    let error = stderr(&out);
    assert!(
        error.contains("rank 1 of 3 exited with status 3; stopped ranks 0, 2"),
        "{error}"
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn sigterm_to_the_launcher_reaches_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let script = "trap 'touch \"$0/stopped$KILN_RANK\"; exit 0' TERM; \
                  touch \"$0/ready$KILN_RANK\"; while true; do sleep 0.05; done";
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["launch", "--nproc", "2", "--", "sh", "-c", script])
        .arg(dir.path())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ready = |rank: usize| dir.path().join(format!("ready{rank}")).exists();
    let start = Instant::now();
    while !(ready(0) && ready(1)) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the ranks never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signals the launcher this test started.
    unsafe { libc::kill(launcher.id() as i32, libc::SIGTERM) };
    let status = launcher.wait().unwrap();
    // Both ranks stopped the way they chose to (here: cleanly), so the launch succeeded.
    assert!(status.success(), "{status:?}");
    for rank in 0..2 {
        assert!(
            dir.path().join(format!("stopped{rank}")).exists(),
            "rank {rank}"
        );
    }
}

#[test]
fn bad_launches_are_refused_with_the_reason() {
    let out = launch(&["--nproc", "0", "--", "true"]);
    assert!(
        stderr(&out).contains("--nproc 0: must be 1 to 64"),
        "{}",
        stderr(&out)
    );
    let out = launch(&["--nproc", "2", "--", "/nonexistent/kiln-rank"]);
    assert!(
        stderr(&out).contains("starting rank 0: /nonexistent/kiln-rank"),
        "{}",
        stderr(&out)
    );
    let out = launch(&["--nproc", "2"]);
    assert!(!out.status.success());
    let out = launch(&["--nproc", "2", "--", "kiln", "demo"]);
    let error = stderr(&out);
    assert!(
        error.contains("under `kiln launch` kiln runs `train`"),
        "{error}"
    );
}

#[test]
fn launched_training_refuses_cpu_ranks_and_a_build_without_nccl_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("tokens.bin");
    let ids: Vec<u8> = (0..4000u16).flat_map(|i| (i % 97).to_le_bytes()).collect();
    std::fs::write(&data, ids).unwrap();
    let out_dir = dir.path().join("run");
    let train = |device: &str| {
        launch(&[
            "--nproc",
            "2",
            "--",
            "kiln",
            "train",
            "--model",
            "tiny",
            "--data",
            data.to_str().unwrap(),
            "--steps",
            "2",
            "--batch",
            "2",
            "--seq",
            "8",
            "--device",
            device,
            "--out",
            out_dir.to_str().unwrap(),
        ])
    };
    let out = train("cpu");
    assert!(!out.status.success());
    let error = stderr(&out);
    assert!(
        error.contains("`kiln launch` runs one rank per GPU; pass --device cuda"),
        "{error}"
    );
    assert!(
        !out_dir.exists(),
        "a refused launch wrote {}",
        out_dir.display()
    );
    if !cfg!(feature = "nccl") {
        let out = train("cuda");
        let error = stderr(&out);
        assert!(
            error.contains("this kiln was built without NCCL"),
            "{error}"
        );
    }
}
