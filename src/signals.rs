//! Stopping on SIGINT or SIGTERM without leaving partial files behind.
//!
//! Writers stream into hidden temporary files beside their targets (up to gigabytes for a model);
//! a signal's default action would leave them behind. A thread of its own waits for either
//! signal, removes every temporary file in flight and exits with the shell's status for the
//! signal: 130 for SIGINT, 143 for SIGTERM. A command with a boundary to stop at (a training
//! run's next step) asks for [`install_graceful`]: the first signal raises a flag, the second
//! exits as above.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use kiln_frontend::hf::safetensors_io::exit_removing_temp_files;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Installs the handler; call once, before any file is written.
pub fn install() -> Result<()> {
    spawn(None).map(|_| ())
}

/// Installs the handler with a stop flag: the first signal sets the flag (and says so on
/// standard error), the second exits at once.
pub fn install_graceful() -> Result<Arc<AtomicBool>> {
    spawn(Some(
        "stopping after this step and writing a checkpoint (again to stop at once)",
    ))
}

fn spawn(graceful: Option<&'static str>) -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut signals =
        Signals::new([SIGINT, SIGTERM]).context("installing the SIGINT and SIGTERM handler")?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                match graceful {
                    Some(message) if !flag.swap(true, Ordering::Relaxed) => {
                        eprintln!("\n{message}");
                    }
                    _ => exit_removing_temp_files(128 + signal),
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(stop)
}
