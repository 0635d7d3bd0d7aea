//! `kiln generate` from the command line: greedy ids from a preset equal a plain greedy loop
//! over the eager oracle's full forward; bad requests exit non-zero with a message.

use std::process::{Command, Output};

use kiln_frontend::hf::source::ModelSource;
use kiln_frontend::model::{forward, Eager};
use kiln_frontend::Var;
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
        stderr.contains("10 generated (finish reason: length)"),
        "{stderr}"
    );

    let (config, loaded) = ModelSource::resolve("tiny").unwrap().load(0).unwrap();
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
