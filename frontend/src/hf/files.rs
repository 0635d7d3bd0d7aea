//! Opening the files kiln reads (config, shard index, weights, tokens): regular files only, and
//! text files up to a size cap.
//!
//! A FIFO blocks `open` until a writer appears and a character device such as `/dev/zero` never
//! ends: either would hang kiln or fill its memory. Files are opened without blocking and
//! refused unless the opened handle is a regular file (checked on the handle, so nothing swapped
//! in between a check and the open slips through).
//!
//! Errors are the reason in words; the caller adds the path and what the file is.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;

/// Largest `config.json` read: real configs are kilobytes, label-heavy ones under a megabyte.
pub(crate) const CONFIG_LIMIT: u64 = 16 << 20;

/// Largest shard index read: it lists the tensor names a header does, so it gets the header's
/// limit.
pub(crate) const INDEX_LIMIT: u64 = 100_000_000;

/// Opens `path` for reading if it is a regular file (symbolic links followed).
pub(crate) fn open_regular(path: &Path) -> Result<File, String> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Without it, opening a FIFO waits for a writer. Reads and maps of a regular file
        // ignore the flag.
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path).map_err(|e| e.to_string())?;
    let kind = file
        .metadata()
        .map_err(|e| format!("cannot inspect it: {e}"))?
        .file_type();
    if !kind.is_file() {
        return Err(format!("it is {}, not a regular file", kind_name(kind)));
    }
    Ok(file)
}

/// Reads the regular file `path` as UTF-8 text of at most `limit` bytes.
pub(crate) fn read_text(path: &Path, limit: u64) -> Result<String, String> {
    let too_large = |size: String| format!("it is {size} bytes, over the {limit}-byte limit");
    let file = open_regular(path)?;
    let size = file
        .metadata()
        .map_err(|e| format!("cannot inspect it: {e}"))?
        .len();
    if size > limit {
        return Err(too_large(size.to_string()));
    }
    // The cap also holds for a file that grows while it is read.
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > limit {
        return Err(too_large(format!("more than {limit}")));
    }
    String::from_utf8(bytes).map_err(|e| format!("it is not UTF-8 text: {e}"))
}

#[cfg(unix)]
fn kind_name(kind: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "an entry of another kind"
    }
}

#[cfg(not(unix))]
fn kind_name(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else {
        "an entry of another kind"
    }
}

#[cfg(all(test, unix))]
#[path = "files_tests.rs"]
mod tests;
