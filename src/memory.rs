//! Whether a run fits the memory of the device it runs on, checked before anything is
//! allocated: what a program needs follows from its types and its plan, so a batch too large
//! for the machine is refused with both numbers instead of failing in the allocator.

use anyhow::{bail, Result};
use kiln_planner::Plan;

/// Bytes of physical memory of this machine (`MemTotal` of Linux's `/proc/meminfo`), `None`
/// where it cannot be read.
pub fn host_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Bytes of every value of `graph` at once: what an eager run keeping its whole tape holds.
pub fn graph_bytes(graph: &kiln_ir::Graph) -> u64 {
    graph
        .node_indices()
        .filter_map(|node| graph.node(node))
        .flat_map(|node| &node.outputs)
        .fold(0u64, |sum, ty| sum.saturating_add(ty.size_bytes() as u64))
}

/// Bytes binding `plan` allocates: its arena and every buffer outside it (parameters, inputs,
/// outputs, state).
pub fn plan_bytes(plan: &Plan) -> u64 {
    plan.buffers
        .iter()
        .filter(|buffer| !buffer.class.in_arena())
        .fold(plan.arena_bytes, |sum, buffer| {
            sum.saturating_add(buffer.size)
        })
}

/// Refuses a run of `what` that needs `need` bytes of a device with `memory` bytes (`device`
/// names it in the error).
pub fn ensure_fits(what: &str, need: u64, memory: u64, device: &str) -> Result<()> {
    if need > memory {
        bail!(
            "{what} needs {need} bytes ({}), more than the {memory} bytes ({}) of {device}",
            gib(need),
            gib(memory)
        );
    }
    Ok(())
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}
