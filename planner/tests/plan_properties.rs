//! Property tests over random program graphs from `kiln_planner::testing`.
//!
//! `check` holds every property a generated graph (and, with the planner, its plan) must have;
//! the proptest below runs it on random graphs and options, printing the graph's IR on failure.
//! The generator itself is tested too: over a fixed sample its graphs must actually contain
//! what a planner has to handle (varied sizes, views, two-result ops, workspaces, writes), or
//! the properties would hold vacuously. And the verifier is tested on these graphs: it accepts
//! a naive plan that is valid by construction (no false alarms), and neither that plan broken
//! field by field nor a plan of random numbers makes it panic.

use std::collections::{BTreeMap, BTreeSet};
use std::error::Error;

use kiln_ir::graph::NodeKind;
use kiln_ir::{Graph, Op, TensorType};
use kiln_planner::testing::{graphs, plan_options, recipes, GraphRecipe, TestWorkspaces};
use kiln_planner::{verify_plan, Buffer, BufferClass, Plan, PlanOptions, Step, WorkspaceNeeds};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

#[path = "plan_properties/naive.rs"]
mod naive;

use naive::{edit, naive_plan};

/// Every property of a generated graph planned with `options`.
fn check(graph: &Graph, options: &PlanOptions) -> Result<(), Box<dyn Error>> {
    kiln_ir::verify(graph)?;
    if options.streams == 0 || !options.alignment.is_power_of_two() {
        return Err(format!("unusable options {options:?}").into());
    }
    // The planner's plan passes the independent verifier (which also checks arena >= lower
    // bound and that overlapping lifetimes never share a byte, across streams too) ...
    let plan = kiln_planner::plan(graph, options, &kiln_planner::testing::TestWorkspaces)?;
    verify_plan(graph, &plan, &kiln_planner::testing::TestWorkspaces)?;
    if plan.arena_bytes < plan.lower_bound_bytes {
        return Err(format!(
            "arena {} below lower bound {}",
            plan.arena_bytes, plan.lower_bound_bytes
        )
        .into());
    }
    // ... and planning is deterministic, byte for byte.
    let again = kiln_planner::plan(graph, options, &kiln_planner::testing::TestWorkspaces)?;
    if plan != again || kiln_planner::dump::to_json(&plan) != kiln_planner::dump::to_json(&again) {
        return Err("planning twice gave different plans".into());
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config { cases: 256, ..Config::default() })]

    #[test]
    fn generated_graphs_have_every_property(graph in graphs(), options in plan_options()) {
        if let Err(error) = check(&graph, &options) {
            let text = kiln_ir::print(&graph);
            return Err(TestCaseError::fail(format!("{error}\n{text}")));
        }
    }

    #[test]
    fn the_naive_plan_of_every_graph_verifies(graph in graphs(), options in plan_options()) {
        let plan = naive_plan(&graph, &options);
        if let Err(error) = verify_plan(&graph, &plan, &kiln_planner::testing::TestWorkspaces) {
            let text = kiln_ir::print(&graph);
            return Err(TestCaseError::fail(format!("{error}\n{text}")));
        }
    }

    #[test]
    fn broken_plans_never_panic_the_verifier(
        graph in graphs(),
        options in plan_options(),
        edits in prop::collection::vec((0..12u8, any::<u16>(), 0..600u64), 1..4),
    ) {
        let mut plan = naive_plan(&graph, &options);
        for (field, index, number) in edits {
            edit(&mut plan, field, usize::from(index), number);
        }
        // Any verdict will do; a panic fails the test.
        let _ = verify_plan(&graph, &plan, &kiln_planner::testing::TestWorkspaces);
    }

    #[test]
    fn random_plans_are_rejected_without_panicking(graph in graphs(), plan in random_plans()) {
        // Some op never runs, or some value has no buffer, at the very least.
        let error = verify_plan(&graph, &plan, &kiln_planner::testing::TestWorkspaces).expect_err("a random plan is not valid");
        prop_assert!(!error.detail.is_empty());
    }
}

/// Plans of random numbers, small enough to hit real node, value, buffer and event ids.
fn random_plans() -> impl Strategy<Value = Plan> {
    let ids = || prop::collection::vec(0..4usize, 0..3);
    let step =
        (0..12usize, 0..3usize, ids(), ids()).prop_map(|(node, stream, waits, records)| Step {
            node,
            op: "scale{alpha=0.5}".to_string(),
            stream,
            waits,
            records,
        });
    let class = prop::sample::select(vec![
        BufferClass::Param,
        BufferClass::Input,
        BufferClass::Output,
        BufferClass::State,
        BufferClass::Activation,
        BufferClass::Workspace,
    ]);
    let value = (0..12usize, 0..3usize).prop_map(|(node, port)| format!("{node}.{port}"));
    let values = prop::collection::vec(value.clone(), 0..3);
    let buffer = (
        class,
        0..512u64,
        prop::option::of(0..512u64),
        0..6usize,
        0..6usize,
        values,
    );
    let buffer = buffer.prop_map(|(class, size, offset, start, end, values)| Buffer {
        id: 0,
        name: "random".to_string(),
        class,
        size,
        offset,
        start,
        end,
        stream: 0,
        uses: values.len(),
        values,
    });
    let schedule = prop::collection::vec(step, 0..8);
    let buffers = prop::collection::vec(buffer, 0..8);
    let value_buffers = prop::collection::vec((value, 0..8usize), 0..12);
    (
        schedule,
        buffers,
        value_buffers,
        plan_options(),
        0..4096u64,
        0..4096u64,
        0..4usize,
    )
        .prop_map(
            |(schedule, mut buffers, value_buffers, options, arena, bound, events)| {
                buffers.iter_mut().enumerate().for_each(|(i, b)| b.id = i);
                Plan {
                    program: "random".to_string(),
                    options,
                    schedule,
                    buffers,
                    value_buffers,
                    arena_bytes: arena,
                    lower_bound_bytes: bound,
                    schedule_strategy: String::new(),
                    offset_strategy: String::new(),
                    offset_candidates: Vec::new(),
                    events,
                    in_place_writes: Vec::new(),
                    recomputed: Vec::new(),
                    communication_stream: None,
                    hash: String::new(),
                }
            },
        )
}

/// A fixed sample of generated graphs (a deterministic runner: the same graphs every run).
fn sample(count: usize) -> Vec<Graph> {
    let mut runner = TestRunner::deterministic();
    (0..count)
        .map(|_| graphs().new_tree(&mut runner).expect("a graph").current())
        .collect()
}

/// What a graph contains that a planner must handle.
#[derive(Default)]
struct Features {
    views: usize,
    multi_output: usize,
    may_overwrite: usize,
    workspaces: usize,
    writes: usize,
    outputs_of_inputs: usize,
    fan_out: usize,
    ops: usize,
    sizes: BTreeSet<usize>,
}

fn features(graph: &Graph, into: &mut Features) {
    let mut reads = BTreeMap::new();
    for node in graph.node_indices() {
        let Some(weight) = graph.node(node) else {
            continue;
        };
        into.sizes
            .extend(weight.outputs.iter().map(TensorType::size_bytes));
        let NodeKind::Op(op) = &weight.kind else {
            continue;
        };
        into.ops += 1;
        let operands = graph.operands(node);
        for operand in &operands {
            *reads.entry(*operand).or_insert(0) += 1;
        }
        let types: Vec<TensorType> = operands
            .iter()
            .map(|v| graph.value_type(*v).expect("operand").clone())
            .collect();
        into.views += usize::from(matches!(op, Op::Reshape { .. }));
        into.multi_output += usize::from(weight.outputs.len() > 1);
        into.may_overwrite += usize::from(matches!(op, Op::Add | Op::Mul | Op::Scale { .. }));
        into.workspaces += usize::from(TestWorkspaces.workspace_bytes(op, &types) > 0);
    }
    into.writes += graph.writes().len();
    let inputs: BTreeSet<_> = graph.inputs().iter().map(|(v, ..)| *v).collect();
    into.outputs_of_inputs += graph
        .outputs()
        .iter()
        .filter(|(_, v)| inputs.contains(v))
        .count();
    into.fan_out += reads.values().filter(|n| **n >= 3).count();
}

#[test]
fn generated_graphs_verify_and_contain_what_planners_handle() {
    let graphs = sample(200);
    let mut seen = Features::default();
    for graph in &graphs {
        kiln_ir::verify(graph).expect("generated graphs verify");
        features(graph, &mut seen);
    }
    // Each feature appears many times over the sample, not once by luck.
    let counts = [
        ("views", seen.views),
        ("two-result ops", seen.multi_output),
        ("may-overwrite ops", seen.may_overwrite),
        ("ops with a workspace", seen.workspaces),
        ("writes", seen.writes),
        ("outputs that are inputs", seen.outputs_of_inputs),
        ("values read 3+ times", seen.fan_out),
    ];
    for (what, count) in counts {
        assert!(count >= 40, "only {count} {what} in 200 graphs");
    }
    assert!(seen.sizes.len() >= 20, "value sizes: {:?}", seen.sizes);
    assert!(seen.ops >= 200 * 8, "only {} ops in 200 graphs", seen.ops);
}

#[test]
fn generated_graphs_differ() {
    let texts: BTreeSet<String> = sample(50).iter().map(kiln_ir::print).collect();
    assert!(
        texts.len() >= 45,
        "only {} distinct graphs of 50",
        texts.len()
    );
}

#[test]
fn even_an_empty_recipe_builds_a_graph() {
    let recipe = GraphRecipe {
        inputs: vec![],
        ops: vec![],
        outputs: vec![7],
        writes: vec![Some(1)],
    };
    let graph = recipe.build().expect("builds");
    kiln_ir::verify(&graph).expect("verifies");
    assert_eq!(graph.inputs().len(), 1);
    assert_eq!(graph.outputs().len(), 1);
}

#[test]
fn recipes_build_the_same_graph_every_time() {
    let mut runner = TestRunner::deterministic();
    for _ in 0..20 {
        let recipe = recipes().new_tree(&mut runner).expect("a recipe").current();
        let (first, second) = (
            recipe.build().expect("builds"),
            recipe.build().expect("builds"),
        );
        assert_eq!(kiln_ir::print(&first), kiln_ir::print(&second));
    }
}
