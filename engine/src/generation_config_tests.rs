//! Tests of reading `generation_config.json`: both `eos_token_id` forms, sampling defaults,
//! a missing file, wrong types and ranges named by file and field, and files that are not
//! regular or too large.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// A model directory holding `text` as its generation config.
fn model_dir(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join(GENERATION_CONFIG_FILE);
    std::fs::write(&path, text).expect("write the config");
    (dir, path)
}

fn load(text: &str) -> Result<GenerationConfig> {
    let (dir, _) = model_dir(text);
    GenerationConfig::load(dir.path())
}

/// The error of loading `text`, which must name the file and `field`.
#[track_caller]
fn field_error(text: &str, field: &str) -> String {
    let (dir, path) = model_dir(text);
    let err = GenerationConfig::load(dir.path()).expect_err(text);
    assert!(
        matches!(&err, Error::GenerationConfigField { field: f, .. } if *f == field),
        "{text}: {err:?}"
    );
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains(&format!("`{field}`")), "{message}");
    message
}

#[test]
fn eos_token_id_reads_as_an_integer_or_a_list() {
    assert_eq!(
        load(r#"{"eos_token_id": 2}"#).unwrap().eos_token_ids,
        vec![2]
    );
    let list = load(r#"{"bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009]}"#);
    assert_eq!(list.unwrap().eos_token_ids, vec![128001, 128008, 128009]);
    assert_eq!(
        load(r#"{"eos_token_id": []}"#).unwrap().eos_token_ids,
        Vec::<u32>::new()
    );
    assert_eq!(
        load(r#"{"eos_token_id": null}"#).unwrap().eos_token_ids,
        Vec::<u32>::new()
    );
}

#[test]
fn sampling_defaults_are_read_and_unknown_fields_ignored() {
    let config = load(
        r#"{"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 50, "min_p": 0.05,
            "repetition_penalty": 1.1, "transformers_version": "4.45.0", "max_length": 4096,
            "pad_token_id": null, "eos_token_id": 1}"#,
    )
    .unwrap();
    assert_eq!(config.do_sample, Some(true));
    let params = config.sampling_params(42);
    assert_eq!(
        params,
        SamplingParams {
            temperature: 0.6,
            top_k: 50,
            top_p: 0.9,
            min_p: 0.05,
            repetition_penalty: 1.1,
            seed: 42,
        }
    );
    let integral = load(r#"{"temperature": 1, "top_p": 1}"#).unwrap();
    assert_eq!(
        (integral.temperature, integral.top_p),
        (Some(1.0), Some(1.0))
    );
}

#[test]
fn do_sample_false_makes_the_defaults_greedy() {
    let config =
        load(r#"{"do_sample": false, "temperature": 0.7, "repetition_penalty": 1.2}"#).unwrap();
    let params = config.sampling_params(7);
    assert!(params.is_greedy());
    assert_eq!(params.repetition_penalty, 1.2);
    let unstated = load(r#"{"temperature": 0.7}"#).unwrap().sampling_params(7);
    assert_eq!(unstated.temperature, 0.7);
}

#[test]
fn a_missing_file_gives_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let config = GenerationConfig::load(dir.path()).unwrap();
    assert_eq!(config, GenerationConfig::default());
    assert_eq!(
        config.sampling_params(3),
        SamplingParams {
            seed: 3,
            ..SamplingParams::default()
        }
    );
}

#[test]
fn fields_of_the_wrong_type_are_refused_naming_file_and_field() {
    assert!(field_error(r#"{"temperature": "0.7"}"#, "temperature").contains("a string"));
    assert!(field_error(r#"{"top_k": 50.5}"#, "top_k").contains("non-negative integer"));
    field_error(r#"{"top_k": -1}"#, "top_k");
    field_error(r#"{"top_p": [0.9]}"#, "top_p");
    field_error(r#"{"min_p": true}"#, "min_p");
    field_error(r#"{"repetition_penalty": {}}"#, "repetition_penalty");
    field_error(r#"{"do_sample": "yes"}"#, "do_sample");
    field_error(r#"{"eos_token_id": "2"}"#, "eos_token_id");
    field_error(r#"{"eos_token_id": -1}"#, "eos_token_id");
    field_error(r#"{"eos_token_id": 4294967296}"#, "eos_token_id");
    assert!(field_error(r#"{"eos_token_id": [1, "x"]}"#, "eos_token_id").contains("\"x\""));
}

#[test]
fn sampling_defaults_out_of_range_are_refused_naming_file_and_field() {
    assert!(field_error(r#"{"top_p": 1.5}"#, "top_p").contains("(0, 1]"));
    field_error(r#"{"temperature": -1.0}"#, "temperature");
    field_error(r#"{"min_p": 2}"#, "min_p");
    field_error(r#"{"repetition_penalty": 0}"#, "repetition_penalty");
    field_error(r#"{"temperature": 1e300}"#, "temperature");
}

#[test]
fn malformed_files_are_refused_naming_the_file() {
    for text in ["{\"temperature\": 0.7,", "[1, 2]", "\"text\"", ""] {
        let (dir, path) = model_dir(text);
        let err = GenerationConfig::load(dir.path()).expect_err(text);
        assert!(
            matches!(err, Error::GenerationConfigSyntax { .. }),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}

/// Loads from `dir` on a thread of its own, failing if it takes over 10 s (a FIFO opened the
/// usual way blocks until a writer appears).
fn load_within_time(dir: &Path) -> Result<GenerationConfig> {
    let (sender, receiver) = mpsc::channel();
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        let _ = sender.send(GenerationConfig::load(&dir));
    });
    receiver
        .recv_timeout(Duration::from_secs(10))
        .expect("loading still runs after 10 s: it hangs")
}

#[track_caller]
fn refused_as_not_regular(result: Result<GenerationConfig>, path: &Path) {
    match result {
        Err(err @ Error::Io { .. }) => {
            let message = err.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("not a regular file"), "{message}");
        }
        other => panic!("expected an Io error, got {other:?}"),
    }
}

#[test]
fn a_fifo_or_directory_in_place_of_the_file_is_refused_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(GENERATION_CONFIG_FILE);
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .is_ok_and(|status| status.success());
    if made {
        refused_as_not_regular(load_within_time(dir.path()), &path);
        std::fs::remove_file(&path).unwrap();
    } else {
        eprintln!("FIFO case skipped: mkfifo is not available here");
    }
    std::fs::create_dir(&path).unwrap();
    refused_as_not_regular(load_within_time(dir.path()), &path);
}

#[test]
fn a_file_over_the_size_limit_is_refused() {
    let padding = " ".repeat(GENERATION_CONFIG_LIMIT as usize);
    let (dir, path) = model_dir(&format!("{{\"eos_token_id\": 2}}{padding}"));
    match GenerationConfig::load(dir.path()) {
        Err(err @ Error::Io { .. }) => {
            let message = err.to_string();
            assert!(message.contains(&path.display().to_string()), "{message}");
            assert!(message.contains("limit"), "{message}");
        }
        other => panic!("expected an Io error, got {other:?}"),
    }
}
