//! Stopping on SIGINT or SIGTERM without leaving partial files behind.
//!
//! Writers stream into hidden temporary files beside their targets (up to gigabytes for a model);
//! a signal's default action would leave them behind. A thread of its own waits for either
//! signal, removes every temporary file in flight and exits with the shell's status for the
//! signal: 130 for SIGINT, 143 for SIGTERM.

use anyhow::{Context, Result};
use kiln_frontend::hf::safetensors_io::exit_removing_temp_files;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Installs the handler; call once, before any file is written.
pub fn install() -> Result<()> {
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).context("installing the SIGINT and SIGTERM handler")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                exit_removing_temp_files(128 + signal);
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}
