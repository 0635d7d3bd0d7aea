//! Sizes from flags and configs that no run can have, refused by the `kiln` binary with the
//! flag, the number and the limit: a clean exit 1, not a panic, an abort, a hang or an
//! allocation sized by the flag. Each run gets a 60 s limit and 512 MiB of address space.

use std::path::Path;
use std::process::{Command, Output};

use kiln_frontend::hf::config::config_json;
use kiln_frontend::hf::safetensors_io::write_safetensors;
use kiln_frontend::model::ModelConfig;
use kiln_ir::DType;
use kiln_runtime::Tensor;
use serde_json::{json, Value};

/// Runs kiln under `ulimit -v` and `timeout`, so an allocation or a loop sized by a flag fails
/// the test instead of the machine.
fn kiln(args: &[&str]) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(r#"ulimit -v 524288 && exec timeout 60 "$@""#)
        .arg("sh")
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .output()
        .expect("run kiln")
}

/// Asserts a clean refusal: exit status 1 and `message` on stderr, with no panic.
#[track_caller]
fn refused(args: &[&str], message: &str) {
    let out = kiln(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "kiln {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "kiln {args:?}: {stderr}");
    assert!(
        stderr.contains(message),
        "kiln {args:?}: expected `{message}` in:\n{stderr}"
    );
}

#[track_caller]
fn succeeds(args: &[&str]) -> String {
    let out = kiln(args);
    assert!(
        out.status.success(),
        "kiln {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

const BEYOND: &str = "beyond the model's 128 positions (max_position_embeddings)";

#[test]
fn sizes_that_overflow_are_refused_before_tracing() {
    for program in ["prefill", "train"] {
        let args = ["compile", "--model", "tiny", "--program", program];
        let huge = ["--batch", "4294967296", "--seq", "4294967296"];
        refused(
            &[&args[..], &huge].concat(),
            &format!("--seq 4294967296: {BEYOND}"),
        );
    }
    refused(
        &[
            "compile",
            "--model",
            "tiny",
            "--program",
            "train",
            "--batch",
            "18446744073709551615",
        ],
        "--batch 18446744073709551615: with --seq 16, the program's token ids cannot be built: \
         i64[18446744073709551615,16] is too large: more than 18446744073709551615 elements \
         (usize::MAX)",
    );
    refused(
        &["demo", "--batch", "18446744073709551615"],
        "--batch 18446744073709551615: with --seq 16, the program's token ids cannot be built",
    );
}

#[test]
fn the_demo_checks_its_options_as_every_program_does() {
    refused(&["demo", "--batch", "0"], "--batch 0: must be at least 1");
    refused(&["demo", "--seq", "129"], &format!("--seq 129: {BEYOND}"));
}

#[test]
fn a_demo_larger_than_the_machine_is_refused_before_allocating() {
    refused(
        &["demo", "--batch", "4294967296"],
        "--batch 4294967296 with --seq 16: the demo's eager run needs ",
    );
}

#[test]
fn streams_beyond_the_planner_limit_are_refused_everywhere() {
    let limit = |n: &str| format!("plan option `streams`: {n} is more than the 64 streams");
    for streams in ["4294967296", "18446744073709551615", "65"] {
        let plan = ["plan", "--model", "tiny", "--program", "prefill"];
        refused(
            &[&plan[..], &["--streams", streams]].concat(),
            &limit(streams),
        );
        // Before any device is looked for: the same refusal with or without a GPU.
        let bench = [
            "bench",
            "--model",
            "tiny",
            "--program",
            "train",
            "--seq",
            "8",
        ];
        refused(
            &[&bench[..], &["--streams", streams]].concat(),
            &limit(streams),
        );
    }
    refused(
        &["planner-report", "--streams", "4294967296"],
        &limit("4294967296"),
    );
    succeeds(&[
        "plan",
        "--model",
        "tiny",
        "--program",
        "decode",
        "--streams",
        "64",
    ]);
}

#[test]
fn bench_options_are_checked_before_the_device() {
    let bench = ["bench", "--model", "tiny"];
    refused(
        &[&bench[..], &["--program", "decode"]].concat(),
        &format!("--context 512: {BEYOND}"),
    );
    refused(
        &[
            &bench[..],
            &["--program", "decode", "--context", "100", "--max-seq", "64"],
        ]
        .concat(),
        "--context 100: does not fit a cache of 64 rows; pass --max-seq 101 or more",
    );
    refused(
        &[
            &bench[..],
            &["--program", "prefill", "--seq", "100", "--max-seq", "64"],
        ]
        .concat(),
        "pass --max-seq 100 or more",
    );
    refused(
        &[&bench[..], &["--program", "train", "--batch", "0"]].concat(),
        "--batch 0: must be at least 1",
    );
    refused(
        &[
            &bench[..],
            &["--program", "train", "--profile", "--streams", "2"],
        ]
        .concat(),
        "--profile times each step alone on one stream: pass --streams 1, or leave --streams \
         out (it is then 1)",
    );
    // Taken (and what it needs is looked for) only once the options are valid.
    let tuned = ["--program", "prefill", "--seq", "8", "--gemm-tune", "on"];
    refused(
        &[&bench[..], &tuned, &["--batch", "0"]].concat(),
        "--batch 0: must be at least 1",
    );
}

#[test]
fn the_cache_default_is_one_rule_and_errors_say_which_flag_to_pass() {
    let prefill = ["--model", "tiny", "--program", "prefill", "--seq", "100"];
    let text = succeeds(&[&["compile"][..], &prefill].concat());
    assert!(text.contains("seq 100, cache 100"), "{text}");
    succeeds(&[&["plan"][..], &prefill].concat());
    refused(
        &[&["plan"][..], &prefill, &["--max-seq", "64"]].concat(),
        "--seq 100: does not fit a cache of --max-seq 64 rows; pass --max-seq 100 or more, or \
         leave --max-seq out (prefill's cache then holds --seq rows)",
    );
    // Decode takes one token per row; the default --seq 16 is not its business.
    let decode = ["--model", "tiny", "--program", "decode", "--max-seq", "8"];
    let text = succeeds(&[&["compile"][..], &decode].concat());
    assert!(text.contains("one token per row, cache 8"), "{text}");
    let text = succeeds(&["compile", "--model", "tiny", "--program", "decode"]);
    assert!(text.contains("one token per row, cache 128"), "{text}");
    refused(
        &[
            "compile",
            "--model",
            "tiny",
            "--program",
            "decode",
            "--max-seq",
            "129",
        ],
        &format!("--max-seq 129: {BEYOND}"),
    );
}

#[test]
fn planner_report_needs_a_repeat() {
    refused(
        &["planner-report", "--repeats", "0"],
        "--repeats 0: must be at least 1",
    );
}

#[test]
fn eval_refuses_tokens_beyond_the_model_positions_in_every_mode() {
    let scratch = tempfile::tempdir().unwrap();
    let tokens = scratch.path().join("tokens.safetensors");
    let ids = Tensor::from_vec(vec![3i64; 2 * 129], [2, 129]).unwrap();
    write_safetensors(&tokens, &[("tokens".to_string(), ids)], None).unwrap();
    for mode in ["oracle", "interpret", "planned"] {
        let out = scratch.path().join(format!("{mode}.safetensors"));
        let args = [
            "eval",
            "--model",
            "tiny",
            "--tokens",
            tokens.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--mode",
            mode,
        ];
        refused(&args, &format!("tokens: T = 129 tokens per row: {BEYOND}"));
        assert!(!out.exists(), "{mode}: nothing is written");
    }
}

/// A model directory holding the tiny config with `edits` applied.
fn model_dir(dir: &Path, edits: &[(&str, Value)]) {
    let text = config_json(&ModelConfig::tiny(), DType::F32).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    for (key, value) in edits {
        config[*key] = value.clone();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
}

#[test]
fn configs_beyond_what_kiln_builds_are_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let dir = scratch.path();
    let compile = [
        "compile",
        "--model",
        dir.to_str().unwrap(),
        "--program",
        "train",
    ];
    model_dir(dir, &[("num_hidden_layers", json!(4294967296u64))]);
    refused(
        &compile,
        "field `num_hidden_layers`: 4294967296 is more than the 1024 layers kiln builds",
    );
    let three = vec![json!("full_attention"); 3];
    model_dir(dir, &[("layer_types", json!(three))]);
    refused(
        &compile,
        "field `layer_types`: 3 entries for num_hidden_layers 2 (one per layer)",
    );
    model_dir(
        dir,
        &[("layer_types", json!(["full_attention", "full_attention"]))],
    );
    succeeds(&compile);
}
