//! Reading a small text file of a model directory: regular files only, at most a given size.
//!
//! A FIFO blocks `open` until a writer appears and a device such as `/dev/zero` never ends:
//! either would hang generation or fill memory. The file is opened without blocking and refused
//! unless the opened handle is a regular file, checked on the handle so nothing swapped in
//! between a check and the open slips through.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

use crate::error::{Error, Result};

/// The UTF-8 text of the regular file at `path`, refused past `limit` bytes; `None` if nothing
/// is at `path`.
pub(crate) fn read_optional_text(path: &Path, limit: u64) -> Result<Option<String>> {
    let io_error = |reason: String| Error::Io {
        path: path.display().to_string(),
        reason,
    };
    let file = match open_nonblocking(path) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_error(format!("cannot open it: {e}"))),
    };
    let metadata = file
        .metadata()
        .map_err(|e| io_error(format!("cannot inspect it: {e}")))?;
    if !metadata.is_file() {
        return Err(io_error("not a regular file".to_string()));
    }
    let too_large = || io_error(format!("larger than the {limit}-byte limit"));
    if metadata.len() > limit {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    // The cap also holds for a file that grows while it is read.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(format!("cannot read it: {e}")))?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|e| io_error(format!("not UTF-8 text: {e}")))
}

fn open_nonblocking(path: &Path) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Reads of a regular file ignore the flag; without it, opening a FIFO waits for a
        // writer.
        options.custom_flags(libc::O_NONBLOCK);
    }
    options.open(path)
}
