//! Compiled kernel modules on disk: NVRTC's cubin (or hipRTC's code object) for one module,
//! architecture and set of options, kept under the user's cache directory so that a later
//! process loads it instead of compiling again.
//!
//! Where: `$KILN_CACHE_DIR`, else `$XDG_CACHE_HOME/kiln`, else `~/.cache/kiln`, and within it
//! `kernels/`. An entry is named by a SHA-256 key over the module's name and source, the compile
//! options, the architecture, the compiler and its version, so any change to any of them misses. Each
//! file holds a header (magic, the key again, the payload's length and SHA-256) before the
//! code; an entry whose header, length or checksum does not match — truncated, garbage, or a
//! file of another key under this name — is reported and rebuilt, never loaded. Entries are
//! written to a temporary file in the same directory, synced, then renamed over the name, so
//! a reader (another process filling the cache at the same time, say) sees a whole entry or
//! none. Neither compiler needs a GPU, so all of this is tested on the CPU machine.
//!
//! Records: small values under a key of the caller's (the GEMM algorithm chosen by timing for
//! a matmul on a device and library version, `runtime/src/cuda/gemm_tuning.rs`), kept in the
//! same directory in the same entry format, so that a later process makes the same choice.
//! `info` and `clear` count and remove them with the modules.

use std::ffi::{CStr, CString};
use std::io::Write;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result, sys};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

const MAGIC: &[u8; 10] = b"KILNCUBIN\x01";
const HEADER: usize = MAGIC.len() + 32 + 8 + 32;
const EXTENSION: &str = "kcubin";
const RECORD_EXTENSION: &str = "krecord";

/// A runtime compiler of kiln's kernel modules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compiler {
    /// NVIDIA's, to a cubin for an `sm_XY` architecture.
    Nvrtc,
    /// AMD's, to a code object for a `gfxNNN` architecture ([`crate::hiprtc`]).
    Hiprtc,
}

impl Compiler {
    fn name(self) -> &'static str {
        match self {
            Compiler::Nvrtc => "NVRTC",
            Compiler::Hiprtc => "hipRTC",
        }
    }

    /// The options every module is compiled with for `arch`.
    fn options(self, arch: &str) -> Vec<String> {
        match self {
            Compiler::Nvrtc => vec![format!("--gpu-architecture={arch}")],
            Compiler::Hiprtc => vec![format!("--gpu-architecture={arch}"), "-std=c++17".into()],
        }
    }

    fn version(self) -> Result<String> {
        match self {
            Compiler::Nvrtc => nvrtc_version(),
            Compiler::Hiprtc => crate::hiprtc::version(),
        }
    }

    /// The compiler of `arch`: NVRTC for an NVIDIA `sm_NN` (or `sm_NNa`), hipRTC for an AMD
    /// `gfxNNN`.
    pub fn of_arch(arch: &str) -> Result<Compiler> {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let nvidia =
            (arch.strip_prefix("sm_")).is_some_and(|n| digits(n.strip_suffix('a').unwrap_or(n)));
        let amd = (arch.strip_prefix("gfx"))
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_alphanumeric()));
        match (nvidia, amd) {
            (true, _) => Ok(Compiler::Nvrtc),
            (_, true) => Ok(Compiler::Hiprtc),
            _ => Err(Error::Device {
                backend: "kernel cache",
                what: format!("architecture `{arch}`"),
                reason: "expected sm_NN (NVIDIA, NVRTC) or gfxNNN (AMD, hipRTC)".to_string(),
            }),
        }
    }

    /// Why the compiler's library cannot be loaded, if it cannot.
    pub fn unavailable(self) -> Option<String> {
        match self {
            // SAFETY: only probes whether the library can be loaded.
            Compiler::Nvrtc => (!unsafe { sys::is_culib_present() }).then(|| {
                "libnvrtc could not be loaded: install NVIDIA's NVRTC (the CUDA toolkit, or \
                 the nvidia-cuda-nvrtc wheel) and put its directory on LD_LIBRARY_PATH"
                    .to_string()
            }),
            Compiler::Hiprtc => crate::hiprtc::unavailable(),
        }
    }

    /// The compiler's name and version as the cache's keys hold them (`NVRTC 13.0`).
    pub fn describe(self) -> Result<String> {
        Ok(format!("{} {}", self.name(), self.version()?))
    }

    /// Module `name` compiled for `arch` with the options the cache uses, and the compile log
    /// (its warnings; empty when there are none). No cache is read or written.
    pub fn compile(self, name: &str, source: &str, arch: &str) -> Result<(Vec<u8>, String)> {
        let options = self.options(arch);
        match self {
            Compiler::Nvrtc => compile_cubin(name, source, &options),
            Compiler::Hiprtc => crate::hiprtc::compile(name, source, &options),
        }
    }
}

/// Where compiled modules are kept, or nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

/// How a module was obtained.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Read from the cache.
    Hit,
    /// Compiled: no entry, or no cache.
    Compiled,
    /// Compiled again because the entry could not be trusted (the reason).
    Rebuilt(String),
}

/// One module's machine code (a cubin, a code object) and where it came from.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub code: Vec<u8>,
    pub origin: Origin,
    /// Why the entry could not be written (the module is still good), if it could not.
    pub write_error: Option<String>,
}

/// What the cache holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheInfo {
    pub dir: Option<PathBuf>,
    pub entries: usize,
    pub bytes: u64,
}

impl KernelCache {
    /// The cache the environment names (see the module doc); none when no directory can be
    /// named (no `HOME`).
    pub fn from_env() -> Self {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = var("KILN_CACHE_DIR")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("kiln")))
            .or_else(|| var("HOME").map(|d| d.join(".cache").join("kiln")));
        KernelCache {
            dir: root.map(|root| root.join("kernels")),
        }
    }

    /// A cache in `dir` itself.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        KernelCache {
            dir: Some(dir.into()),
        }
    }

    /// No cache: every module is compiled.
    pub fn disabled() -> Self {
        KernelCache { dir: None }
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// Module `name` compiled by `compiler` for `arch` (`sm_90`, `gfx90a`): from the cache
    /// when a valid entry exists, else compiled and stored.
    pub fn module(
        &self,
        compiler: Compiler,
        name: &str,
        source: &str,
        arch: &str,
    ) -> Result<Compiled> {
        let options = compiler.options(arch);
        let key = key(name, source, &options, arch, &compiler.describe()?);
        let path = self.dir.as_ref().map(|dir| dir.join(file_name(name, &key)));
        let mut origin = Origin::Compiled;
        if let Some(path) = &path {
            match read_entry(path, &key) {
                Ok(Some(code)) => {
                    return Ok(Compiled {
                        code,
                        origin: Origin::Hit,
                        write_error: None,
                    })
                }
                Ok(None) => {}
                Err(reason) => origin = Origin::Rebuilt(format!("{}: {reason}", path.display())),
            }
        }
        let (code, _log) = compiler.compile(name, source, arch)?;
        let write_error = match &path {
            Some(path) => write_entry(path, &key, &code)
                .err()
                .map(|e| format!("{}: {e}", path.display())),
            None => None,
        };
        Ok(Compiled {
            code,
            origin,
            write_error,
        })
    }

    /// Every module of `sources` (name, text) for `arch`, as [`KernelCache::module`] gives
    /// it, the missing ones compiled in parallel; in the order of `sources`.
    pub fn modules(
        &self,
        compiler: Compiler,
        arch: &str,
        sources: &[(&'static str, &'static str)],
    ) -> Vec<Result<Compiled>> {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (sources.iter())
                .map(|(name, source)| scope.spawn(|| self.module(compiler, name, source, arch)))
                .collect();
            (handles.into_iter().zip(sources))
                .map(|(handle, (name, _))| {
                    handle.join().unwrap_or_else(|_| {
                        Err(Error::Device {
                            backend: "kernel cache",
                            what: format!("compiling `{name}`"),
                            reason: "the compiling thread panicked".to_string(),
                        })
                    })
                })
                .collect()
        })
    }

    /// The entries (modules and records) and their bytes.
    pub fn info(&self) -> Result<CacheInfo> {
        let (mut entries, mut bytes) = (0, 0);
        for path in self.entries()? {
            entries += 1;
            bytes += std::fs::metadata(&path).map_or(0, |m| m.len());
        }
        Ok(CacheInfo {
            dir: self.dir.clone(),
            entries,
            bytes,
        })
    }

    /// Removes every entry, modules and records (nothing else in the directory); returns how
    /// many.
    pub fn clear(&self) -> Result<usize> {
        let entries = self.entries()?;
        for path in &entries {
            std::fs::remove_file(path).map_err(|e| io_error(path, "remove", &e))?;
        }
        Ok(entries.len())
    }

    /// The record of `kind` under `key` ([`KernelCache::store_record`]): `Ok(None)` when there
    /// is none (or no cache), `Err(reason)` when there is one that cannot be trusted.
    pub fn record(&self, kind: &str, key: &str) -> std::result::Result<Option<Vec<u8>>, String> {
        let Some((path, hash)) = self.record_entry(kind, key) else {
            return Ok(None);
        };
        read_entry(&path, &hash).map_err(|reason| format!("{}: {reason}", path.display()))
    }

    /// Keeps `payload` as the record of `kind` under `key`, replacing any; nothing without a
    /// cache. The error names the file.
    pub fn store_record(
        &self,
        kind: &str,
        key: &str,
        payload: &[u8],
    ) -> std::result::Result<(), String> {
        let Some((path, hash)) = self.record_entry(kind, key) else {
            return Ok(());
        };
        write_entry(&path, &hash, payload).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The file of the record of `kind` under `key`, and its entry key; none without a cache.
    fn record_entry(&self, kind: &str, key: &str) -> Option<(PathBuf, [u8; 32])> {
        let hash = record_key(kind, key);
        let dir = self.dir.as_ref()?;
        Some((dir.join(record_name(kind, &hash)), hash))
    }

    fn entries(&self) -> Result<Vec<PathBuf>> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
        let listing = match std::fs::read_dir(dir) {
            Ok(listing) => listing,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(dir, "list", &e)),
        };
        let mut paths: Vec<PathBuf> = (listing.filter_map(|entry| entry.ok()))
            .map(|entry| entry.path())
            .filter(|path| {
                (path.extension()).is_some_and(|e| e == EXTENSION || e == RECORD_EXTENSION)
            })
            .collect();
        paths.sort();
        Ok(paths)
    }
}

fn io_error(path: &Path, what: &str, e: &std::io::Error) -> Error {
    Error::Device {
        backend: "cuda",
        what: format!("kernel cache: {what} {}", path.display()),
        reason: e.to_string(),
    }
}

fn nvrtc_error(what: String, reason: impl std::fmt::Display) -> Error {
    Error::Device {
        backend: "cuda",
        what,
        reason: reason.to_string(),
    }
}

/// NVRTC's version, `major.minor`.
fn nvrtc_version() -> Result<String> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for writes.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| nvrtc_error("NVRTC version".to_string(), format!("{e:?}")))?;
    Ok(format!("{major}.{minor}"))
}

/// The entry's key: SHA-256 over every input of the compile.
fn key(name: &str, source: &str, options: &[String], arch: &str, version: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in [MAGIC.as_slice(), name.as_bytes(), source.as_bytes()] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part);
    }
    for part in options.iter().map(String::as_str).chain([arch, version]) {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize().into()
}

fn hex(key: &[u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

fn file_name(name: &str, key: &[u8; 32]) -> String {
    format!("{name}-{}.{EXTENSION}", hex(key))
}

/// A record's key: SHA-256 over its kind and the caller's key, apart from every module's.
fn record_key(kind: &str, key: &str) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in [RECORD_EXTENSION, kind, key] {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    hash.finalize().into()
}

fn record_name(kind: &str, key: &[u8; 32]) -> String {
    format!("{kind}-{}.{RECORD_EXTENSION}", hex(key))
}

/// The entry's code; `None` when there is no entry; `Err(reason)` when there is one that
/// cannot be trusted.
fn read_entry(path: &Path, key: &[u8; 32]) -> std::result::Result<Option<Vec<u8>>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot be read: {e}")),
    };
    if bytes.len() < HEADER || &bytes[..MAGIC.len()] != MAGIC {
        return Err(format!("{} bytes without the entry header", bytes.len()));
    }
    let (stored_key, rest) = bytes[MAGIC.len()..].split_at(32);
    if stored_key != key {
        return Err("the entry of another compile".to_string());
    }
    let (length, rest) = rest.split_at(8);
    let (checksum, payload) = rest.split_at(32);
    let length = u64::from_le_bytes(length.try_into().expect("8 bytes"));
    if length != payload.len() as u64 {
        return Err(format!(
            "truncated: {} of {length} payload bytes",
            payload.len()
        ));
    }
    if Sha256::digest(payload).as_slice() != checksum {
        return Err("its checksum does not match its contents".to_string());
    }
    Ok(Some(payload.to_vec()))
}

/// Writes the entry through a synced temporary file renamed over `path`.
fn write_entry(path: &Path, key: &[u8; 32], code: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::Builder::new()
        .prefix(".tmp-")
        .suffix(".part")
        .tempfile_in(dir)?;
    file.write_all(MAGIC)?;
    file.write_all(key)?;
    file.write_all(&(code.len() as u64).to_le_bytes())?;
    file.write_all(&Sha256::digest(code))?;
    file.write_all(code)?;
    // Readable by every user who shares the cache (a temporary file starts private).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// NVRTC's cubin of one module and its log; the log is in the error when it fails.
fn compile_cubin(name: &str, source: &str, options: &[String]) -> Result<(Vec<u8>, String)> {
    let what = || format!("NVRTC compile of `{name}.cu`");
    let source = CString::new(source).map_err(|e| nvrtc_error(what(), e))?;
    let file = CString::new(format!("{name}.cu")).map_err(|e| nvrtc_error(what(), e))?;
    let program = result::create_program(&source, Some(&file))
        .map_err(|e| nvrtc_error(what(), format!("{e:?}")))?;
    // SAFETY: `program` was created above and is destroyed once, below; every pointer passed
    // stays valid across its call, and the cubin buffer has the size NVRTC reported.
    unsafe {
        let compiled = result::compile_program(program, options);
        let log = result::get_program_log(program)
            .map(|raw| {
                CStr::from_ptr(raw.as_ptr())
                    .to_string_lossy()
                    .trim()
                    .to_string()
            })
            .unwrap_or_default();
        let cubin = compiled.and_then(|()| {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(program, &mut size).result()?;
            let mut cubin = vec![0u8; size];
            sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr().cast()).result()?;
            Ok(cubin)
        });
        let _ = result::destroy_program(program);
        match cubin {
            Ok(cubin) => Ok((cubin, log)),
            Err(e) => Err(nvrtc_error(what(), format!("{e:?}\n{log}"))),
        }
    }
}
