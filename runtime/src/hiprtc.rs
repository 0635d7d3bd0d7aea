//! hipRTC, AMD's runtime compiler, loaded when first used: its own library since ROCm 6
//! (`libhiprtc`), part of `libamdhip64` before. Nothing is needed to build kiln, and hipRTC
//! needs no GPU, so every kernel module is compiled for AMD architectures on any machine that
//! has the library (CI installs Debian's `libamdhip64-dev`).

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

use libloading::Library;

use crate::error::{Error, Result};

type Program = *mut c_void;
type Create = unsafe extern "C" fn(
    *mut Program,
    *const c_char,
    *const c_char,
    c_int,
    *const *const c_char,
    *const *const c_char,
) -> c_int;
type CompileProgram = unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int;
type Size = unsafe extern "C" fn(Program, *mut usize) -> c_int;
type Bytes = unsafe extern "C" fn(Program, *mut c_char) -> c_int;
type Destroy = unsafe extern "C" fn(*mut Program) -> c_int;
type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// The libraries that may hold hipRTC, newest first.
const LIBRARIES: [&str; 3] = ["libhiprtc.so", "libamdhip64.so", "libamdhip64.so.5"];

fn error(what: impl Into<String>, reason: impl std::fmt::Display) -> Error {
    Error::Device {
        backend: "hip",
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// hipRTC's library, loaded once; `None` where none of [`LIBRARIES`] loads.
fn library() -> Option<&'static Library> {
    static LIBRARY: OnceLock<Option<Library>> = OnceLock::new();
    LIBRARY
        .get_or_init(|| {
            LIBRARIES
                .iter()
                // SAFETY: loading a vendor library runs its initializers, which are sound to
                // run.
                .find_map(|&name| unsafe { Library::new(name) }.ok())
        })
        .as_ref()
}

/// Why hipRTC cannot be used here, or `None` when it can.
pub fn unavailable() -> Option<String> {
    match library() {
        Some(_) => None,
        None => Some(format!("hipRTC cannot be loaded (none of {LIBRARIES:?})")),
    }
}

fn symbol<T: Copy>(name: &str) -> Result<T> {
    let lib = library().ok_or_else(|| error("hipRTC", unavailable().unwrap_or_default()))?;
    // SAFETY: every caller names a hipRTC function with the C signature `T` (hiprtc.h).
    let symbol = unsafe { lib.get::<T>(name.as_bytes()) };
    symbol
        .map(|s| *s)
        .map_err(|e| error(format!("hipRTC's `{name}`"), e))
}

/// hipRTC's version, `major.minor`.
pub fn version() -> Result<String> {
    let version: Version = symbol("hiprtcVersion")?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both pointers are valid for writes.
    match unsafe { version(&mut major, &mut minor) } {
        0 => Ok(format!("{major}.{minor}")),
        rc => Err(error(
            "hipRTC version",
            format!("hiprtcVersion returned {rc}"),
        )),
    }
}

/// Module `name`'s code object compiled by hipRTC with `options`, and the compile log (its
/// warnings; empty when there are none); the log is in the error when it fails.
pub(crate) fn compile(name: &str, source: &str, options: &[String]) -> Result<(Vec<u8>, String)> {
    let what = || format!("hipRTC compile of `{name}.cu`");
    let create: Create = symbol("hiprtcCreateProgram")?;
    let compile: CompileProgram = symbol("hiprtcCompileProgram")?;
    let log_size: Size = symbol("hiprtcGetProgramLogSize")?;
    let log: Bytes = symbol("hiprtcGetProgramLog")?;
    let code_size: Size = symbol("hiprtcGetCodeSize")?;
    let code: Bytes = symbol("hiprtcGetCode")?;
    let destroy: Destroy = symbol("hiprtcDestroyProgram")?;
    let text = CString::new(source).map_err(|e| error(what(), e))?;
    let file = CString::new(format!("{name}.cu")).map_err(|e| error(what(), e))?;
    let options = (options.iter())
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| error(what(), e))?;
    let pointers: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: the functions have these C signatures (hiprtc.h); every pointer passed lives
    // through its call, the buffers have the sizes hipRTC reported, and the program is
    // destroyed once.
    unsafe {
        let mut program: Program = std::ptr::null_mut();
        let (null, none) = (std::ptr::null(), std::ptr::null());
        let rc = create(&mut program, text.as_ptr(), file.as_ptr(), 0, null, none);
        if rc != 0 {
            return Err(error(what(), format!("hiprtcCreateProgram returned {rc}")));
        }
        let compiled = compile(program, pointers.len() as c_int, pointers.as_ptr());
        let mut bytes = 0usize;
        log_size(program, &mut bytes);
        let mut buffer = vec![0u8; bytes.max(1)];
        log(program, buffer.as_mut_ptr().cast());
        let text = String::from_utf8_lossy(&buffer)
            .trim_end_matches('\0')
            .trim()
            .to_string();
        let mut object = Vec::new();
        let fetched = match compiled {
            0 => {
                let mut size = 0usize;
                let sized = code_size(program, &mut size);
                object.resize(size, 0u8);
                match sized {
                    0 => code(program, object.as_mut_ptr().cast()),
                    rc => rc,
                }
            }
            rc => rc,
        };
        destroy(&mut program);
        match (compiled, fetched) {
            (0, 0) => Ok((object, text)),
            (0, rc) => Err(error(
                what(),
                format!("reading the code object returned {rc}"),
            )),
            (rc, _) => Err(error(
                what(),
                format!("hiprtcCompileProgram returned {rc}\n{text}"),
            )),
        }
    }
}
