//! Reading the small text files of a model directory: regular files only (a FIFO or a device
//! would block or never end), at most a given size.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::error::{Error, Result};

/// The text of the regular file at `path`, refused past `limit` bytes.
pub(crate) fn read_capped(path: &Path, limit: u64) -> Result<String> {
    let io = |reason: String| Error::Io {
        path: path.display().to_string(),
        reason,
    };
    // Checked before opening: opening a FIFO for reading blocks until a writer comes.
    let meta = std::fs::metadata(path).map_err(|e| io(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(io("not a regular file".to_string()));
    }
    if meta.len() > limit {
        return Err(io(format!(
            "{} bytes, more than the {limit} allowed",
            meta.len()
        )));
    }
    let file = File::open(path).map_err(|e| io(format!("cannot open it: {e}")))?;
    let mut text = String::new();
    // The cap holds even if the file grows after the check.
    (file.take(limit + 1).read_to_string(&mut text))
        .map_err(|e| io(format!("cannot read it as UTF-8 text: {e}")))?;
    if text.len() as u64 > limit {
        return Err(io(format!("more than the {limit} bytes allowed")));
    }
    Ok(text)
}
