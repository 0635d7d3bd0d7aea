//! Temporary files beside a target, and publishing one under the target's name without ever
//! replacing what is there.
//!
//! A write goes to `.{name}.tmp-{pid}-{n}` in the target's directory (a rename is atomic only
//! within one file system) and is published by a rename that refuses an existing target:
//! `renameat2(RENAME_NOREPLACE)` on Linux, else a hard link and an unlink. Checking that the
//! target is absent and publishing are one step, so a file or link that appears at the target
//! while kiln writes (another kiln run, the user) is never replaced.
//!
//! Every temporary file in flight is registered, so that a process stopped by a signal can
//! remove them before it exits ([`exit_removing_temp_files`]). Files left by a process killed
//! outright are swept by the next write beside the same target once their writer is gone.

use std::ffi::{OsStr, OsString};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

/// Temporary files this process is writing now.
static IN_FLIGHT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// A stale-looking temporary file modified this recently is kept: its pid may belong to a
/// writer in another pid namespace or on another host sharing the directory.
const STALE_AFTER: Duration = Duration::from_secs(60);

fn in_flight() -> MutexGuard<'static, Vec<PathBuf>> {
    // A writer that panicked while holding the lock leaves a list that is still accurate.
    IN_FLIGHT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes every temporary file this process is writing and exits with `code`: for a process
/// stopped by a signal. The registry stays locked until the exit, so no writer can create a new
/// temporary file after the sweep.
pub fn exit_removing_temp_files(code: i32) -> ! {
    let registry = in_flight();
    for path in registry.iter() {
        // Nothing more can be done about a file that cannot be removed while exiting.
        let _ = fs::remove_file(path);
    }
    std::process::exit(code)
}

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

/// A registered temporary file beside a target; dropping it removes the file (a published
/// file has left its temporary name, so nothing is removed then).
pub(super) struct TempFile {
    pub path: PathBuf,
    target: PathBuf,
}

impl TempFile {
    /// Creates and registers a new temporary file for `target`, after sweeping stale ones;
    /// refuses a `target` that already exists (an early answer: [`TempFile::publish`] checks
    /// again, atomically). The file is created exclusively: an entry already at the temporary
    /// name, even a symbolic link, is never followed or truncated.
    pub fn create(target: &Path) -> Result<(TempFile, File)> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = target.file_name().ok_or_else(|| Error::Io {
            path: target.display().to_string(),
            reason: "not a file path (it has no file name)".into(),
        })?;
        check_absent(target)?;
        sweep_stale(target, name);
        let temp_name = temp_name(
            name,
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed),
        );
        let path = target.with_file_name(temp_name);
        // Created under the lock, so that a signal's sweep either sees the file or runs before
        // it exists.
        let mut registry = in_flight();
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| Error::Io {
                path: target.display().to_string(),
                reason: format!("cannot create the temporary file {}: {e}", path.display()),
            })?;
        registry.push(path.clone());
        drop(registry);
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
        let mut registry = in_flight();
        // Gone already once published by rename; the second name of a hard link, or a failed
        // write, goes here. Nothing more can be done if removal fails.
        let _ = fs::remove_file(&self.path);
        registry.retain(|p| p != &self.path);
    }
}

/// The temporary files registered now (tests run in parallel: look for your own).
#[cfg(test)]
pub(super) fn in_flight_paths() -> Vec<PathBuf> {
    in_flight().clone()
}

/// `.{name}.tmp-{pid}-{n}`: hidden, and naming its writer so a sweep can tell whether it runs.
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

/// Removes `.{name}.tmp-{pid}-{n}` files beside `target` whose writer no longer runs and that
/// have not changed for [`STALE_AFTER`]. Sweeping is a courtesy, not part of the write:
/// failures are ignored.
fn sweep_stale(target: &Path, name: &OsStr) {
    let Some(name) = name.to_str() else { return };
    let prefix = format!(".{name}.tmp-");
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(writer_pid)
        else {
            continue;
        };
        if pid == std::process::id() || process_may_run(pid) {
            continue;
        }
        let Ok(meta) = entry.metadata() else { continue };
        let quiet = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= STALE_AFTER);
        if meta.is_file() && quiet {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The pid of `{pid}-{n}`, the tail of a temporary name; `None` for any other text.
fn writer_pid(tail: &str) -> Option<u32> {
    let (pid, n) = tail.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(n)).then(|| pid.parse().ok())?
}

/// Whether process `pid` may still run. Without /proc nothing can be told, so every process
/// may.
fn process_may_run(pid: u32) -> bool {
    let proc = Path::new("/proc");
    !proc.join("self").exists() || proc.join(pid.to_string()).exists()
}
