//! Temporary files beside a target, and publishing one under the target's name without ever
//! replacing what is there.
//!
//! A write goes to `.{name}.tmp-{pid}-{n}` in the target's directory (a rename is atomic only
//! within one file system) and is published by a rename that refuses an existing target:
//! `renameat2(RENAME_NOREPLACE)` on Linux, else a hard link and an unlink. Checking that the
//! target is absent and publishing are one step, so a file or link that appears at the target
//! while kiln writes (another kiln run, the user) is never replaced.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Refuses `path` if anything is there, a dangling symbolic link included: kiln never replaces
/// an existing path. Writers check this before their work for an early answer; the publish
/// itself checks again, atomically.
pub fn check_absent(path: &Path) -> Result<()> {
    match fs::symlink_metadata(path) {
        Ok(_) => Err(already_exists(path, None)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::Io {
            path: path.display().to_string(),
            reason: format!("cannot tell whether it already exists: {e}"),
        }),
    }
}

/// The error for an existing `path`, saying what is there.
fn already_exists(path: &Path, when: Option<&str>) -> Error {
    let what = match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_symlink() => match fs::read_link(path) {
            Ok(to) if fs::metadata(path).is_err() => {
                format!("a dangling symbolic link to {}", to.display())
            }
            Ok(to) => format!("a symbolic link to {}", to.display()),
            Err(_) => "a symbolic link".to_string(),
        },
        Ok(meta) if meta.is_dir() => "a directory".to_string(),
        Ok(meta) if meta.is_file() => "a file".to_string(),
        Ok(_) => "a special file".to_string(),
        Err(_) => "an entry that has since gone".to_string(),
    };
    let what = match when {
        Some(when) => format!("{what}, {when}"),
        None => what,
    };
    Error::AlreadyExists {
        path: path.display().to_string(),
        what,
    }
}

/// A temporary file beside a target; dropping it removes the file (a published
/// file has left its temporary name, so nothing is removed then).
pub(super) struct TempFile {
    pub path: PathBuf,
    target: PathBuf,
}

impl TempFile {
    /// Creates a new temporary file for `target`; refuses a `target` that already exists (an early answer: [`TempFile::publish`] checks
    /// again, atomically). The file is created exclusively: an entry already at the temporary
    /// name, even a symbolic link, is never followed or truncated.
    pub fn create(target: &Path) -> Result<(TempFile, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = target.file_name().ok_or_else(|| Error::Io {
            path: target.display().to_string(),
            reason: "not a file path (it has no file name)".into(),
        })?;
        check_absent(target)?;
        let temp_name = temp_name(
            name,
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
        );
        let path = target.with_file_name(temp_name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::Io {
                path: target.display().to_string(),
                reason: format!("cannot create the temporary file {}: {e}", path.display()),
            })?;
        let temp = TempFile {
            path,
            target: target.to_path_buf(),
        };
        Ok((temp, file))
    }

    /// Gives the (synced, closed) temporary file the target's name, unless something is
    /// already there.
    pub fn publish(self) -> Result<()> {
        publish_no_replace(&self.path, &self.target).map_err(|e| {
            if e.kind() == io::ErrorKind::AlreadyExists {
                already_exists(&self.target, Some("which appeared while kiln was writing"))
            } else {
                Error::Io {
                    path: self.target.display().to_string(),
                    reason: format!("cannot move the new file into place: {e}"),
                }
            }
        })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        // Gone already once published by rename; the second name of a hard link, or a failed
        // write, goes here. Nothing more can be done if removal fails.
        let _ = fs::remove_file(&self.path);
    }
}

/// `.{name}.tmp-{pid}-{n}`: hidden; the pid and counter keep writers apart.
fn temp_name(name: &OsStr, pid: u32, n: u64) -> OsString {
    let mut temp = OsString::from(".");
    temp.push(name);
    temp.push(format!(".tmp-{pid}-{n}"));
    temp
}

/// Moves `from` to `to` unless `to` exists (as anything, a dangling symbolic link included).
pub(super) fn publish_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    match rename_no_replace(from, to) {
        // The file system or kernel lacks the flag; a hard link gives the same guarantee.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::ENOSYS | libc::ENOTSUP)
            ) => {}
        other => return other,
    }
    link_then_unlink(from, to)
}

#[cfg(target_os = "linux")]
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let from = CString::new(from.as_os_str().as_bytes())?;
    let to = CString::new(to.as_os_str().as_bytes())?;
    // The raw system call, not libc's wrapper, which older C libraries lack.
    // SAFETY: both paths are NUL-terminated and outlive the call; AT_FDCWD resolves them
    // relative to the working directory, as open(2) would.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// link(2) fails on any existing entry at `to`; the temporary name is then removed (by the
/// caller's [`TempFile`] should this unlink fail).
pub(super) fn link_then_unlink(from: &Path, to: &Path) -> io::Result<()> {
    fs::hard_link(from, to)?;
    let _ = fs::remove_file(from);
    Ok(())
}
