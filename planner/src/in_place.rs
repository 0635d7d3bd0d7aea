//! Which writes of persistent inputs (AdamW's params and moments, KV caches) a backend may
//! compute directly in the input's own storage, with no output buffer and no copy back.
//!
//! A write `name ← value` is in place when all of these hold:
//! 1. `value` is a result of an op that may overwrite (`Alias::MayOverwrite(i)`) its operand
//!    `i`, and that operand is the input `name` itself;
//! 2. the write's buffer holds `value` and views of it only;
//! 3. every other op that reads the input (itself or through views) happens-before the writer:
//!    earlier on its stream, or ordered before it by the plan's events.
//!
//! Otherwise the value lives in its own output buffer and is copied into the input after the
//! last step. The plan verifier checks each in-place write against these rules independently.

use kiln_ir::Alias;

use crate::buffers::Buffers;
use crate::program::{Producer, Program, Value};
use crate::streams::StreamPlan;

/// The writes of `program` (run in `order` with `streams`) that may be computed in place, by
/// name, in the graph's order.
pub(crate) fn in_place_writes(
    program: &Program,
    order: &[usize],
    buffers: &Buffers,
    streams: &StreamPlan,
) -> Vec<String> {
    let mut step_of_op = vec![usize::MAX; program.ops.len()];
    for (step, &op) in order.iter().enumerate() {
        step_of_op[op] = step;
    }
    let in_place = |name: &str, value: Value| -> bool {
        // 1: an op that may overwrite the input itself.
        let Some((op, operand)) = overwritten_operand(program, value) else {
            return false;
        };
        let Some(input) = program.inputs.iter().find(|input| input.name == name) else {
            return false;
        };
        if operand != input.value {
            return false;
        }
        // 2: the buffer holds the write and its views only.
        let views = views_of(program, value);
        let buffer = buffers.of_value[value];
        let holds_only_the_write = (buffers.of_value.iter().enumerate())
            .filter(|(_, &b)| b == buffer)
            .all(|(v, _)| views.contains(&v));
        if !holds_only_the_write {
            return false;
        }
        // 3: every other reader of the input finishes before the writer starts.
        let writer = step_of_op[op];
        views_of(program, input.value).iter().all(|&v| {
            program.values[v].readers.iter().all(|&(reader, _)| {
                reader == op
                    || is_view(program, reader)
                    || streams.happens_before(step_of_op[reader], writer)
            })
        })
    };
    (program.writes.iter())
        .filter(|(name, value)| in_place(name, *value))
        .map(|(name, _)| name.to_string())
        .collect()
}

/// The op that computes `value` and the operand it may overwrite there
/// (`Alias::MayOverwrite`), if it may.
pub(crate) fn overwritten_operand(program: &Program, value: Value) -> Option<(usize, Value)> {
    let Producer::Op { op, port } = program.values[value].producer else {
        return None;
    };
    let info = &program.ops[op];
    let Alias::MayOverwrite(i) = info.op.alias(port) else {
        return None;
    };
    Some((op, *info.operands.get(i)?))
}

/// `value` and every value that is (transitively) a view of it, ascending. Views come after
/// their operand in value order (ops are in topological order), so one pass finds them all.
fn views_of(program: &Program, value: Value) -> Vec<Value> {
    let mut found = vec![value];
    for v in value + 1..program.values.len() {
        let Producer::Op { op, port } = program.values[v].producer else {
            continue;
        };
        let info = &program.ops[op];
        if let Alias::ViewOf(i) = info.op.alias(port) {
            if info.operands.get(i).is_some_and(|o| found.contains(o)) {
                found.push(v);
            }
        }
    }
    found
}

fn is_view(program: &Program, op: usize) -> bool {
    (0..program.ops[op].results.len())
        .any(|port| matches!(program.ops[op].op.alias(port), Alias::ViewOf(_)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use crate::test_graphs::synthetic_train;
    use crate::{plan, verify_plan, PlanOptions};

    /// Per write: whether every reader of its input, other than the writer, runs before the
    /// writer in a one-stream schedule (the rule, computed from the schedule alone).
    fn expected(graph: &kiln_ir::Graph, planned: &crate::Plan) -> Vec<String> {
        let step_of: BTreeMap<usize, usize> = (planned.schedule.iter().enumerate())
            .map(|(i, s)| (s.node, i))
            .collect();
        let mut expected = Vec::new();
        for (name, value) in graph.writes() {
            let input = graph.input_named(name).unwrap();
            let writer = step_of[&value.node.index()];
            let readers_before = graph.node_indices().all(|node| {
                let reads = graph.operands(node).contains(&input);
                node == value.node || !reads || step_of[&node.index()] < writer
            });
            if readers_before {
                expected.push(name.clone());
            }
        }
        expected
    }

    #[test]
    fn writes_are_in_place_exactly_when_every_other_reader_ran_first() {
        let graph = synthetic_train(3, 8, 16);
        let planned = plan(
            &graph,
            &PlanOptions::default(),
            &crate::testing::TestWorkspaces,
        )
        .unwrap();
        let want = expected(&graph, &planned);
        assert_eq!(planned.in_place_writes, want);
        // The moments are read by their update alone: always in place.
        assert!(want.iter().any(|w| w == "adamw.m.w0") && want.iter().any(|w| w == "adamw.v.w2"));
        verify_plan(&graph, &planned, &crate::testing::TestWorkspaces).unwrap();
    }

    #[test]
    fn the_verifier_refuses_in_place_writes_that_break_a_rule() {
        let graph = synthetic_train(3, 8, 16);
        let mut refused_a_reader = 0;
        for streams in [1, 2] {
            let options = PlanOptions {
                streams,
                ..PlanOptions::default()
            };
            let planned = plan(&graph, &options, &crate::testing::TestWorkspaces).unwrap();
            verify_plan(&graph, &planned, &crate::testing::TestWorkspaces).unwrap();
            // A name that is no write.
            let mut bad = planned.clone();
            bad.in_place_writes.push("x".to_string());
            let err = verify_plan(&graph, &bad, &crate::testing::TestWorkspaces).unwrap_err();
            assert_eq!(err.rule, "in_place", "{err}");
            // Every write is in place: with two streams each update waits for the other
            // readers of what it writes (the backward GEMMs reading the params).
            assert_eq!(planned.in_place_writes.len(), graph.writes().len());
            // Without those waits, its writes in place are refused.
            let mut bad = planned.clone();
            for step in bad
                .schedule
                .iter_mut()
                .filter(|s| s.op.starts_with("adamw"))
            {
                step.waits.clear();
            }
            if bad.schedule != planned.schedule {
                let err = verify_plan(&graph, &bad, &crate::testing::TestWorkspaces).unwrap_err();
                assert_eq!(err.rule, "in_place", "{err}");
                assert!(err.detail.contains("does not happen before"), "{err}");
                refused_a_reader += 1;
            }
        }
        assert!(refused_a_reader > 0, "no update waited for a reader");
    }
}
