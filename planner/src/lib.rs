//! kiln-planner: turns a program graph into a [`Plan`].
//!
//! It decides the schedule (a memory-aware topological order), groups values into buffers
//! (views and in-place results share their operand's buffer) with lifetimes in schedule steps,
//! places every activation and workspace in ONE arena (a portfolio of offset heuristics, the
//! smallest kept) and reports the exact lower bound of live bytes; with several streams it
//! assigns ops to streams and places the fewest events. An independent verifier checks plans;
//! dumps render them as text, JSON, CSV and SVG. The planner knows sizes, lifetimes and
//! dependencies, never pointers.

mod budget;
mod buffers;
pub mod dump;
mod error;
mod hash;
mod in_place;
mod offsets;
mod plan;
mod planner;
mod program;
mod schedule;
mod streams;
#[cfg(test)]
mod test_graphs;
#[cfg(feature = "testing")]
pub mod testing;
pub mod verify;
mod workspaces;

pub use budget::{plan_within, Budgeted};
pub use error::{Error, Result};
pub use hash::{fnv1a64, plan_hash};
pub use offsets::{arena_size, lower_bound, portfolio, ArenaItem, Fit, Greedy, OffsetHeuristic};
pub use plan::{Buffer, BufferClass, Plan, PlanOptions, Recomputed, Step};
pub use planner::{plan, MAX_STREAMS};
pub use verify::{verify_plan, PlanError};
pub use workspaces::WorkspaceNeeds;
