//! Which writes of persistent inputs (AdamW's params and moments, KV caches) a backend may
//! compute directly in the input's own storage, with no output buffer and no copy back.
//!
//! A write `name ← value` is computed by its chain of overwrites ([`overwrite_chain`]): the op
//! of `value`, which may overwrite (`Alias::MayOverwrite(i)`) its operand `i`, and, while that
//! operand is itself such a result read by nothing else, its op, and so on (an AdamW is a chain
//! of one; the embedding update's unnamed rows and then its named rows a chain of two). The
//! write is in place when all of these hold:
//! 1. the chain ends at the input `name` itself: its first op overwrites that input;
//! 2. the write's buffer holds `value`, views of it and the chain's other results only;
//! 3. every op but the chain's first that reads the input (itself or through views)
//!    happens-before the chain's first op: earlier on its stream, or ordered before it by the
//!    plan's events.
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
        // 1: a chain that ends at the input itself.
        let chain = overwrite_chain(program, value);
        let Some(&(op, operand)) = chain.last() else {
            return false;
        };
        let Some(input) = program.inputs.iter().find(|input| input.name == name) else {
            return false;
        };
        if operand != input.value {
            return false;
        }
        // 2: the buffer holds the write, its views and the chain's other results only.
        let mut held = views_of(program, value);
        held.extend(chain[..chain.len() - 1].iter().map(|&(_, operand)| operand));
        let buffer = buffers.of_value[value];
        let holds_only_the_write = (buffers.of_value.iter().enumerate())
            .filter(|(_, &b)| b == buffer)
            .all(|(v, _)| held.contains(&v));
        if !holds_only_the_write {
            return false;
        }
        // 3: every other reader of the input finishes before the chain's first op starts.
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
fn overwritten_operand(program: &Program, value: Value) -> Option<(usize, Value)> {
    let Producer::Op { op, port } = program.values[value].producer else {
        return None;
    };
    let info = &program.ops[op];
    let Alias::MayOverwrite(i) = info.op.alias(port) else {
        return None;
    };
    Some((op, *info.operands.get(i)?))
}

/// The ops that compute `value` each over the operand it may overwrite, last first: `value`'s
/// op, and while the operand it overwrites is a result of another such op, read by nothing but
/// the chain's next op and neither an output nor a write, that op too. Empty when `value`'s op
/// overwrites nothing. The last entry's operand is where the chain starts.
pub(crate) fn overwrite_chain(program: &Program, mut value: Value) -> Vec<(usize, Value)> {
    let mut chain = Vec::new();
    while let Some((op, operand)) = overwritten_operand(program, value) {
        chain.push((op, operand));
        let info = &program.values[operand];
        let only_this_op = info.readers.iter().all(|&(reader, _)| reader == op);
        if !only_this_op || info.readers.len() != 1 || info.is_output || info.is_written {
            break;
        }
        value = operand;
    }
    chain
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

    use super::overwrite_chain;
    use crate::test_graphs::{embedding_train, synthetic_train};
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

    /// The embedding update's two ops write each state in place, one buffer for both, with
    /// one stream and two; the unnamed rows' op runs after the table's readers and before the
    /// late gradient exists (on the side stream where there is one), and the verifier holds
    /// every reader of the table to the chain's first op.
    #[test]
    fn a_chain_of_two_updates_writes_in_place_and_its_first_op_runs_early() {
        for (tied, streams) in [false, true].into_iter().flat_map(|t| [(t, 1), (t, 2)]) {
            let graph = embedding_train(tied, [12, 8, 6]);
            let options = PlanOptions {
                streams,
                ..PlanOptions::default()
            };
            let planned = plan(&graph, &options, &crate::testing::TestWorkspaces).unwrap();
            verify_plan(&graph, &planned, &crate::testing::TestWorkspaces).unwrap();
            let writes = ["table", "adamw.m.table", "adamw.v.table"];
            let what = format!("tied {tied}, {streams} streams");
            assert_eq!(planned.in_place_writes, writes, "{what}");
            let step_of = |name: &str| {
                (planned.schedule.iter())
                    .position(|s| s.op.contains(name))
                    .unwrap()
            };
            let (unnamed, named) = (step_of("rows=unnamed"), step_of("rows=named"));
            let last_softmax = (planned.schedule.iter())
                .rposition(|s| s.op == "softmax")
                .unwrap();
            let logits = step_of("transpose_b=true");
            assert!(
                logits < unnamed && unnamed < last_softmax && last_softmax < named,
                "{what}"
            );
            assert_eq!(planned.schedule[unnamed].stream, streams - 1, "{what}");
            // Each state's buffer holds both updates' results.
            let program = crate::program::Program::new(&graph).unwrap();
            let buffer_of = |value: usize| {
                let id = program.values[value].id;
                let key = format!("{}.{}", id.node.index(), id.port);
                let found = planned.value_buffers.iter().find(|(k, _)| *k == key);
                found.unwrap().1
            };
            for (_, written) in graph.writes() {
                let value = (program.values.iter()).position(|v| v.id == *written);
                let chain = overwrite_chain(&program, value.unwrap());
                assert_eq!(chain.len(), 2);
                assert_eq!(buffer_of(chain[0].1), buffer_of(value.unwrap()));
            }
            if streams == 2 && !tied {
                // Nothing the first op reads orders it after stream 0's readers of the table:
                // its wait does. Without it the table may change under them.
                let mut bad = planned.clone();
                bad.schedule[unnamed].waits.clear();
                let err = verify_plan(&graph, &bad, &crate::testing::TestWorkspaces).unwrap_err();
                assert_eq!(err.rule, "in_place", "{err}");
                assert!(err.detail.contains("does not happen before"), "{err}");
            }
        }
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
