//! Handles: numbers that name a model or a program in a registry of the thread that made it
//! (rule 2 of the module doc). Numbers are never reused, so a freed handle stays an error
//! forever instead of naming whatever came next.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::ThreadId;

use crate::error::{Error, Result};
use crate::session::{Model, Program};

/// The next handle number (0 is never handed out).
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Which thread each live handle belongs to, only to say so when another thread uses it.
static OWNERS: Mutex<BTreeMap<u64, ThreadId>> = Mutex::new(BTreeMap::new());

thread_local! {
    static MODELS: RefCell<BTreeMap<u64, Model>> = const { RefCell::new(BTreeMap::new()) };
    static PROGRAMS: RefCell<BTreeMap<u64, Program>> = const { RefCell::new(BTreeMap::new()) };
}

fn owners() -> std::sync::MutexGuard<'static, BTreeMap<u64, ThreadId>> {
    // The map holds plain ids; a panic elsewhere cannot leave it inconsistent.
    OWNERS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn issue() -> u64 {
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    owners().insert(id, std::thread::current().id());
    id
}

/// The error for a handle `id` of `kind` that this thread does not hold.
fn not_live(kind: &'static str, id: u64) -> Error {
    match owners().get(&id) {
        Some(owner) if *owner != std::thread::current().id() => Error::ForeignThread { kind, id },
        _ => Error::Handle { kind, id },
    }
}

pub(crate) fn add_model(model: Model) -> u64 {
    let id = issue();
    MODELS.with(|models| models.borrow_mut().insert(id, model));
    id
}

pub(crate) fn add_program(program: Program) -> u64 {
    let id = issue();
    PROGRAMS.with(|programs| programs.borrow_mut().insert(id, program));
    id
}

/// Runs `f` on live model `id`.
pub(crate) fn with_model<R>(id: u64, f: impl FnOnce(&Model) -> Result<R>) -> Result<R> {
    MODELS.with(|models| match models.borrow().get(&id) {
        Some(model) => f(model),
        None => Err(not_live("model", id)),
    })
}

/// Runs `f` on live program `id`.
pub(crate) fn with_program<R>(id: u64, f: impl FnOnce(&mut Program) -> Result<R>) -> Result<R> {
    PROGRAMS.with(|programs| match programs.borrow_mut().get_mut(&id) {
        Some(program) => f(program),
        None => Err(not_live("program", id)),
    })
}

/// Frees model `id`; its programs stay usable (they hold their own copy of the weights).
pub(crate) fn free_model(id: u64) -> Result<()> {
    match MODELS.with(|models| models.borrow_mut().remove(&id)) {
        Some(model) => {
            owners().remove(&id);
            drop(model);
            Ok(())
        }
        None => Err(not_live("model", id)),
    }
}

/// Frees program `id`.
pub(crate) fn free_program(id: u64) -> Result<()> {
    match PROGRAMS.with(|programs| programs.borrow_mut().remove(&id)) {
        Some(program) => {
            owners().remove(&id);
            drop(program);
            Ok(())
        }
        None => Err(not_live("program", id)),
    }
}
