//! Wrong plans: poison makes bad lifetimes and overlaps visible as different bits; plans that
//! do not fit their graph are refused with errors naming the fault, and `values` is untouched.

use std::collections::BTreeMap;

use kiln_ir::{Graph, InputKind, Op};
use kiln_kernels::testing;
use kiln_planner::{verify_plan, Plan};
use rand::rngs::StdRng;

use super::plans::{self, arena, bound, make_plan, output, settle_arena, workspace};
use super::{bind, both, chain, random, raw_map};
use crate::{execute, Tensor};

/// `a = 2x`, `b = -y`, `c = a + b`, `d = 0.5c`: a lives over steps [0,2], b over [1,2].
fn sum(rng: &mut StdRng, b_offset: u64) -> (Graph, Plan, BTreeMap<String, Tensor>) {
    let mut graph = Graph::new("sum");
    let mut values = BTreeMap::new();
    let x = bind(
        &mut graph,
        &mut values,
        "x",
        InputKind::Input,
        &random(rng, &[4, 8]),
    );
    let y = bind(
        &mut graph,
        &mut values,
        "y",
        InputKind::Input,
        &random(rng, &[4, 8]),
    );
    let a = graph.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap();
    let b = graph.op1(Op::Scale { alpha: -1.0 }, &[y]).unwrap();
    let c = graph.op1(Op::Add, &[a, b]).unwrap();
    let d = graph.op1(Op::Scale { alpha: 0.5 }, &[c]).unwrap();
    graph.output("d", d).unwrap();
    let specs = [
        bound(&[x]),
        bound(&[y]),
        arena(0, &[a]),
        arena(b_offset, &[b]),
        arena(512, &[c]),
        output(&[d]),
    ];
    let plan = make_plan(&graph, &specs);
    (graph, plan, values)
}

#[test]
fn the_right_sum_plan_matches_the_interpreter() {
    let mut rng = testing::rng("the_right_sum_plan_matches_the_interpreter");
    let (graph, plan, values) = sum(&mut rng, 256);
    super::assert_matches_interpret(&graph, &plan, &values);
}

#[test]
fn overlapping_live_buffers_give_different_bits() {
    let mut rng = testing::rng("overlapping_live_buffers_give_different_bits");
    // b at a's offset while a is still live: b's write clobbers a before the add reads it.
    let (graph, plan, values) = sum(&mut rng, 0);
    let err = verify_plan(&graph, &plan, &crate::Workspaces::Any).unwrap_err();
    assert_eq!(err.rule, "overlap", "{err}");
    let [want, got] = both(&graph, &plan, &values, true);
    assert_ne!(got, want);
}

#[test]
fn poison_catches_a_lifetime_that_ends_too_early() {
    let mut rng = testing::rng("poison_catches_a_lifetime_that_ends_too_early");
    let (graph, mut plan, values) = sum(&mut rng, 256);
    // a is read at step 2, but the plan says it dies at step 1. Nothing reuses its bytes,
    // so only poison can tell.
    plan.buffers[2].end = 1;
    settle_arena(&mut plan);
    let err = verify_plan(&graph, &plan, &crate::Workspaces::Any).unwrap_err();
    assert_eq!(err.rule, "lifetimes", "{err}");
    let [want, got] = both(&graph, &plan, &values, false);
    assert_eq!(got, want, "without poison the stale bytes are still right");
    let [want, got] = both(&graph, &plan, &values, true);
    assert_ne!(got, want, "with poison the dead bytes read as NaN");
    let d = &got.0["d"].2;
    let nan = bytemuck::cast_slice::<u8, f32>(d)
        .iter()
        .filter(|x| x.is_nan())
        .count();
    assert_eq!(nan, 32, "every element read the poisoned a");
}

/// Runs `plan` on `graph` and returns its error, checking that `values` is untouched.
#[track_caller]
fn refused(graph: &Graph, plan: &Plan, values: &BTreeMap<String, Tensor>) -> String {
    let mut after = values.clone();
    let err = execute(graph, plan, &mut after, true).unwrap_err();
    assert_eq!(raw_map(&after), raw_map(values));
    for (name, tensor) in values {
        assert!(
            after[name].storage().same(tensor.storage()),
            "{name} replaced"
        );
    }
    err.to_string()
}

#[test]
fn plans_that_do_not_fit_the_graph_are_refused() {
    let mut rng = testing::rng("plans_that_do_not_fit_the_graph_are_refused");
    let (graph, plan, values) = chain(&mut rng);

    let mut wrong = plan.clone();
    wrong.schedule[1].node = 99;
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("plan `chain`: step 1: runs node %99, which the graph does not have"),
        "{err}"
    );

    let mut wrong = plan.clone();
    wrong.schedule.remove(3);
    let err = refused(&graph, &wrong, &values);
    assert!(err.contains("node %5: is an op that no step runs"), "{err}");

    let mut wrong = plan.clone();
    wrong.schedule.swap(0, 1);
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("step 0 (node %3 softmax): reads operand 0, value 2.0, before"),
        "{err}"
    );

    let mut wrong = plan.clone();
    wrong.schedule[0].op = "softmax".to_string();
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("step 0: says `softmax` but node %2 is `scale{alpha=3.0}`"),
        "{err}"
    );

    let mut wrong = plan.clone();
    wrong.value_buffers.retain(|(v, _)| v != "4.0");
    let err = refused(&graph, &wrong, &values);
    assert!(err.contains("value 4.0: has no buffer"), "{err}");

    let mut wrong = plan.clone();
    wrong.value_buffers.push(("42.0".to_string(), 0));
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("value `42.0`: is not a value of the graph"),
        "{err}"
    );

    let mut wrong = plan.clone();
    wrong.value_buffers[2].1 = 17;
    let err = refused(&graph, &wrong, &values);
    assert!(err.contains("value `2.0`: is in buffer 17, of 6"), "{err}");

    let mut wrong = plan.clone();
    wrong.arena_bytes = 300;
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains(
            "buffer 3 (`buffer 3`): bytes 256..256+128 lie outside the arena of 300 bytes"
        ),
        "{err}"
    );

    let mut wrong = plan.clone();
    wrong.buffers[0].class = kiln_planner::BufferClass::Activation;
    wrong.buffers[0].offset = Some(0);
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("buffer 0 (`buffer 0`): is Activation but holds input 0.0"),
        "{err}"
    );

    let mut wrong = plan.clone();
    wrong.buffers[1].class = kiln_planner::BufferClass::State;
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("buffer 1 (`buffer 1`): is State but holds param 1.0"),
        "{err}"
    );
}

#[test]
fn steps_whose_buffers_collide_are_refused() {
    let mut rng = testing::rng("steps_whose_buffers_collide_are_refused");
    let (graph, plan, values) = chain(&mut rng);

    // softmax writes b over its own operand a's bytes.
    let mut wrong = plan.clone();
    wrong.buffers[3].offset = Some(0);
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("reads operand 0 from buffer 2 (`buffer 2`), whose bytes overlap"),
        "{err}"
    );

    // A view put in another buffer than its operand.
    let mut graph = graph;
    let e = graph.outputs()[0].1;
    let view = graph.op1(Op::Transpose { dim0: 0, dim1: 1 }, &[e]).unwrap();
    graph.output("t", view).unwrap();
    let mut wrong = plan.clone();
    wrong.schedule.push(kiln_planner::Step {
        node: view.node.index(),
        op: "transpose{dim0=0, dim1=1}".to_string(),
        stream: 0,
        waits: vec![],
        records: vec![],
    });
    wrong
        .value_buffers
        .push((format!("{}.0", view.node.index()), 2));
    let err = refused(&graph, &wrong, &values);
    assert!(
        err.contains("is a view, but the plan puts it in another buffer"),
        "{err}"
    );
}

#[test]
fn missing_workspaces_colliding_writes_and_missing_inputs_are_refused() {
    let mut rng = testing::rng("missing_workspaces_colliding_writes_and_missing_inputs");
    let mut graph = Graph::new("attention_backward");
    let mut values = BTreeMap::new();
    let mut input = |name: &str, dims: &[usize]| {
        let tensor = random(&mut rng, dims);
        bind(&mut graph, &mut values, name, InputKind::Input, &tensor)
    };
    let [q, k, v] = ["q", "k", "v"].map(|name| input(name, &[1, 2, 3, 4]));
    let g = input("g", &[1, 3, 2, 4]);
    let probs = input("probs", &[1, 2, 3, 3]);
    let backward = Op::AttentionBackward { scale: 0.5 };
    let grads = graph.op(backward, &[q, k, v, probs, g]).unwrap();
    graph.output("gq", grads[0]).unwrap();
    // Buffers 0-4 hold the inputs, 5 holds gq; then gk, gv and the workspace as each case says.
    let plan_with = |rest: Vec<plans::Spec>| {
        let mut specs: Vec<_> = [q, k, v, g, probs].iter().map(|x| bound(&[*x])).collect();
        specs.push(output(&[grads[0]]));
        specs.extend(rest);
        make_plan(&graph, &specs)
    };

    let plan = plan_with(vec![output(&[grads[1]]), output(&[grads[2]])]);
    let err = refused(&graph, &plan, &values);
    // The CPU reference's one row of S = 3 scores, f32.
    let want = "step 0 (node %5 attention_backward{scale=0.5}): needs 12 bytes of workspace, \
                and the plan gives 0";
    assert!(err.contains(want), "{err}");

    // Past the workspace's 608 bytes (any backend's need: the GPU's dS and masked probs, each
    // rounded up to 256 bytes, then grad_out transposed).
    let plan = plan_with(vec![
        arena(1024, &[grads[1]]),
        arena(1024, &[grads[2]]),
        workspace(0, grads[0]),
    ]);
    let err = refused(&graph, &plan, &values);
    let want = "writes buffer 6 (`buffer 6`) and buffer 7 (`buffer 7`), whose bytes overlap";
    assert!(err.contains(want), "{err}");

    let plan = plan_with(vec![
        arena(0, &[grads[1]]),
        arena(256, &[grads[2]]),
        workspace(0, grads[0]),
    ]);
    let err = refused(&graph, &plan, &values);
    let want = "writes buffer 6 (`buffer 6`) and buffer 8 (`buffer 8`), whose bytes overlap";
    assert!(err.contains(want), "{err}");

    // With the workspace moved clear of both, the same plan runs.
    let mut plan = plan;
    plan.buffers[8].offset = Some(512);
    settle_arena(&mut plan);
    let mut ok = values.clone();
    execute(&graph, &plan, &mut ok, true).unwrap();

    values.remove("probs");
    let err = refused(&graph, &plan, &values);
    assert!(err.contains("graph input `probs`"), "{err}");
}
