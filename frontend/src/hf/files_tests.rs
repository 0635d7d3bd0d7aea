//! Tests of opening the files kiln reads: a FIFO, a device or a directory where a config,
//! shard index, weights file, shard or tokens file belongs is refused at once with an error
//! naming the path and what it is, and oversized text files are refused unread.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use kiln_ir::DType;
use kiln_kernels::testing::rng;
use rand::Rng;

use crate::error::Error;
use crate::hf::config::{config_json, load_config, CONFIG_FILE};
use crate::hf::safetensors_io::{write_safetensors, SafetensorsFile};
use crate::hf::weights_io::{load_weights, save_weights, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use crate::model::{random_parameters, random_weights, ModelConfig};

/// Runs `f` on its own thread and fails if it has not returned within 10 s: a FIFO opened the
/// usual way blocks until a writer appears, and a device can be read forever.
fn within_time<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(10))
        .expect("still running after 10 s: reading it hangs")
}

/// Makes a FIFO at `path`, or `false` where mkfifo cannot.
fn mkfifo(path: &Path) -> bool {
    let made = Command::new("mkfifo")
        .arg(path)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("skipped: mkfifo is not available here");
    }
    made
}

/// The error of `load(path)`, which must be an I/O error naming `named` and saying `what`.
#[track_caller]
fn refused(err: Error, named: &Path, what: &str) {
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    let message = err.to_string();
    for part in [&named.display().to_string(), what, "not a regular file"] {
        assert!(
            message.contains(part),
            "`{message}` should contain `{part}`"
        );
    }
}

/// A model directory of the tiny preset with fresh random weights, single or in two shards.
fn model_dir(test: &str, sharded: bool) -> (tempfile::TempDir, ModelConfig, Vec<PathBuf>) {
    let dir = tempfile::tempdir().unwrap();
    let config = ModelConfig::tiny();
    let seed = rng(test).random();
    fs::write(
        dir.path().join(CONFIG_FILE),
        config_json(&config, DType::F32).unwrap(),
    )
    .unwrap();
    if !sharded {
        save_weights(
            dir.path(),
            &random_weights(&config, seed).unwrap(),
            DType::F32,
        )
        .unwrap();
        let weights = dir.path().join(WEIGHTS_FILE);
        return (dir, config, vec![weights]);
    }
    let tensors = random_parameters(&config, seed, DType::F32, |_| {}).unwrap();
    let (first, second) = tensors.split_at(tensors.len() / 2);
    let mut weight_map = serde_json::Map::new();
    let mut shards = Vec::new();
    for (i, part) in [first, second].into_iter().enumerate() {
        let name = format!("model-0000{}-of-00002.safetensors", i + 1);
        write_safetensors(&dir.path().join(&name), part, None).unwrap();
        for (tensor, _) in part {
            weight_map.insert(tensor.clone(), name.clone().into());
        }
        shards.push(dir.path().join(name));
    }
    let index = serde_json::json!({ "weight_map": weight_map });
    fs::write(dir.path().join(WEIGHTS_INDEX_FILE), index.to_string()).unwrap();
    (dir, config, shards)
}

fn load_error(dir: &Path, config: &ModelConfig) -> Error {
    let (dir, config) = (dir.to_path_buf(), config.clone());
    // Weights hold `Rc`s: only the error comes back from the thread.
    within_time(move || load_weights(&dir, &config, DType::F32).err()).expect("loading fails")
}

#[test]
fn a_fifo_in_place_of_any_input_is_refused_without_waiting() {
    let test = "a_fifo_in_place_of_any_input_is_refused";
    // The weights file.
    let (dir, config, files) = model_dir(test, false);
    fs::remove_file(&files[0]).unwrap();
    if !mkfifo(&files[0]) {
        return;
    }
    refused(load_error(dir.path(), &config), &files[0], "a FIFO");
    // A tokens file, opened on its own.
    let tokens = files[0].clone();
    let err = within_time(move || SafetensorsFile::open(&tokens)).unwrap_err();
    refused(err, &files[0], "a FIFO");

    // A shard, then the shard index.
    let (dir, config, shards) = model_dir(test, true);
    fs::remove_file(&shards[1]).unwrap();
    assert!(mkfifo(&shards[1]));
    refused(load_error(dir.path(), &config), &shards[1], "a FIFO");
    let index = dir.path().join(WEIGHTS_INDEX_FILE);
    fs::remove_file(&index).unwrap();
    assert!(mkfifo(&index));
    let err = load_error(dir.path(), &config);
    assert!(matches!(err, Error::Safetensors { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&index.display().to_string())
            && message.contains("cannot read the shard index: it is a FIFO"),
        "{message}"
    );

    // The config.
    let config_path = dir.path().join(CONFIG_FILE);
    fs::remove_file(&config_path).unwrap();
    assert!(mkfifo(&config_path));
    let dir_path = dir.path().to_path_buf();
    let err = within_time(move || load_config(&dir_path)).unwrap_err();
    refused(err, &config_path, "a FIFO");
}

#[test]
fn inputs_linked_to_a_device_or_naming_a_directory_are_refused() {
    let zero = Path::new("/dev/zero");
    if !zero.exists() {
        eprintln!("skipped: no /dev/zero here");
        return;
    }
    let (dir, config, files) = model_dir("inputs_linked_to_a_device", false);
    let config_path = dir.path().join(CONFIG_FILE);
    fs::remove_file(&config_path).unwrap();
    symlink(zero, &config_path).unwrap();
    let dir_path = dir.path().to_path_buf();
    let err = within_time(move || load_config(&dir_path)).unwrap_err();
    refused(err, &config_path, "a character device");

    fs::remove_file(&files[0]).unwrap();
    symlink(zero, &files[0]).unwrap();
    refused(
        load_error(dir.path(), &config),
        &files[0],
        "a character device",
    );
    fs::remove_file(&files[0]).unwrap();
    fs::create_dir(&files[0]).unwrap();
    let err = SafetensorsFile::open(&files[0]).unwrap_err();
    refused(err, &files[0], "a directory");
}

/// A sparse file of `len` bytes: only its size matters.
fn sparse(path: &Path, len: u64) {
    fs::File::create(path).unwrap().set_len(len).unwrap();
}

#[test]
fn oversized_config_and_index_are_refused_unread() {
    let (dir, config, _) = model_dir("oversized_config_and_index", true);
    let index = dir.path().join(WEIGHTS_INDEX_FILE);
    fs::remove_file(&index).unwrap();
    sparse(&index, super::INDEX_LIMIT + 1);
    let message = load_error(dir.path(), &config).to_string();
    assert!(
        message.contains(&index.display().to_string())
            && message.contains("it is 100000001 bytes, over the 100000000-byte limit"),
        "{message}"
    );

    let config_path = dir.path().join(CONFIG_FILE);
    fs::remove_file(&config_path).unwrap();
    sparse(&config_path, super::CONFIG_LIMIT + 1);
    let message = load_config(dir.path()).unwrap_err().to_string();
    assert!(
        message.contains(&config_path.display().to_string())
            && message.contains(&format!(
                "it is {} bytes, over the {}-byte limit",
                super::CONFIG_LIMIT + 1,
                super::CONFIG_LIMIT
            )),
        "{message}"
    );
}
