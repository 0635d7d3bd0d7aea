//! `kiln generate` on a model directory with a tokenizer (the `tiny` preset and a small BPE
//! trained here, see `support/tokenized_model.rs`): the streamed text is the report's, which
//! is the tokenizer's decoding of the report's tokens; `--chat` renders the prompt through the
//! chat template; `<|im_end|>` ends a request; characters outside the tokenizer's alphabet
//! never panic.

#[path = "support/tokenized_model.rs"]
mod tokenized_model;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tokenized_model::tokenized_tiny_model;

const PROMPT: &str = "the kiln fires clay";

fn kiln(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run kiln")
}

/// The fixture written with `seed`, and its tokenizer as the `tokenizers` crate loads it.
struct Model {
    _scratch: tempfile::TempDir,
    dir: PathBuf,
    tokenizer: tokenizers::Tokenizer,
}

impl Model {
    fn new(seed: u64) -> Model {
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path().join("model");
        tokenized_tiny_model(&dir, seed);
        let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
            .expect("load tokenizer.json");
        Model {
            _scratch: scratch,
            dir,
            tokenizer,
        }
    }

    fn id(&self, token: &str) -> u32 {
        (self.tokenizer.token_to_id(token))
            .unwrap_or_else(|| panic!("no {token} in the vocabulary"))
    }

    fn encode(&self, text: &str) -> Vec<u32> {
        self.tokenizer
            .encode(text, false)
            .unwrap()
            .get_ids()
            .to_vec()
    }

    /// Text as kiln returns it: special tokens skipped (transformers'
    /// `decode(skip_special_tokens=True)`).
    fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap()
    }
}

/// One request's entry in the `--json` report, and what kiln printed.
struct Generated {
    tokens: Vec<u32>,
    text: String,
    finish_reason: String,
    stdout: String,
}

/// Greedy `kiln generate --json` of at most 12 tokens from the model in `dir`, with `extra`
/// arguments (the prompt); it must succeed without a panic.
fn generate(dir: &Path, extra: &[&str]) -> Generated {
    let scratch = tempfile::tempdir().unwrap();
    let json = scratch.path().join("report.json");
    let mut args = vec![
        "generate",
        "--model",
        dir.to_str().unwrap(),
        "--max-new-tokens",
        "12",
        "--temperature",
        "0",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = kiln(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{extra:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let request = &report["requests"][0];
    Generated {
        tokens: (request["tokens"].as_array().unwrap().iter())
            .map(|t| t.as_u64().unwrap() as u32)
            .collect(),
        text: request["text"].as_str().expect("a text").to_string(),
        finish_reason: request["finish_reason"].as_str().unwrap().to_string(),
        stdout: String::from_utf8(out.stdout).unwrap(),
    }
}

/// The fixture's tokenizer fits the model, its generation config stops on `<|im_end|>`, and
/// text of its alphabet round-trips.
#[test]
fn the_tokenizer_fits_the_model_and_round_trips_its_alphabet() {
    let model = Model::new(0);
    assert!(model.tokenizer.get_vocab_size(true) <= 97);
    let generation: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(model.dir.join("generation_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(generation["eos_token_id"], model.id("<|im_end|>"));
    let unk = model.id("<unk>");
    for text in [PROMPT, "a potter shapes the clay\nthe kiln cools"] {
        let ids = model.encode(text);
        assert!(!ids.contains(&unk), "{text:?} gave {ids:?}");
        assert_eq!(model.decode(&ids), text);
    }
}

/// The streamed text is the report's, and the report's text is the tokenizer's decoding of
/// the report's tokens.
#[test]
fn generated_text_is_the_decoding_of_the_generated_tokens() {
    let model = Model::new(3);
    let got = generate(&model.dir, &["--prompt", PROMPT]);
    assert_eq!(got.finish_reason, "length");
    assert_eq!(got.tokens.len(), 12);
    assert!(got.tokens.iter().all(|&t| t < 97), "{:?}", got.tokens);
    assert_eq!(got.stdout, format!("{}\n", got.text));
    assert_eq!(model.decode(&got.tokens), got.text);
}

/// `--chat` generates what the ids of the ChatML rendering of the prompt generate.
#[test]
fn chat_renders_the_prompt_through_the_template() {
    let model = Model::new(3);
    let chat = generate(&model.dir, &["--chat", "--prompt", PROMPT]);
    assert!(!chat.tokens.is_empty(), "no tokens");
    assert_eq!(model.decode(&chat.tokens), chat.text);

    let rendered = format!("<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n");
    let ids: Vec<String> = (model.encode(&rendered).iter())
        .map(u32::to_string)
        .collect();
    let from_ids = generate(&model.dir, &["--prompt-ids", &ids.join(",")]);
    assert_eq!(chat.tokens, from_ids.tokens);
    let plain = generate(&model.dir, &["--prompt", PROMPT]);
    assert_ne!(chat.tokens, plain.tokens, "the template changed nothing");
}

/// `<|im_end|>` ends a request (finish reason `stop`) as the last token, its text included:
/// seed 7 is one whose greedy continuations of the prompt, plain and chat, reach it within 12
/// tokens.
#[test]
fn im_end_stops_the_request() {
    let model = Model::new(7);
    let end = model.id("<|im_end|>");
    for extra in [&["--prompt", PROMPT][..], &["--chat", "--prompt", PROMPT]] {
        let got = generate(&model.dir, extra);
        assert_eq!(got.finish_reason, "stop", "{extra:?}: {:?}", got.text);
        assert!(got.tokens.len() < 12, "{extra:?}: {:?}", got.tokens);
        assert_eq!(
            got.tokens.iter().position(|&t| t == end),
            Some(got.tokens.len() - 1)
        );
        assert!(!got.text.contains("<|im_end|>"), "{:?}", got.text);
        assert_eq!(model.decode(&got.tokens), got.text);
    }
}

/// Characters outside the alphabet encode as `<unk>`, and generation goes on, plain and chat.
#[test]
fn characters_outside_the_alphabet_encode_as_unk() {
    let model = Model::new(3);
    let prompt = "The kiln fires at 1200 °C — 🔥";
    assert!(model.encode(prompt).contains(&model.id("<unk>")));
    for extra in [&["--prompt", prompt][..], &["--chat", "--prompt", prompt]] {
        let got = generate(&model.dir, extra);
        assert_eq!(model.decode(&got.tokens), got.text, "{extra:?}");
    }
}

/// A prompt of no tokens is refused with a message, not a panic.
#[test]
fn an_empty_prompt_is_refused_with_a_message() {
    let model = Model::new(3);
    let out = kiln(&[
        "generate",
        "--model",
        model.dir.to_str().unwrap(),
        "--prompt",
        "",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("the prompt is empty"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
