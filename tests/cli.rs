//! The `kiln` command line, run as a user runs it.

use std::process::Command;

fn kiln(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

#[test]
fn demo_reports_loss_and_gradient_norms() {
    let out = kiln(&["demo", "--seed", "3", "--batch", "2", "--seq", "8"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("loss "), "{text}");
    assert!(
        text.contains("model.layers.1.mlp.down_proj.weight"),
        "{text}"
    );
    assert!(text.contains("total"), "{text}");
}

#[test]
fn demo_is_reproducible_and_sane() {
    let a = kiln::demo::run(5, 2, 6).unwrap();
    let b = kiln::demo::run(5, 2, 6).unwrap();
    assert_eq!(a.loss.to_bits(), b.loss.to_bits(), "same seed, same bits");
    // A freshly initialized model predicts near-uniformly: loss close to ln(vocab).
    let uniform = (97f64).ln();
    assert!(
        (a.loss - uniform).abs() < 0.5,
        "loss {} vs ln V {uniform}",
        a.loss
    );
    assert!(
        a.grad_norms.iter().all(|(_, n)| n.is_finite() && *n > 0.0),
        "{:?}",
        a.grad_norms
    );
}

#[test]
fn demo_rejects_bad_arguments() {
    let out = kiln(&["demo", "--seq", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--seq >= 2"));
    let out = kiln(&["demo", "--seq", "4096"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("beyond the model's 128 positions"));
}

/// `kiln cache fill` refuses an architecture it cannot name a compiler for, before it
/// compiles or writes anything (filling for real: runtime/tests/kernel_cache.rs).
#[test]
fn cache_fill_refuses_an_unknown_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["cache", "fill", "--arch", "sm90"])
        .env("KILN_CACHE_DIR", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("architecture `sm90`"), "{stderr}");
    assert!(!dir.path().join("kernels").exists());
}

/// `kiln cache info|clear` on the cache `KILN_CACHE_DIR` names: entries are counted and removed,
/// and nothing else in the directory is touched.
#[test]
fn cache_info_counts_entries_and_clear_removes_only_them() {
    let dir = tempfile::tempdir().unwrap();
    let kernels = dir.path().join("kernels");
    std::fs::create_dir_all(&kernels).unwrap();
    std::fs::write(kernels.join("copy-00.kcubin"), [7u8; 100]).unwrap();
    std::fs::write(kernels.join("norm-01.kcubin"), [7u8; 28]).unwrap();
    std::fs::write(kernels.join("notes.txt"), "not an entry").unwrap();
    let cache = |action: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["cache", action])
            .env("KILN_CACHE_DIR", dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(
        cache("info").contains("2 entries, 128 bytes"),
        "{}",
        cache("info")
    );
    assert!(cache("clear").contains("removed 2 entries"));
    assert!(cache("info").contains("0 entries, 0 bytes"));
    assert!(kernels.join("notes.txt").exists());
}

/// `kiln plan --by launches`: the launches of the tiny bf16 decode step, lowered without a
/// device, add up by op and by launch to the total; a CPU plan or a CSV dump is refused.
#[test]
fn plan_by_launches_counts_every_launch() {
    let args = [
        "plan",
        "--model",
        "tiny",
        "--program",
        "decode",
        "--precision",
        "bf16",
        "--by",
        "launches",
    ];
    let out = kiln(&[&args[..], &["--backend", "cuda", "--format", "json"]].concat());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let table: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let count = |key: &str| table[key].as_u64().unwrap();
    let total = count("launches");
    let parts = ["kernels", "gemms", "copies", "collectives"];
    assert_eq!(total, parts.iter().map(|k| count(k)).sum::<u64>());
    let column = |key: &str| -> u64 {
        let rows = table[key].as_array().unwrap();
        rows.iter().map(|r| r["launches"].as_u64().unwrap()).sum()
    };
    assert_eq!(column("by_op"), total);
    assert_eq!(column("by_launch"), total);
    // Each decode layer's q/k/v linear (RoPE and the cache writes its epilogue, finished by
    // linear_reduce_rope at two rows) and attention launch.
    let ops = table["by_op"].as_array().unwrap();
    for op in ["linear", "cached_attention"] {
        assert!(
            ops.iter()
                .any(|r| r["op"] == op && r["steps"].as_u64() > Some(0)),
            "{op}: {table}"
        );
    }
    let launches = table["by_launch"].as_array().unwrap();
    let reduce_rope = |r: &&serde_json::Value| r["launch"] == "linear.linear_reduce_rope";
    let layers = launches
        .iter()
        .find(reduce_rope)
        .map(|r| r["launches"].as_u64());
    assert_eq!(layers, Some(Some(2)), "{table}");

    let text = kiln(&[&args[..], &["--backend", "any", "--verify"]].concat());
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(text.status.success(), "{stderr}");
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains(&format!(
            "run on a CUDA device (lowered here, with the defaults of an sm_90 device): {total}"
        )),
        "{text}"
    );
    assert!(text.contains("verified: "), "{text}");

    let cpu = kiln(&[&args[..], &["--backend", "cpu"]].concat());
    assert!(!cpu.status.success());
    assert!(String::from_utf8_lossy(&cpu.stderr).contains("--backend cuda or any"));
    let csv = kiln(&[&args[..], &["--format", "csv"]].concat());
    assert!(!csv.status.success());
    assert!(String::from_utf8_lossy(&csv.stderr).contains("text or json"));
}

/// The launches of Qwen2.5-0.5B's bf16 decode (B=1) and prefill (T=512) steps by op and by
/// kernel, as `kiln plan --by launches` lists them (issue 11 counts them against a target;
/// reviewed like code).
#[test]
fn official_inference_launches_snapshot() {
    for (program, shape) in [("decode", "--batch=1"), ("prefill", "--seq=512")] {
        let out = kiln(&[
            "plan",
            "--model",
            "qwen2.5-0.5b",
            "--program",
            program,
            shape,
            "--precision",
            "bf16",
            "--backend",
            "cuda",
            "--by",
            "launches",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        let text = String::from_utf8(out.stdout).unwrap();
        insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
            insta::assert_snapshot!(format!("launches_qwen2_5_0_5b_{program}_bf16"), text);
        });
    }
}
