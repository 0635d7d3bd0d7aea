//! Tests of `weights_io`'s sharded form: shard names confined to the directory, index and
//! shards in agreement, malformed indexes and missing shards, each refusal naming the tensor
//! and the file.

use std::fs;

use super::tests::{
    assert_contains, load_error, named_tensors, qwen2_like, random, write_sharded, write_single,
};
use super::*;
use crate::hf::safetensors_io::write_safetensors;

/// A directory with the weights of `qwen2_like` as two shards and an index.
fn sharded(test: &str) -> (tempfile::TempDir, Vec<(String, Tensor)>, [String; 2]) {
    let dir = tempfile::tempdir().unwrap();
    let tensors = named_tensors(&random(&qwen2_like(), test));
    let shards = write_sharded(dir.path(), &tensors);
    (dir, tensors, shards)
}

/// Rewrites the index with `edit` applied to its JSON.
fn edit_index(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(WEIGHTS_INDEX_FILE);
    let mut index: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut index);
    fs::write(&path, index.to_string()).unwrap();
}

/// The `Safetensors` error's message; checks the error names `file`.
fn malformed(dir: &Path, file: &str) -> String {
    let err = load_error(dir, &qwen2_like());
    assert!(matches!(err, Error::Safetensors { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with(&dir.join(file).display().to_string()),
        "{message}"
    );
    message
}

#[test]
fn shard_names_must_stay_inside_the_directory() {
    let (dir, _, _) = sharded("shard_names_must_stay_inside_the_directory");
    for bad in [
        "../outside.safetensors",
        "sub/x.safetensors",
        "sub\\x.safetensors",
        "..",
        "/abs.safetensors",
        "",
    ] {
        edit_index(dir.path(), |index| {
            index["weight_map"]["model.norm.weight"] = bad.into();
        });
        let message = malformed(dir.path(), WEIGHTS_INDEX_FILE);
        assert_contains(
            &message,
            &[
                "tensor `model.norm.weight`",
                &format!("\"{bad}\""),
                "not a plain file name",
            ],
        );
    }
}

#[test]
fn a_tensor_listed_for_a_shard_must_be_in_it() {
    let (dir, tensors, shards) = sharded("a_tensor_listed_for_a_shard_must_be_in_it");
    let moved = tensors[0].0.clone();
    edit_index(dir.path(), |index| {
        index["weight_map"][&moved] = shards[1].clone().into();
    });
    let message = malformed(dir.path(), &shards[1]);
    assert_contains(
        &message,
        &[
            &format!("tensor `{moved}` is listed"),
            "absent from it",
            &format!("(it is in {})", shards[0]),
        ],
    );

    let (dir, _, shards) = sharded("a_tensor_listed_for_a_shard_must_be_in_it_2");
    edit_index(dir.path(), |index| {
        index["weight_map"]["model.ghost.weight"] = shards[0].clone().into();
    });
    let message = malformed(dir.path(), &shards[0]);
    assert_contains(
        &message,
        &["tensor `model.ghost.weight` is listed", "absent from it"],
    );
}

#[test]
fn a_tensor_in_two_shards_names_both() {
    let (dir, tensors, shards) = sharded("a_tensor_in_two_shards_names_both");
    let half = tensors.len() / 2;
    let mut second = tensors[half..].to_vec();
    second.push(tensors[0].clone());
    std::fs::remove_file(dir.path().join(&shards[1])).unwrap();
    write_safetensors(&dir.path().join(&shards[1]), &second, None).unwrap();
    let message = malformed(dir.path(), WEIGHTS_INDEX_FILE);
    assert_contains(
        &message,
        &[&format!(
            "tensor `{}` is stored in two shards: {} and {}",
            tensors[0].0, shards[0], shards[1]
        )],
    );
}

#[test]
fn a_shard_tensor_missing_from_the_index_is_refused() {
    let (dir, tensors, shards) = sharded("a_shard_tensor_missing_from_the_index_is_refused");
    let dropped = tensors.last().unwrap().0.clone();
    edit_index(dir.path(), |index| {
        index["weight_map"]
            .as_object_mut()
            .unwrap()
            .remove(&dropped);
    });
    let message = malformed(dir.path(), &shards[1]);
    assert_contains(
        &message,
        &[&format!(
            "tensor `{dropped}` is in this shard but not in {WEIGHTS_INDEX_FILE}"
        )],
    );
}

#[test]
fn a_malformed_index_is_refused() {
    let (dir, _, shards) = sharded("a_malformed_index_is_refused");
    let path = dir.path().join(WEIGHTS_INDEX_FILE);
    let twice = format!(
        r#"{{"weight_map": {{"model.norm.weight": "{0}", "model.norm.weight": "{0}"}}}}"#,
        shards[0]
    );
    for (text, expected) in [
        ("{\"weight_map\": ", "the shard index is not valid JSON"),
        ("{\"metadata\": {}}", "missing field `weight_map`"),
        (
            "{\"weight_map\": {\"model.norm.weight\": 3}}",
            "the shard index must be",
        ),
        (
            twice.as_str(),
            "tensor `model.norm.weight` is listed twice in weight_map",
        ),
    ] {
        fs::write(&path, text).unwrap();
        assert_contains(&malformed(dir.path(), WEIGHTS_INDEX_FILE), &[expected]);
    }
}

#[test]
fn a_missing_shard_is_an_io_error_naming_it() {
    let (dir, _, shards) = sharded("a_missing_shard_is_an_io_error_naming_it");
    fs::remove_file(dir.path().join(&shards[1])).unwrap();
    let err = load_error(dir.path(), &qwen2_like());
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &[&dir.path().join(&shards[1]).display().to_string()],
    );
}

#[test]
fn the_single_file_takes_precedence_over_an_index() {
    let (dir, tensors, _) = sharded("the_single_file_takes_precedence_over_an_index");
    fs::write(dir.path().join(WEIGHTS_INDEX_FILE), "not json").unwrap();
    write_single(dir.path(), &tensors);
    let loaded = load_weights(dir.path(), &qwen2_like(), DType::F32)
        .unwrap()
        .weights;
    assert_eq!(loaded.named().len(), tensors.len());
}
