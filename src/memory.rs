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

/// A byte count as a user writes it: `3500000000`, `3.3GiB`, `3300MiB`, `512KiB`, or with
/// SI units (`3.5GB`, `3500MB`, `kB`); the number may have a fraction, the result is rounded
/// down to whole bytes.
pub fn parse_bytes(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if let Ok(bytes) = trimmed.parse::<u64>() {
        return Ok(bytes);
    }
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024f64.powi(4),
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"
            ))
        }
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a byte count (e.g. 3500000000 or 3.3GiB)"))?;
    let bytes = value * scale;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(format!("`{text}` does not fit 64-bit byte counts"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod parse_tests {
    use super::parse_bytes;

    #[test]
    fn byte_counts_parse_with_binary_and_si_units_and_bad_ones_are_named() {
        assert_eq!(parse_bytes("3500000000"), Ok(3_500_000_000));
        assert_eq!(parse_bytes("3.5GiB"), Ok(3_758_096_384));
        assert_eq!(parse_bytes("512 MiB"), Ok(536_870_912));
        assert_eq!(parse_bytes("3.3GB"), Ok(3_300_000_000));
        assert_eq!(parse_bytes("7B"), Ok(7));
        assert_eq!(parse_bytes("18446744073709551615"), Ok(u64::MAX));
        for bad in ["", "GiB", "3.3 gigs", "1e30", "-1", "1.2.3"] {
            let error = parse_bytes(bad).unwrap_err();
            assert!(error.contains(bad.trim()), "{bad}: {error}");
        }
    }
}
