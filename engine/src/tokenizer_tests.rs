//! The tokenizer on a byte-level BPE trained here, in memory (nothing is downloaded), saved as
//! a Hugging Face directory and loaded back: round trips, streaming that never splits a
//! character, special tokens, chat templates, and bad files.

use std::path::Path;

use rand::{Rng, SeedableRng};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::AddedToken;

use super::*;
use crate::chat::Message;

const SPECIAL: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// A ChatML template in the style of Qwen2's (`strip()` exercises the Python methods).
const CHATML: &str = "{% for message in messages %}\
{% if message['role'] not in ['system', 'user', 'assistant'] %}\
{{ raise_exception('unknown role ' + message['role']) }}\
{% endif %}\
{{ '<|im_start|>' + message['role'] + '\n' + message['content'].strip() + '<|im_end|>' + '\n' }}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Text with multi-byte characters the small vocabulary cannot hold whole.
fn corpus(seed: u64) -> Vec<String> {
    let words = [
        "kiln",
        "graph",
        "arena",
        "fire",
        "clay",
        "héllo",
        "wörld",
        "naïve",
        "日本語",
        "€",
    ];
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..200)
        .map(|_| {
            let n = rng.random_range(3..12);
            (0..n)
                .map(|_| words[rng.random_range(0..words.len())])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

/// Trains a byte-level BPE of about 300 entries and writes `tokenizer.json` (and, if given,
/// `tokenizer_config.json`) into `dir`.
fn write_model_dir(dir: &Path, config: Option<serde_json::Value>) {
    let mut tokenizer = tokenizers::Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer.with_post_processor(Some(ByteLevel::default()));
    let special: Vec<AddedToken> = SPECIAL.iter().map(|t| AddedToken::from(*t, true)).collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(300)
        .min_frequency(2)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(special)
        .build()
        .into();
    tokenizer
        .train(&mut trainer, corpus(7).into_iter())
        .unwrap();
    tokenizer.save(dir.join(TOKENIZER_FILE), false).unwrap();
    if let Some(config) = config {
        let text = serde_json::to_string(&config).unwrap();
        std::fs::write(dir.join(TOKENIZER_CONFIG_FILE), text).unwrap();
    }
}

fn loaded(config: Option<serde_json::Value>) -> (tempfile::TempDir, Tokenizer) {
    let dir = tempfile::tempdir().unwrap();
    write_model_dir(dir.path(), config);
    let tokenizer = Tokenizer::from_dir(dir.path())
        .unwrap()
        .expect("a tokenizer.json");
    (dir, tokenizer)
}

#[test]
fn text_round_trips_and_streams_in_whole_characters() {
    let (_dir, tokenizer) = loaded(None);
    let mut rng = kiln_kernels::testing::rng("text_round_trips_and_streams_in_whole_characters");
    let lines = corpus(rng.random());
    let text = format!("{} 🎉 {}", lines[0], lines[1]);
    let ids = tokenizer.encode(&text, false).unwrap();
    assert!(ids.iter().all(|&id| (id as usize) < tokenizer.vocab_size()));
    assert_eq!(tokenizer.decode(&ids, false).unwrap(), text);

    let mut stream = tokenizer.stream(false);
    let (mut streamed, mut held_back) = (String::new(), 0);
    for &id in &ids {
        match stream.step(id).unwrap() {
            Some(piece) => {
                assert!(
                    !piece.contains('\u{FFFD}'),
                    "a split character in {piece:?}"
                );
                streamed.push_str(&piece);
            }
            None => held_back += 1,
        }
    }
    assert_eq!(streamed, text);
    // The emoji's four bytes are not one token of this vocabulary: some step waited.
    assert!(held_back > 0, "no step held bytes back");
}

#[test]
fn special_tokens_are_single_ids_and_can_be_skipped() {
    let (_dir, tokenizer) = loaded(None);
    let end = tokenizer.token_id("<|im_end|>").unwrap();
    let ids = tokenizer.encode("kiln graph<|im_end|>", false).unwrap();
    assert_eq!(ids.last(), Some(&end));
    assert_eq!(ids.iter().filter(|&&id| id == end).count(), 1);
    assert_eq!(
        tokenizer.decode(&ids, false).unwrap(),
        "kiln graph<|im_end|>"
    );
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "kiln graph");
    let outside = tokenizer.vocab_size() as u32;
    let err = tokenizer
        .decode(&[ids[0], outside], false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("token id {outside} at position 1")),
        "{err}"
    );
    assert!(tokenizer.stream(false).step(outside).is_err());
}

#[test]
fn the_chat_template_renders_as_transformers_does() {
    let config = serde_json::json!({
        "chat_template": CHATML,
        "eos_token": {"content": "<|im_end|>", "lstrip": false},
        "bos_token": null,
    });
    let (_dir, tokenizer) = loaded(Some(config));
    assert_eq!(tokenizer.eos_token_id(), tokenizer.token_id("<|im_end|>"));
    let messages = [
        Message::new("system", "You are kiln.  "),
        Message::new("user", "Fire the clay."),
    ];
    let prompt = tokenizer.apply_chat_template(&messages, true).unwrap();
    let want = "<|im_start|>system\nYou are kiln.<|im_end|>\n\
                <|im_start|>user\nFire the clay.<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(prompt, want);
    let without = tokenizer.apply_chat_template(&messages, false).unwrap();
    assert_eq!(format!("{without}<|im_start|>assistant\n"), want);
    // The template's own error comes through.
    let err = (tokenizer.apply_chat_template(&[Message::new("robot", "hi")], true))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown role robot"), "{err}");
}

#[test]
fn a_list_of_named_templates_uses_the_default_one() {
    let config = serde_json::json!({
        "chat_template": [
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ messages[0]['content'] }}"},
        ],
    });
    let (_dir, tokenizer) = loaded(Some(config));
    let rendered = tokenizer.apply_chat_template(&[Message::new("user", "clay")], false);
    assert_eq!(rendered.unwrap(), "clay");
    // Without a template, a clear refusal.
    let (_dir, plain) = loaded(None);
    let err = plain
        .apply_chat_template(&[Message::new("user", "clay")], false)
        .unwrap_err();
    assert!(err.to_string().contains("has no chat template"), "{err}");
}

#[test]
fn bad_files_are_refused_by_name() {
    // No tokenizer: generation goes on from ids.
    let empty = tempfile::tempdir().unwrap();
    assert!(Tokenizer::from_dir(empty.path()).unwrap().is_none());

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(TOKENIZER_FILE), "{\"model\": 3}").unwrap();
    let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(
        err.contains(TOKENIZER_FILE) && err.contains("not a tokenizer.json"),
        "{err}"
    );

    let cases = [
        (serde_json::json!({"chat_template": 7}), "chat_template"),
        (serde_json::json!({"eos_token": 5}), "eos_token"),
        (
            serde_json::json!({"chat_template": "{% for x in %}"}),
            "chat template",
        ),
        (
            serde_json::json!({"chat_template": [{"name": "x", "template": "y"}]}),
            "default",
        ),
    ];
    for (config, named) in cases {
        let dir = tempfile::tempdir().unwrap();
        write_model_dir(dir.path(), Some(config.clone()));
        let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains(named), "{config}: {err}");
    }
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join(TOKENIZER_FILE);
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    if !made.is_ok_and(|s| s.success()) {
        println!("SKIPPED: mkfifo is not available here");
        return;
    }
    let err = Tokenizer::from_dir(dir.path()).unwrap_err().to_string();
    assert!(err.contains("not a regular file"), "{err}");
}
