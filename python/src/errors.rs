//! kiln's errors as Python exceptions, each carrying kiln's message: a wrong dtype is a
//! `TypeError`, another bad argument a `ValueError`, anything kiln failed at a `kiln.KilnError`
//! (a `RuntimeError`).

use pyo3::create_exception;
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;

create_exception!(
    kiln,
    KilnError,
    PyRuntimeError,
    "kiln failed at the work itself (a model file, a kernel, a device); the message is kiln's."
);

/// The Python exception for `error`.
pub fn to_py(error: kiln_capi::Error) -> PyErr {
    let message = error.to_string();
    match &error {
        kiln_capi::Error::DType { .. } => PyTypeError::new_err(message),
        _ if error.is_argument() => PyValueError::new_err(message),
        _ => KilnError::new_err(message),
    }
}
