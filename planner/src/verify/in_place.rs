//! The rule `in_place`: each write the plan computes in its input's storage satisfies the
//! rules of the planner's `in_place.rs` (its chain of overwrites included), recomputed here
//! from the graph and the plan's own schedule and events.

use std::collections::BTreeMap;

use kiln_ir::graph::NodeKind;
use kiln_ir::{Alias, Graph};

use super::order::{is_view, HappensBefore};
use super::{fail, show, PlanError, Program, Value};
use crate::Plan;

/// Checks `in_place`.
pub(super) fn check_in_place(
    graph: &Graph,
    program: &Program,
    plan: &Plan,
    (buffer_of, step_of): (&BTreeMap<Value, usize>, &BTreeMap<usize, usize>),
    order: &HappensBefore,
) -> Result<(), PlanError> {
    let writes: Vec<&str> = graph.writes().iter().map(|(n, _)| n.as_str()).collect();
    let listed: Vec<&str> = (writes.iter().copied())
        .filter(|w| plan.in_place_writes.iter().any(|n| n == w))
        .collect();
    if listed.len() != plan.in_place_writes.len() || listed != plan.in_place_writes {
        // Names that are no write, or repeated, or out of the graph's order.
        let detail = format!(
            "{:?} is not a list of the graph's writes in their order ({writes:?})",
            plan.in_place_writes
        );
        return fail("in_place", detail);
    }
    let mut reads: BTreeMap<Value, usize> = BTreeMap::new();
    for operand in program.ops.values().flat_map(|op| &op.operands) {
        *reads.entry(*operand).or_default() += 1;
    }
    for (name, write) in graph.writes() {
        if !plan.in_place_writes.contains(name) {
            continue;
        }
        let value = (write.node.index(), write.port);
        let what = format!("write `{name}` ({}) in place", show(value));
        let input = graph.node_indices().find(|&node| {
            matches!(graph.node(node).map(|n| &n.kind), Some(NodeKind::Input { name: n, .. }) if n == name)
        });
        let Some(input) = input.map(|node| (node.index(), 0)) else {
            return fail(
                "in_place",
                format!("{what}: the graph has no input `{name}`"),
            );
        };
        // 1: computed by a chain of overwrites that starts at the input itself.
        let chain = overwrite_chain(program, &reads, value);
        let first = match chain.last() {
            Some(&(node, operand)) if operand == input => node,
            _ => {
                let detail = format!("{what}: its ops do not overwrite the input `{name}`");
                return fail("in_place", detail);
            }
        };
        // 2: its buffer holds the write, views of it and the chain's other results only.
        let mut held = views_of(program, value);
        held.extend(chain[..chain.len() - 1].iter().map(|&(_, operand)| operand));
        let buffer = buffer_of.get(&value);
        if let Some((other, _)) =
            (buffer_of.iter()).find(|(v, b)| Some(*b) == buffer && !held.contains(v))
        {
            let detail = format!("{what}: its buffer also holds {}", show(*other));
            return fail("in_place", detail);
        }
        // 3: every other reader of the input (or a view of it) happens before the chain's
        // first op.
        let Some(&writer) = step_of.get(&first) else {
            return fail("in_place", format!("{what}: its op is not scheduled"));
        };
        let input_views = views_of(program, input);
        for (&node, op) in &program.ops {
            let reads = op.operands.iter().any(|o| input_views.contains(o));
            if node == first || !reads || is_view(op.op) {
                continue;
            }
            match step_of.get(&node) {
                Some(&reader) if order.before(reader, writer) => {}
                _ => {
                    // The reader might see the new content instead of the old.
                    let detail = format!(
                        "{what}: {} reads the input and does not happen before step {writer}",
                        program.describe(node)
                    );
                    return fail("in_place", detail);
                }
            }
        }
    }
    Ok(())
}

/// The ops that compute `value` each over the operand it may overwrite (`Alias::MayOverwrite`),
/// last first: `value`'s op, and while that operand is the result of another such op, read
/// once (`reads`: operand edges per value) and not kept after the run (neither an output nor a
/// write), that op too.
fn overwrite_chain(
    program: &Program,
    reads: &BTreeMap<Value, usize>,
    mut value: Value,
) -> Vec<(usize, Value)> {
    let mut chain = Vec::new();
    while let Some(op) = program.ops.get(&value.0) {
        let Alias::MayOverwrite(i) = op.op.alias(value.1) else {
            break;
        };
        let Some(&operand) = op.operands.get(i) else {
            break;
        };
        chain.push((value.0, operand));
        if reads.get(&operand) != Some(&1) || program.kept.contains(&operand) {
            break;
        }
        value = operand;
    }
    chain
}

/// `value` and every value that is (transitively) a view of it. Ops are keyed by node index,
/// a topological order, so one pass in that order finds them all.
fn views_of(program: &Program, value: Value) -> Vec<Value> {
    let mut found = vec![value];
    for (&node, op) in program.ops.range(value.0 + 1..) {
        let of_found = op.operands.first().is_some_and(|o| found.contains(o));
        if is_view(op.op) && of_found {
            found.push((node, 0));
        }
    }
    found
}
