//! Tests of how writes are published: nothing at the target is ever replaced (a file, a
//! directory, a dangling symbolic link, one that appears during the write), every failure
//! leaves no temporary file, in-flight temporary files are registered for a signal's sweep, and
//! stale ones of dead writers are swept.

use std::fs;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

use kiln_kernels::testing::rng;
use rand::Rng;

use super::rejection_tests::{listing, one_tensor};
use super::temp::{in_flight_paths, link_then_unlink, publish_no_replace};
use super::tests::assert_contains;
use super::write::{atomically, Failure};
use super::*;

fn random_bytes(test: &str, len: usize) -> Vec<u8> {
    let mut rng = rng(test);
    (0..len).map(|_| rng.random()).collect()
}

/// Checks `err` refuses `path` as already existing, saying what is there.
#[track_caller]
fn refuses_existing(err: Error, path: &Path, what: &str) {
    assert!(matches!(err, Error::AlreadyExists { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &[
            &path.display().to_string(),
            "already exists",
            what,
            "never replaces",
        ],
    );
}

#[test]
fn an_existing_file_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out.safetensors");
    let mine = random_bytes("an_existing_file_is_never_replaced", 4096);
    fs::write(&target, &mine).unwrap();

    let err = write_safetensors(&target, &one_tensor(), None).unwrap_err();
    refuses_existing(err, &target, "(a file)");
    let err = write_file_atomically(&target, b"{}").unwrap_err();
    refuses_existing(err, &target, "(a file)");
    assert_eq!(fs::read(&target).unwrap(), mine);
    assert_eq!(
        listing(dir.path()),
        ["out.safetensors"],
        "no temporary file"
    );
}

#[test]
fn a_directory_at_the_target_is_refused_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("model.safetensors");
    fs::create_dir(&target).unwrap();
    let mine = random_bytes("a_directory_at_the_target_is_refused", 64);
    fs::write(target.join("keep.bin"), &mine).unwrap();
    let err = write_safetensors(&target, &one_tensor(), None).unwrap_err();
    refuses_existing(err, &target, "(a directory)");
    assert_eq!(listing(dir.path()), ["model.safetensors"]);
    assert_eq!(fs::read(target.join("keep.bin")).unwrap(), mine);
}

#[test]
fn a_dangling_symbolic_link_is_never_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out.safetensors");
    let nowhere = dir.path().join("nowhere");
    symlink(&nowhere, &target).unwrap();

    let err = write_safetensors(&target, &one_tensor(), None).unwrap_err();
    refuses_existing(err, &target, "dangling symbolic link");
    assert_eq!(fs::read_link(&target).unwrap(), nowhere);
    assert!(!nowhere.exists(), "nothing written through the link");
    assert_eq!(listing(dir.path()), ["out.safetensors"]);
    assert!(check_absent(&target).is_err());
}

#[test]
fn what_appears_at_the_target_during_the_write_is_kept() {
    let test = "what_appears_at_the_target_during_the_write_is_kept";
    let dir = tempfile::tempdir().unwrap();
    let ours = random_bytes(test, 1 << 16);

    // Another writer (kiln or the user) creates the file while this write runs.
    let target = dir.path().join("out.safetensors");
    let theirs = random_bytes(test, 512);
    let err = atomically(&target, |out| {
        out.write_all(&ours[..100])?;
        fs::write(&target, &theirs).map_err(Failure::Io)?;
        Ok(out.write_all(&ours[100..])?)
    })
    .unwrap_err();
    refuses_existing(err, &target, "which appeared while kiln was writing");
    assert_eq!(fs::read(&target).unwrap(), theirs);

    // A dangling link that appears is kept too, and nothing is written through it.
    let link = dir.path().join("link.safetensors");
    let nowhere = dir.path().join("nowhere");
    let err = atomically(&link, |out| {
        symlink(&nowhere, &link).map_err(Failure::Io)?;
        Ok(out.write_all(&ours)?)
    })
    .unwrap_err();
    refuses_existing(err, &link, "dangling symbolic link");
    assert_eq!(fs::read_link(&link).unwrap(), nowhere);
    assert!(!nowhere.exists());
    assert_eq!(listing(dir.path()), ["link.safetensors", "out.safetensors"]);
}

#[test]
fn a_fresh_target_gets_the_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("plan.json");
    let bytes = random_bytes("a_fresh_target_gets_the_whole_file", 3 << 20);
    write_file_atomically(&target, &bytes).unwrap();
    assert_eq!(fs::read(&target).unwrap(), bytes);
    assert_eq!(listing(dir.path()), ["plan.json"]);
}

#[test]
fn the_hard_link_publish_never_replaces_either() {
    let dir = tempfile::tempdir().unwrap();
    let from = dir.path().join(".x.tmp");
    let bytes = random_bytes("the_hard_link_publish_never_replaces_either", 256);
    fs::write(&from, &bytes).unwrap();
    let to = dir.path().join("x");
    symlink(dir.path().join("nowhere"), &to).unwrap();
    let err = link_then_unlink(&from, &to).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
    let err = publish_no_replace(&from, &to).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AlreadyExists);
    assert!(fs::symlink_metadata(&to).unwrap().is_symlink());

    fs::remove_file(&to).unwrap();
    link_then_unlink(&from, &to).unwrap();
    assert_eq!(fs::read(&to).unwrap(), bytes);
    assert!(!from.exists(), "the temporary name is gone");
}

#[test]
fn in_flight_temporary_files_are_registered_until_the_write_ends() {
    let dir = tempfile::tempdir().unwrap();
    let mine = |paths: Vec<std::path::PathBuf>| {
        paths
            .into_iter()
            .filter(|p| p.starts_with(dir.path()))
            .collect::<Vec<_>>()
    };
    for fail in [false, true] {
        let target = dir.path().join(format!("out-{fail}"));
        let mut seen = Vec::new();
        let result = atomically(&target, |out| {
            seen = mine(in_flight_paths());
            out.write_all(b"partial")?;
            if fail {
                return Err(Failure::Kiln(Error::NoGradient));
            }
            Ok(())
        });
        assert_eq!(result.is_err(), fail);
        assert_eq!(seen.len(), 1, "{seen:?}");
        let name = seen[0].file_name().unwrap().to_string_lossy().into_owned();
        let prefix = format!(".out-{fail}.tmp-{}-", std::process::id());
        assert!(name.starts_with(&prefix), "{name}");
        assert!(!seen[0].exists());
        assert!(mine(in_flight_paths()).is_empty());
    }
    assert_eq!(listing(dir.path()), ["out-false"]);
}

/// The pid of a process that has exited and been reaped.
fn dead_pid() -> u32 {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn stale_temporary_files_of_dead_writers_are_swept() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Command::new("sleep").arg("60").spawn().unwrap();
    let (dead, alive) = (dead_pid(), live.id());
    let old = SystemTime::now() - Duration::from_secs(600);
    let leftover = |name: String, modified: Option<SystemTime>| {
        let path = dir.path().join(name);
        let file = fs::File::create(&path).unwrap();
        (&file)
            .write_all(&random_bytes("stale_temporary_files", 128))
            .unwrap();
        if let Some(modified) = modified {
            file.set_modified(modified).unwrap();
        }
    };
    leftover(format!(".out.safetensors.tmp-{dead}-0"), Some(old));
    leftover(format!(".out.safetensors.tmp-{dead}-1"), None);
    leftover(format!(".out.safetensors.tmp-{alive}-0"), Some(old));
    leftover(format!(".other.tmp-{dead}-0"), Some(old));
    leftover(format!(".out.safetensors.tmp-{dead}-x"), Some(old));

    write_safetensors(&dir.path().join("out.safetensors"), &one_tensor(), None).unwrap();
    live.kill().unwrap();
    live.wait().unwrap();
    let mut expected = vec![
        format!(".other.tmp-{dead}-0"),
        format!(".out.safetensors.tmp-{alive}-0"),
        format!(".out.safetensors.tmp-{dead}-1"),
        format!(".out.safetensors.tmp-{dead}-x"),
        "out.safetensors".to_string(),
    ];
    expected.sort();
    assert_eq!(
        listing(dir.path()),
        expected,
        "only the old file of the dead writer is swept"
    );
}
