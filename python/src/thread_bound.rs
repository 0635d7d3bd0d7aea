//! A value that must stay on the thread that made it (a model's oracle leaves, a program's
//! CUDA graphs), inside a Python object that any thread may hold.
//!
//! Invariants:
//! 1. The value is touched only on its owner thread: every access goes through [`get`] and
//!    [`get_mut`], which check the thread first and raise `kiln.KilnError` elsewhere.
//! 2. It is dropped only on its owner thread; an object the garbage collector frees on
//!    another thread leaks its value (with a warning on standard error) rather than drop it
//!    there.
//!
//! [`get`]: ThreadBound::get
//! [`get_mut`]: ThreadBound::get_mut

use std::mem::ManuallyDrop;
use std::thread::ThreadId;

use pyo3::PyResult;

use crate::errors::KilnError;

pub struct ThreadBound<T> {
    owner: ThreadId,
    what: &'static str,
    value: ManuallyDrop<T>,
}

// SAFETY: invariants 1 and 2: the value is only ever used and dropped on `owner`, so moving
// or sharing the wrapper between threads never moves or shares the value's use.
unsafe impl<T> Send for ThreadBound<T> {}
// SAFETY: as for Send.
unsafe impl<T> Sync for ThreadBound<T> {}

impl<T> ThreadBound<T> {
    /// Binds `value` (a `what`, for messages) to the current thread.
    pub fn new(value: T, what: &'static str) -> Self {
        ThreadBound {
            owner: std::thread::current().id(),
            what,
            value: ManuallyDrop::new(value),
        }
    }

    fn check(&self) -> PyResult<()> {
        match std::thread::current().id() == self.owner {
            true => Ok(()),
            false => Err(KilnError::new_err(format!(
                "this {} belongs to the thread that made it; use it there (or make another \
                 on this thread)",
                self.what
            ))),
        }
    }

    pub fn get(&self) -> PyResult<&T> {
        self.check()?;
        Ok(&self.value)
    }

    pub fn get_mut(&mut self) -> PyResult<&mut T> {
        self.check()?;
        Ok(&mut self.value)
    }
}

impl<T> Drop for ThreadBound<T> {
    fn drop(&mut self) {
        if std::thread::current().id() == self.owner {
            // SAFETY: dropped once, here, on its owner thread (invariant 2).
            unsafe { ManuallyDrop::drop(&mut self.value) };
        } else {
            eprintln!(
                "kiln: a {} freed on another thread than its own is leaked, not dropped",
                self.what
            );
        }
    }
}
