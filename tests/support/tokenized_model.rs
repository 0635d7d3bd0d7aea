//! A tiny model directory kiln generates text from: the `tiny` preset's weights and
//! `config.json` from `kiln init-model`, and beside them a character-level BPE trained here, in
//! memory (nothing is downloaded), whose every id lies inside the preset's vocabulary of 97 —
//! `tokenizer.json`, a ChatML `tokenizer_config.json` and a `generation_config.json` that stops
//! on `<|im_end|>`.
//!
//! The tokenizer's alphabet is the lowercase letters a–z, the newline and the space (a
//! Metaspace `▁`, which the decoder turns back into a space); any other character encodes as
//! `<unk>`. Text of that alphabet round-trips exactly.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::AddedToken;

/// The token every character outside the alphabet encodes as.
const UNK: &str = "<unk>";
/// ChatML's special tokens, added after the trained vocabulary (the last ids).
const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// The end of a chat turn: `eos_token` and `eos_token_id`.
const EOS: &str = "<|im_end|>";

/// A ChatML chat template, as Qwen2's without a default system message.
const CHATML: &str = "{% for message in messages %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The text the BPE's merges are learned from: lowercase words, a few per line.
const CORPUS: [&str; 16] = [
    "the kiln fires clay into stone",
    "a potter shapes the clay on the wheel",
    "the fire in the kiln burns hot and slow",
    "glaze melts on the pot in the heat",
    "the graph of the model runs on the arena",
    "tokens flow through the layers of the model",
    "the user asks and the assistant answers",
    "a system message sets the tone of the chat",
    "stone and clay and fire and glaze",
    "the kiln cools and the pots are ready",
    "every token has an id in the vocabulary",
    "the engine compiles the graph before it runs",
    "the potter fires the glazed pots in the kiln",
    "the model reads every token of the prompt",
    "the heat of the fire turns the clay to stone",
    "the assistant writes an answer for the user",
];

/// Writes the `tiny` preset with weights from `seed` into `dir` (through the kiln binary) and
/// then its tokenizer files (see the module doc). Panics, saying why, if a step fails or the
/// tokenizer would hold an id outside the model's vocabulary.
pub fn tokenized_tiny_model(dir: &Path, seed: u64) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args([
            "init-model",
            "--preset",
            "tiny",
            "--seed",
            &seed.to_string(),
        ])
        .arg("--out")
        .arg(dir)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run kiln init-model");
    assert!(
        out.status.success(),
        "kiln init-model failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let model_vocab = config["vocab_size"]
        .as_u64()
        .expect("config.json has an integer vocab_size") as usize;

    let tokenizer = train(model_vocab - SPECIAL.len());
    let vocab = tokenizer.get_vocab(true);
    assert!(
        vocab.len() <= model_vocab,
        "the tokenizer has {} entries, more than the model's vocabulary of {model_vocab}",
        vocab.len()
    );
    let largest = vocab.values().max().copied().unwrap_or(0) as usize;
    assert!(
        largest < model_vocab,
        "the tokenizer's id {largest} is outside the model's vocabulary of {model_vocab}"
    );
    tokenizer
        .save(dir.join("tokenizer.json"), true)
        .expect("write tokenizer.json");

    let tokenizer_config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": CHATML,
        "bos_token": null,
        "eos_token": EOS,
        "unk_token": UNK,
    });
    let eos = tokenizer
        .token_to_id(EOS)
        .expect("the tokenizer holds <|im_end|>");
    let generation_config = serde_json::json!({ "eos_token_id": eos });
    for (file, json) in [
        ("tokenizer_config.json", tokenizer_config),
        ("generation_config.json", generation_config),
    ] {
        let text = serde_json::to_string_pretty(&json).unwrap();
        std::fs::write(dir.join(file), text).unwrap_or_else(|e| panic!("write {file}: {e}"));
    }
}

/// A BPE of at most `trained` entries (`<unk>`, the alphabet and merges) learned from
/// [`CORPUS`], with ChatML's special tokens added after them.
fn train(trained: usize) -> tokenizers::Tokenizer {
    let model = BPE::builder()
        .unk_token(UNK.to_string())
        .build()
        .expect("a BPE with an unknown token");
    let mut tokenizer = tokenizers::Tokenizer::new(model);
    // Spaces become `▁`, and one `▁` is put before the text's start (not after a special
    // token); the decoder drops the first token's `▁` again, so text round-trips.
    let metaspace = Metaspace::new('▁', PrependScheme::First, true);
    tokenizer.with_pre_tokenizer(Some(metaspace.clone()));
    tokenizer.with_decoder(Some(metaspace));
    let alphabet: HashSet<char> = ('a'..='z').chain(['\n', '▁']).collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(trained)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(alphabet.clone())
        .limit_alphabet(alphabet.len())
        .special_tokens(vec![AddedToken::from(UNK, true)])
        .build()
        .into();
    tokenizer
        .train(&mut trainer, CORPUS.iter())
        .expect("train the BPE");
    let special = SPECIAL.iter().map(|t| AddedToken::from(*t, true));
    let added = (tokenizer.add_special_tokens(special)).expect("add ChatML's special tokens");
    assert_eq!(
        added,
        SPECIAL.len(),
        "a ChatML token was already in the vocabulary"
    );
    tokenizer
}
