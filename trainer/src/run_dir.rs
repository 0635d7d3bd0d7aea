//! A run directory: made (or found empty) by a new run and marked as kiln's with
//! `kiln-run.json`, so a resume writes checkpoints, metrics and curves, and prunes old
//! checkpoints, only in a directory a run made — never in a folder a checkpoint was copied
//! into. One process at a time works in it: an exclusive lock on `kiln-run.json`, held for the
//! session, refuses a second trainer.

use std::fs::{self, File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub const MARKER_FILE: &str = "kiln-run.json";

/// A run directory, locked for this process while the value lives.
pub struct RunDir {
    path: PathBuf,
    /// Holds the lock (released when the file is closed).
    _lock: File,
}

fn refuse(path: &Path, reason: impl Into<String>) -> Error {
    Error::RunDir {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl RunDir {
    /// A new run's directory: created, or an existing empty one; anything else is refused.
    pub fn create(path: &Path) -> Result<RunDir> {
        match fs::read_dir(path) {
            Ok(mut entries) => {
                if entries.next().is_some() {
                    return Err(refuse(
                        path,
                        format!(
                            "is not empty; choose a new --out, or pass --resume {} to continue \
                             its run",
                            path.display()
                        ),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(path).map_err(|e| refuse(path, e.to_string()))?;
            }
            Err(e) => return Err(refuse(path, e.to_string())),
        }
        let marker = path.join(MARKER_FILE);
        fs::write(&marker, "{\"kiln\": \"run directory\"}\n")
            .map_err(|e| refuse(path, e.to_string()))?;
        RunDir::open(path)
    }

    /// An existing run directory (one with the marker), locked.
    pub fn open(path: &Path) -> Result<RunDir> {
        let path = fs::canonicalize(path).map_err(|e| refuse(path, e.to_string()))?;
        let marker = path.join(MARKER_FILE);
        let lock = OpenOptions::new().read(true).open(&marker).map_err(|_| {
            refuse(
                &path,
                format!(
                    "was not made by kiln train (no {MARKER_FILE}); pass --out with a new \
                     directory to continue this checkpoint's run there"
                ),
            )
        })?;
        // SAFETY: flock on a file descriptor this function owns.
        let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if locked != 0 {
            return Err(refuse(&path, "another kiln train is working in it"));
        }
        Ok(RunDir { path, _lock: lock })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_dir_is_made_new_marked_and_locked() {
        let dir = tempfile::tempdir().unwrap();
        let run = dir.path().join("run");
        let held = RunDir::create(&run).unwrap();
        assert!(run.join(MARKER_FILE).is_file());
        let second = RunDir::open(&run).err().unwrap().to_string();
        assert!(second.contains("another kiln train"), "{second}");
        drop(held);
        assert!(RunDir::open(&run).is_ok());
        // Not empty: refused. A folder without the marker: not a run directory.
        assert!(RunDir::create(&run)
            .err()
            .unwrap()
            .to_string()
            .contains("not empty"));
        let plain = dir.path().join("plain");
        fs::create_dir(&plain).unwrap();
        let err = RunDir::open(&plain).err().unwrap().to_string();
        assert!(err.contains("was not made by kiln train"), "{err}");
    }
}
