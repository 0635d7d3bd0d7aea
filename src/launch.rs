//! `kiln launch`: one process per GPU, each one rank of a world of `--nproc` ranks, as
//! `torchrun` starts a PyTorch job.
//!
//! What the launcher gives each process it starts (its environment):
//! - `KILN_RANK` (0..N), `KILN_WORLD_SIZE` (N) and `KILN_LOCAL_RANK`, the ordinal of the one
//!   CUDA device the rank owns (all ranks run on this host);
//! - `KILN_RENDEZVOUS`, a file in a directory of the launcher's own: rank 0 makes the NCCL
//!   unique id and publishes it there ([`publish`]: written beside it, then renamed, so no
//!   rank ever reads a partial id); every other rank waits for it ([`wait_for`]) and gets the
//!   same bytes;
//! - `KILN_RENDEZVOUS_DEADLINE`, the Unix time (seconds) by which the id must be there: a rank
//!   still waiting then stops with an error naming the file;
//! - `NCCL_NVLS_ENABLE=0`: NVLink multicast stays off (on a shared host it can put every GPU
//!   out of service), whatever the caller's environment says; `NCCL_RUNTIME_CONNECT=0`: NCCL
//!   connects the ranks when the communicator is made, not on a first collective inside a
//!   graph capture.
//!
//! A rank dies with the launcher (`PR_SET_PDEATHSIG`).
//!
//! Each rank leads a process group of its own. The launcher waits for every rank. The first
//! that fails (exits non-zero, or dies by a signal) stops the others — SIGTERM to their
//! groups, then SIGKILL after a grace period — and the launch
//! fails with an error naming it and its status. SIGINT or SIGTERM to the launcher is passed
//! on to every rank (a training run stops at its next step and writes its checkpoint); a
//! second one kills them. The rendezvous directory is removed at the end.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};

/// The environment variable names of the launcher's contract (see the module doc).
pub const RANK: &str = "KILN_RANK";
pub const WORLD_SIZE: &str = "KILN_WORLD_SIZE";
pub const LOCAL_RANK: &str = "KILN_LOCAL_RANK";
pub const RENDEZVOUS: &str = "KILN_RENDEZVOUS";
pub const RENDEZVOUS_DEADLINE: &str = "KILN_RENDEZVOUS_DEADLINE";

/// The most ranks one launch starts (one per GPU of a host; larger hosts do not exist).
pub const MAX_PROCESSES: usize = 64;

/// What a process started by `kiln launch` is (read from its environment).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rank {
    pub rank: usize,
    pub world_size: usize,
    /// The CUDA device ordinal this rank owns.
    pub local_rank: usize,
    rendezvous: PathBuf,
    deadline: SystemTime,
}

impl Rank {
    /// This process's rank, or `None` when it was not started by `kiln launch` (no
    /// `KILN_RANK`); an error naming the variable when the launcher's variables are
    /// incomplete or malformed.
    pub fn from_env() -> Result<Option<Rank>> {
        let Some(rank) = std::env::var_os(RANK) else {
            return Ok(None);
        };
        let var = |name: &str| -> Result<String> {
            std::env::var(name).map_err(|_| {
                anyhow!("{name} is not set (or not text), but {RANK} is: start ranks with `kiln launch`")
            })
        };
        let number = |name: &str, text: &str| -> Result<usize> {
            text.parse()
                .map_err(|_| anyhow!("{name}={text:?} is not a number"))
        };
        let rank = number(RANK, &rank.to_string_lossy())?;
        let world_size = number(WORLD_SIZE, &var(WORLD_SIZE)?)?;
        let local_rank = number(LOCAL_RANK, &var(LOCAL_RANK)?)?;
        if world_size == 0 || world_size > MAX_PROCESSES || rank >= world_size {
            bail!("{RANK}={rank} is not a rank of {WORLD_SIZE}={world_size}");
        }
        let deadline = var(RENDEZVOUS_DEADLINE)?;
        let deadline =
            UNIX_EPOCH + Duration::from_secs(number(RENDEZVOUS_DEADLINE, &deadline)? as u64);
        Ok(Some(Rank {
            rank,
            world_size,
            local_rank,
            rendezvous: PathBuf::from(var(RENDEZVOUS)?),
            deadline,
        }))
    }

    /// This rank's GPU (`KILN_LOCAL_RANK`) joined to the launch's NCCL communicator, and the
    /// communicator's host side.
    pub fn join(
        &self,
    ) -> Result<(
        std::sync::Arc<kiln_runtime::cuda::CudaDevice>,
        std::sync::Arc<dyn kiln_runtime::collective::Communicator>,
    )> {
        nccl_built(Some(self))?;
        let device = kiln_runtime::cuda::CudaDevice::open(self.local_rank).with_context(|| {
            format!(
                "rank {} of {}: --device cuda {}",
                self.rank, self.world_size, self.local_rank
            )
        })?;
        let communicator = join_nccl(&device, Some(self))?;
        Ok((device, communicator))
    }

    /// The id every rank shares: rank 0 makes it (`make`) and publishes it; the others wait for
    /// it until the launcher's deadline.
    pub fn share_id<const N: usize>(
        &self,
        make: impl FnOnce() -> Result<[u8; N]>,
    ) -> Result<[u8; N]> {
        if self.rank == 0 {
            let id = make()?;
            publish(&self.rendezvous, &id)?;
            return Ok(id);
        }
        let bytes = wait_for(&self.rendezvous, N, self.deadline)?;
        bytes
            .try_into()
            .map_err(|_| anyhow!("the rendezvous file held the wrong number of bytes"))
    }
}

/// `device` joined to the NCCL communicator of `rank`'s launch (a world of one without a
/// launch), and the communicator's host side.
#[cfg(feature = "nccl")]
pub fn join_nccl(
    device: &std::sync::Arc<kiln_runtime::cuda::CudaDevice>,
    rank: Option<&Rank>,
) -> Result<std::sync::Arc<dyn kiln_runtime::collective::Communicator>> {
    use kiln_runtime::cuda::nccl;
    let (this, size) = rank.map_or((0, 1), |r| (r.rank, r.world_size));
    let what = || format!("rank {this} of {size}");
    let id = match rank {
        Some(rank) => rank.share_id(|| Ok(nccl::unique_id()?)),
        None => Ok(nccl::unique_id()?),
    }
    .with_context(what)?;
    device.join_nccl(&id, this, size).with_context(what)?;
    Ok(std::sync::Arc::new(nccl::NcclCommunicator::new(
        device.clone(),
    )?))
}

/// Without the `nccl` feature: an error saying how to build it.
#[cfg(not(feature = "nccl"))]
pub fn join_nccl(
    _: &std::sync::Arc<kiln_runtime::cuda::CudaDevice>,
    rank: Option<&Rank>,
) -> Result<std::sync::Arc<dyn kiln_runtime::collective::Communicator>> {
    nccl_built(rank)?;
    unreachable!("nccl_built fails without the nccl feature")
}

/// Fails, saying how to build it, where this kiln has no NCCL (asked before a device opens).
pub fn nccl_built(rank: Option<&Rank>) -> Result<()> {
    let (this, size) = rank.map_or((0, 1), |r| (r.rank, r.world_size));
    if !cfg!(feature = "nccl") {
        bail!(
            "rank {this} of {size}: this kiln was built without NCCL; build it with `cargo \
             build --release --features nccl` to run on several GPUs"
        );
    }
    Ok(())
}

/// Writes `bytes` to `path` all at once for readers: into a file beside it, synced, then
/// renamed into place. An existing `path` is an error (one id per launch).
pub fn publish(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("rendezvous {}: not a file path", path.display()))?;
    let mut partial = name.to_os_string();
    partial.push(format!(".{}.partial", std::process::id()));
    let partial = path.with_file_name(partial);
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()
    };
    write().with_context(|| format!("writing rendezvous {}", partial.display()))?;
    // A hard link fails where the target exists, which a rename would replace.
    let linked = std::fs::hard_link(&partial, path);
    let _ = std::fs::remove_file(&partial);
    linked.with_context(|| format!("publishing rendezvous {}", path.display()))
}

/// The `len` bytes at `path` once it exists, polling until `deadline`.
pub fn wait_for(path: &Path, len: usize, deadline: SystemTime) -> Result<Vec<u8>> {
    loop {
        match std::fs::read(path) {
            Ok(bytes) if bytes.len() == len => return Ok(bytes),
            Ok(bytes) => bail!(
                "rendezvous {}: {} bytes where {len} were expected",
                path.display(),
                bytes.len()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(e).with_context(|| format!("reading rendezvous {}", path.display()))
            }
        }
        if SystemTime::now() >= deadline {
            bail!(
                "rendezvous {}: rank 0 published nothing before the launcher's deadline (did \
                 it fail?)",
                path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How to launch.
pub struct LaunchOptions {
    pub nproc: usize,
    /// How long the ranks may take to meet (the rendezvous deadline).
    pub rendezvous_timeout: Duration,
    /// How long a rank may take to stop on SIGTERM before it is killed.
    pub grace: Duration,
    /// The command each rank runs; a first word `kiln` is this kiln.
    pub command: Vec<OsString>,
}

/// Runs `options.command` as `options.nproc` ranks and waits for them (see the module doc).
pub fn launch(options: &LaunchOptions) -> Result<()> {
    let nproc = options.nproc;
    if nproc == 0 || nproc > MAX_PROCESSES {
        bail!("--nproc {nproc}: must be 1 to {MAX_PROCESSES} (one rank per GPU)");
    }
    let Some((program, args)) = options.command.split_first() else {
        bail!("no command to launch: kiln launch --nproc N -- kiln train ...");
    };
    let program = match program.to_str() {
        Some("kiln") => std::env::current_exe()
            .context("finding this kiln")?
            .into_os_string(),
        _ => program.clone(),
    };
    let dir = RendezvousDir::create()?;
    let deadline = SystemTime::now() + options.rendezvous_timeout;
    let deadline = deadline
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let signals = ForwardedSignals::install()?;
    let mut ranks: Vec<(usize, Child)> = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let mut child = Command::new(&program);
        child
            .args(args)
            .env(RANK, rank.to_string())
            .env(WORLD_SIZE, nproc.to_string())
            .env(LOCAL_RANK, rank.to_string())
            .env(RENDEZVOUS, dir.path.join("nccl-id"))
            .env(RENDEZVOUS_DEADLINE, deadline.to_string())
            .env("NCCL_NVLS_ENABLE", "0")
            // Every connection made when the communicator is created, none lazily on a first
            // collective of some size inside a graph capture (which refuses allocations).
            .env("NCCL_RUNTIME_CONNECT", "0")
            .stdin(Stdio::null())
            // Its own process group, so a signal reaches whatever the rank started too.
            .process_group(0);
        // SAFETY: prctl only, between fork and exec: a rank dies with the launcher rather
        // than sit on its GPU orphaned.
        let child = unsafe {
            child.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        }
        .spawn();
        match child {
            Ok(child) => ranks.push((rank, child)),
            Err(e) => {
                stop(&mut ranks, options.grace);
                return Err(e).with_context(|| {
                    format!("starting rank {rank}: {}", Path::new(&program).display())
                });
            }
        }
    }
    let mut forwarded = 0;
    loop {
        let asked = signals.count();
        if asked > forwarded {
            forwarded = asked;
            let signal = if asked > 1 {
                libc::SIGKILL
            } else {
                signals.last()
            };
            for (_, child) in &ranks {
                send(child, signal);
            }
        }
        let mut finished = None;
        for (at, (rank, child)) in ranks.iter_mut().enumerate() {
            match child.try_wait() {
                Ok(Some(status)) => {
                    finished = Some((at, *rank, status));
                    break;
                }
                Ok(None) => {}
                Err(e) => {
                    let rank = *rank;
                    stop(&mut ranks, options.grace);
                    return Err(e).with_context(|| format!("waiting for rank {rank}"));
                }
            }
        }
        match finished {
            Some((at, _, status)) if status.success() => {
                ranks.remove(at);
                if ranks.is_empty() {
                    return Ok(());
                }
            }
            Some((at, rank, status)) => {
                ranks.remove(at);
                let others: Vec<String> = ranks.iter().map(|(r, _)| r.to_string()).collect();
                stop(&mut ranks, options.grace);
                let stopped = match others.is_empty() {
                    true => String::new(),
                    false => format!("; stopped ranks {}", others.join(", ")),
                };
                bail!("rank {rank} of {nproc} {}{stopped}", describe(status));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// `exited with status 3`, `was killed by signal 9`.
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".to_string(),
    }
}

/// Sends `signal` to the rank's process group (the rank leads it).
fn send(child: &Child, signal: i32) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: signals the group of a child this process started and has not reaped yet.
        unsafe { libc::kill(-pid, signal) };
    }
}

/// SIGTERM to every rank, SIGKILL to those still running after `grace`; reaps them all.
fn stop(ranks: &mut [(usize, Child)], grace: Duration) {
    for (_, child) in ranks.iter() {
        send(child, libc::SIGTERM);
    }
    let end = Instant::now() + grace;
    for (_, child) in ranks.iter_mut() {
        while Instant::now() < end && matches!(child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if matches!(child.try_wait(), Ok(None)) {
            send(child, libc::SIGKILL);
        }
        let _ = child.wait();
    }
}

/// The launcher's private directory for the rendezvous file, removed when dropped.
struct RendezvousDir {
    path: PathBuf,
}

impl RendezvousDir {
    fn create() -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let path = std::env::temp_dir().join(format!("kiln-launch-{}-{nanos}", std::process::id()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .with_context(|| format!("creating the rendezvous directory {}", path.display()))?;
        Ok(RendezvousDir { path })
    }
}

impl Drop for RendezvousDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// SIGINT and SIGTERM to the launcher, counted, for passing on to the ranks.
struct ForwardedSignals {
    count: Arc<AtomicUsize>,
    last: Arc<AtomicUsize>,
}

impl ForwardedSignals {
    fn install() -> Result<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let (count, last) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
            .context("installing the SIGINT and SIGTERM handler")?;
        let (c, l) = (Arc::clone(&count), Arc::clone(&last));
        std::thread::Builder::new()
            .name("launch-signals".into())
            .spawn(move || {
                for signal in signals.forever() {
                    l.store(signal as usize, Ordering::SeqCst);
                    c.fetch_add(1, Ordering::SeqCst);
                }
            })
            .context("starting the signal thread")?;
        Ok(ForwardedSignals { count, last })
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    fn last(&self) -> i32 {
        self.last.load(Ordering::SeqCst) as i32
    }
}

#[cfg(test)]
#[path = "launch_tests.rs"]
mod tests;
