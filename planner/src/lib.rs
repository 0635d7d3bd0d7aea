//! kiln-planner: turns a program graph into a [`Plan`].
//!
//! It decides the schedule (a memory-aware topological order), groups values into buffers
//! (views and in-place results share their operand's buffer) with lifetimes in schedule steps,
//! places every activation and workspace in ONE arena (a portfolio of offset heuristics, the
//! smallest kept) and reports the exact lower bound of live bytes; with several streams it
//! assigns ops to streams and places the fewest events. An independent verifier checks plans;
//! dumps render them as text, JSON, CSV and SVG. The planner knows sizes, lifetimes and
//! dependencies, never pointers.

pub mod dump;
mod plan;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verify;

pub use plan::{Buffer, BufferClass, Plan, PlanOptions, Step};
pub use verify::{verify_plan, PlanError};
