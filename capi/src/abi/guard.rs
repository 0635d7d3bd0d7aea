//! The boundary every extern function crosses: run the body under `catch_unwind`, record the
//! error message thread-locally, and turn the outcome into a status code (rules 1 and 5 of
//! the module doc).

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use super::*;
use crate::error::{Error, Result};

thread_local! {
    /// The last failure's message on this thread; empty after a success.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The status code for `error`.
pub(crate) fn status_of(error: &Error) -> KilnStatus {
    match error {
        Error::NullPointer { .. } => KILN_STATUS_NULL_POINTER,
        Error::Argument { .. } => KILN_STATUS_INVALID_ARGUMENT,
        Error::DType { .. } => KILN_STATUS_DTYPE,
        Error::Shape { .. } => KILN_STATUS_SHAPE,
        Error::Runtime(kiln_runtime::Error::InputType { .. }) => KILN_STATUS_SHAPE,
        Error::Runtime(kiln_runtime::Error::Layout(_) | kiln_runtime::Error::HostBytes { .. }) => {
            KILN_STATUS_SHAPE
        }
        Error::Device { .. } | Error::Runtime(kiln_runtime::Error::DeviceMemory { .. }) => {
            KILN_STATUS_DEVICE
        }
        Error::NotFound { .. } | Error::Frontend(kiln_frontend::Error::ModelSource { .. }) => {
            KILN_STATUS_NOT_FOUND
        }
        Error::Handle { .. } | Error::ForeignThread { .. } => KILN_STATUS_INVALID_HANDLE,
        Error::Panic(_) => KILN_STATUS_INTERNAL,
        other if other.is_argument() => KILN_STATUS_INVALID_ARGUMENT,
        _ => KILN_STATUS_FAILED,
    }
}

fn record(message: &str) {
    // A message with an interior NUL is cut there rather than lost.
    let bytes: Vec<u8> = message.bytes().take_while(|&b| b != 0).collect();
    let message = CString::new(bytes).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = message);
}

/// Runs `body`, catching a panic; records the message of a failure (clears it on success).
pub(crate) fn guard(body: impl FnOnce() -> Result<()>) -> KilnStatus {
    let outcome = catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let message = (panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".to_string());
        Err(Error::Panic(message))
    });
    match outcome {
        Ok(()) => {
            record("");
            KILN_STATUS_OK
        }
        Err(error) => {
            record(&error.to_string());
            status_of(&error)
        }
    }
}

/// The message of the last failed call on this thread ("" after a success). The pointer stays
/// valid until the next kiln call on this thread; the caller never frees it.
#[no_mangle]
pub extern "C" fn kiln_last_error() -> *const c_char {
    // Reading a thread-local cannot panic once initialized; a failure here yields "".
    catch_unwind(|| LAST_ERROR.with(|last| last.borrow().as_ptr())).unwrap_or(c"".as_ptr())
}

/// `pointer` as a string argument, checked for null and UTF-8.
///
/// # Safety
/// A non-null `pointer` must point at a NUL-terminated string valid for the call.
pub(crate) unsafe fn string_argument<'a>(
    pointer: *const c_char,
    argument: &'static str,
) -> Result<&'a str> {
    if pointer.is_null() {
        return Err(Error::NullPointer { argument });
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    let text = unsafe { CStr::from_ptr(pointer) };
    text.to_str()
        .map_err(|_| Error::argument(argument, "is not valid UTF-8"))
}
