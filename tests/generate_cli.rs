//! `kiln generate` from the command line: greedy ids from a preset equal a plain greedy loop
//! over the eager oracle's full forward; bad requests exit non-zero with a message.

use std::process::{Command, Output};

use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::{forward, Eager};
use kiln_frontend::Var;
use kiln_ir::DType;
use kiln_runtime::Tensor;

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run kiln")
}

#[test]
fn greedy_ids_from_a_preset_equal_the_oracles_greedy_loop() {
    let prompt = [5i64, 17, 42, 8];
    let out = kiln(&[
        "generate",
        "--model",
        "tiny",
        "--seed",
        "0",
        "--prompt-ids",
        "5,17,42,8",
        "--temperature",
        "0",
        "--max-new-tokens",
        "10",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<i64> = (String::from_utf8_lossy(&out.stdout).split_whitespace())
        .map(|t| t.parse().unwrap())
        .collect();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("10 tokens generated (finish reason: length)"),
        "{stderr}"
    );

    let (config, loaded) = ModelSource::resolve("tiny")
        .unwrap()
        .load(0, DType::F32)
        .unwrap();
    let mut sequence = prompt.to_vec();
    for _ in 0..10 {
        let t = sequence.len();
        let tokens = Var::constant(Tensor::from_vec(sequence.clone(), [1, t]).unwrap());
        let positions = Var::constant(Tensor::from_vec((0..t as i64).collect(), [1, t]).unwrap());
        let logits = forward(&Eager::F32, &config, &loaded.weights, &tokens, &positions).unwrap();
        let all = logits.value().to_vec::<f32>().unwrap();
        let last = &all[(t - 1) * config.vocab_size..];
        let best = (0..last.len()).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        sequence.push(best as i64);
    }
    assert_eq!(got, sequence[prompt.len()..].to_vec());
}

#[test]
fn bad_requests_exit_with_a_message() {
    let cases: [(&[&str], &str); 5] = [
        (&["--prompt", "hello"], "no tokenizer.json"),
        (
            &["--prompt-ids", "1,2,300"],
            "prompt token 2 is 300, outside the vocabulary of 97",
        ),
        (&["--prompt-ids", "1,2", "--top-p", "0"], "`top_p` = 0"),
        (
            &["--prompt-ids", "1,2", "--max-new-tokens", "0"],
            "`max_new_tokens`: must be at least 1",
        ),
        (
            &["--prompt-ids", "1,2", "--max-new-tokens", "500"],
            "the model has 128",
        ),
    ];
    for (args, message) in cases {
        let mut all = vec!["generate", "--model", "tiny"];
        all.extend_from_slice(args);
        let out = kiln(&all);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(message),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// `--prompts FILE --json OUT`: every prompt in order, each with what a single run gives it
/// (and what continuous batching gives it); the report holds one entry per prompt and a
/// summary; an existing OUT is never replaced.
#[test]
fn a_file_of_prompts_writes_a_report_in_prompt_order() {
    let dir = tempfile::tempdir().unwrap();
    let prompts = dir.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt_ids\": [5, 17, 42, 8]}\n\n{\"prompt_ids\": [1, 2]}\n{\"prompt_ids\": [9]}\n",
    )
    .unwrap();
    let json = dir.path().join("report.json");
    let (prompts_arg, json_arg) = (prompts.to_str().unwrap(), json.to_str().unwrap());
    let common = [
        "generate",
        "--model",
        "tiny",
        "--temperature",
        "0",
        "--max-new-tokens",
        "6",
    ];
    let mut args = common.to_vec();
    args.extend(["--prompts", prompts_arg, "--json", json_arg]);
    let out = kiln(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let requests = report["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 3);
    for (index, (request, ids)) in requests.iter().zip(["5,17,42,8", "1,2", "9"]).enumerate() {
        assert_eq!(request["index"], index);
        assert_eq!(request["finish_reason"], "length");
        let mut single = common.to_vec();
        single.extend(["--prompt-ids", ids]);
        let alone = kiln(&single);
        let alone: Vec<u64> = (String::from_utf8_lossy(&alone.stdout).split_whitespace())
            .map(|t| t.parse().unwrap())
            .collect();
        let tokens: Vec<u64> = (request["tokens"].as_array().unwrap().iter())
            .map(|t| t.as_u64().unwrap())
            .collect();
        assert_eq!(tokens, alone, "prompt {index}");
    }
    let summary = &report["summary"];
    assert_eq!(summary["requests"], 3);
    assert_eq!(summary["generated_tokens"], 18);
    assert!(
        summary["total_ms"]["p95"].as_f64().unwrap()
            >= summary["total_ms"]["p50"].as_f64().unwrap()
    );

    // Continuous batching on two slots gives every request the same tokens.
    let batched = dir.path().join("batched.json");
    let mut continuous = common.to_vec();
    continuous.extend([
        "--prompts",
        prompts_arg,
        "--json",
        batched.to_str().unwrap(),
    ]);
    continuous.extend(["--scheduler", "continuous", "--slots", "2"]);
    let out = kiln(&continuous);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let batched: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&batched).unwrap()).unwrap();
    for (index, request) in requests.iter().enumerate() {
        assert_eq!(
            batched["requests"][index]["tokens"], request["tokens"],
            "prompt {index}"
        );
    }

    let before = std::fs::read(&json).unwrap();
    let again = kiln(&args);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    assert_eq!(
        std::fs::read(&json).unwrap(),
        before,
        "the report is left as it was"
    );

    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"prompt\": 3}\n").unwrap();
    let out = kiln(&[
        "generate",
        "--model",
        "tiny",
        "--prompts",
        bad.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("line 1"),
        "{stderr}"
    );
}
