//! Planning under a memory budget: when the plan's arena exceeds the budget, values the
//! backward reads are recomputed there instead of kept from the forward
//! (`kiln_ir::recompute`), the least work per byte freed first (elementwise ops and casts
//! before products), as few as fit: the fewest candidates of that order whose plan fits, found
//! by bisection over how many are taken (each try a whole plan). A recomputed value is the
//! same op on the same operands, so the budgeted step computes the same bits.

use kiln_ir::recompute::{backward_start, candidates, recompute, Candidate};
use kiln_ir::{Graph, ValueId};

use crate::hash::plan_hash;
use crate::planner::plan_behind;
use crate::{plan, Error, Plan, PlanOptions, Recomputed, Result, WorkspaceNeeds};

/// A plan that fits its budget and the graph it plans (the given one with the recomputed
/// values' clones, or the given one itself when it fits as it is).
pub struct Budgeted {
    pub graph: Graph,
    pub plan: Plan,
}

/// Plans `graph` so that its arena holds at most `budget` bytes, recomputing in the backward
/// (which begins at the first reader of the gradient `seed`) what it must. An error names the
/// smallest arena reachable when even recomputing every candidate does not fit.
pub fn plan_within(
    graph: &Graph,
    options: &PlanOptions,
    workspaces: &dyn WorkspaceNeeds,
    (budget, seed): (u64, ValueId),
) -> Result<Budgeted> {
    let unbudgeted = plan(graph, options, workspaces)?;
    if unbudgeted.arena_bytes <= budget {
        return Ok(Budgeted {
            graph: graph.clone(),
            plan: unbudgeted,
        });
    }
    let start = backward_start(graph, seed).ok_or_else(|| Error::Unplannable {
        rule: "memory budget",
        detail: format!("no op reads the gradient seed {seed}: only a backward recomputes"),
    })?;
    let seed_name = match graph.node(seed.node).map(|n| &n.kind) {
        Some(kiln_ir::graph::NodeKind::Input { name, .. }) => Some(name.as_str()),
        _ => None,
    };
    let mut order = candidates(graph, start)?;
    // Least estimated time per byte freed first; ties in graph order.
    order.sort_by(|a, b| {
        let cost = |c: &Candidate| c.estimated_us() / c.bytes.max(1) as f64;
        cost(a).total_cmp(&cost(b)).then(a.value.cmp(&b.value))
    });
    let attempt = |count: usize| -> Result<Budgeted> {
        let chosen = &order[..count];
        let (rebuilt, clones) = recompute(graph, chosen, start)?;
        // The clones' operands all exist in the forward: the barrier keeps every schedule
        // from running them there, which would keep their bytes across the step again.
        let new_start = seed_name
            .and_then(|name| rebuilt.input_named(name))
            .and_then(|seed| backward_start(&rebuilt, seed));
        let mut plan = plan_behind(&rebuilt, options, workspaces, new_start)?;
        let name = |v: ValueId| format!("{}.{}", v.node.index(), v.port);
        // The chain's ops in order, the value's own producer last.
        let op_text = |c: &Candidate| {
            let names = c
                .nodes
                .iter()
                .filter_map(|&n| match graph.node(n).map(|n| &n.kind) {
                    Some(kiln_ir::graph::NodeKind::Op(op)) => Some(op.name()),
                    _ => None,
                });
            names.collect::<Vec<_>>().join(" > ")
        };
        plan.recomputed = (chosen.iter().zip(clones))
            .map(|(c, (value, clone))| Recomputed {
                value: name(value),
                clone: name(clone),
                op: op_text(c),
                bytes: c.bytes,
                ops: c.nodes.len(),
                estimated_ns: (c.estimated_us() * 1e3).round() as u64,
            })
            .collect();
        plan.recomputed
            .sort_by_key(|r| (c_node(&r.value), r.value.clone()));
        plan.hash = plan_hash(&plan)?;
        Ok(Budgeted {
            graph: rebuilt,
            plan,
        })
    };
    let all = attempt(order.len())?;
    if all.plan.arena_bytes > budget {
        return Err(Error::Budget {
            budget,
            smallest: all.plan.arena_bytes,
            unbudgeted: unbudgeted.arena_bytes,
            candidates: order.len(),
        });
    }
    // `low` does not fit (none taken: the unbudgeted plan), `high` does.
    let (mut low, mut high, mut best) = (0, order.len(), all);
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        let tried = attempt(middle)?;
        if tried.plan.arena_bytes <= budget {
            (high, best) = (middle, tried);
        } else {
            low = middle;
        }
    }
    Ok(best)
}

/// The node index of a `"node.port"` name (for ordering).
fn c_node(name: &str) -> usize {
    name.split('.')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
