//! Verifier tests: hand-made valid plans pass; each is then broken in one field, and the
//! verifier names the rule and, in the detail, the step, buffer or value at fault.
//!
//! The rules of time and memory (`lifetimes` to `overlap`, streams) are in
//! `verify_tests/time.rs`; the fixtures they share are here.

#[path = "verify_tests/time.rs"]
mod time;

use kiln_ir::{DType, Graph, InputKind, Op, Shape, TensorType};

use super::verify_plan;
use crate::{Buffer, BufferClass, Plan, PlanOptions, Step};

use BufferClass::{Activation, Output, Param, Workspace};

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims).unwrap()
}

/// Steps `(node, stream, waits, records)`, with the op text read from the graph.
fn steps(graph: &Graph, spec: &[(usize, usize, &[usize], &[usize])]) -> Vec<Step> {
    spec.iter()
        .map(|&(node, stream, waits, records)| {
            let index = graph.node_indices().find(|n| n.index() == node).unwrap();
            let op = match &graph.node(index).unwrap().kind {
                kiln_ir::graph::NodeKind::Op(op) => op.to_string(),
                kiln_ir::graph::NodeKind::Input { name, .. } => name.clone(),
            };
            Step {
                node,
                op,
                stream,
                waits: waits.to_vec(),
                records: records.to_vec(),
            }
        })
        .collect()
}

/// A buffer on stream 0; `plan` numbers it.
fn buffer(
    name: &str,
    class: BufferClass,
    (size, offset): (u64, Option<u64>),
    (start, end): (usize, usize),
    values: &[&str],
    uses: usize,
) -> Buffer {
    Buffer {
        id: 0,
        name: name.to_string(),
        class,
        size,
        offset,
        start,
        end,
        stream: 0,
        values: values.iter().map(|v| v.to_string()).collect(),
        uses,
    }
}

/// A plan with buffer ids set to their index and `value_buffers` read off the buffers.
fn plan(options: PlanOptions, schedule: Vec<Step>, mut buffers: Vec<Buffer>, arena: u64) -> Plan {
    let mut value_buffers = Vec::new();
    for (id, buffer) in buffers.iter_mut().enumerate() {
        buffer.id = id;
        value_buffers.extend(buffer.values.iter().map(|v| (v.clone(), id)));
    }
    value_buffers.sort_by_key(|(v, _)| super::parse(v));
    Plan {
        program: "test".to_string(),
        options,
        events: schedule
            .iter()
            .flat_map(|s| &s.records)
            .map(|e| e + 1)
            .max()
            .unwrap_or(0),
        schedule,
        buffers,
        value_buffers,
        arena_bytes: arena,
        lower_bound_bytes: arena,
        schedule_strategy: "by hand".to_string(),
        offset_strategy: "by hand".to_string(),
        offset_candidates: vec![("by hand".to_string(), arena)],
        in_place_writes: Vec::new(),
        recomputed: Vec::new(),
        communication_stream: None,
        hash: String::new(),
    }
}

/// One stream, alignment 64: an in-place op, a view, a bf16 matmul with a workspace, an
/// activation reusing dead bytes and an output.
///
/// ```text
/// %0 x: input f32[2,4]   %1 w: param f32[4]   %2 h: param bf16[4,4]
/// step 0: %3 = mul(%0, %1)         buffer 3 (arena 0..32, steps 0..=2)
/// step 1: %4 = scale(%3)           in place: buffer 3
/// step 2: %5 = cast{bf16}(%4)      buffer 4 (arena 64..80, steps 2..=3)
/// step 3: %6 = matmul(%5, %2)      buffer 5 (arena 0..32 again, steps 3..=5);
///                                  workspace: buffer 6 (arena 128..224, step 3)
/// step 4: %7 = reshape{[8]}(%6)    view: buffer 5
/// step 5: %8 = softmax(%7)         buffer 7: output `probs`
/// ```
///
/// Live arena bytes (rounded to 64) peak at step 3: 64 + 64 + 128 = 256 = the arena.
fn serial() -> (Graph, Plan) {
    let mut g = Graph::new("serial");
    let x = g.input("x", InputKind::Input, f32t(&[2, 4])).unwrap();
    let w = g.input("w", InputKind::Param, f32t(&[4])).unwrap();
    let h = g
        .input(
            "h",
            InputKind::Param,
            TensorType::new(DType::BF16, [4, 4]).unwrap(),
        )
        .unwrap();
    let a = g.op1(Op::Mul, &[x, w]).unwrap();
    let b = g.op1(Op::Scale { alpha: 2.0 }, &[a]).unwrap();
    let c = g.op1(Op::Cast { to: DType::BF16 }, &[b]).unwrap();
    let matmul = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let m = g.op1(matmul, &[c, h]).unwrap();
    let r = g
        .op1(
            Op::Reshape {
                shape: Shape::new(&[8]),
            },
            &[m],
        )
        .unwrap();
    let s = g.op1(Op::Softmax, &[r]).unwrap();
    g.output("probs", s).unwrap();
    let schedule = steps(
        &g,
        &[
            (3, 0, &[], &[]),
            (4, 0, &[], &[]),
            (5, 0, &[], &[]),
            (6, 0, &[], &[]),
            (7, 0, &[], &[]),
            (8, 0, &[], &[]),
        ],
    );
    let buffers = vec![
        buffer("x", BufferClass::Input, (32, None), (0, 0), &["0.0"], 1),
        buffer("w", Param, (16, None), (0, 5), &["1.0"], 1),
        buffer("h", Param, (32, None), (0, 5), &["2.0"], 1),
        buffer(
            "mul 3.0",
            Activation,
            (32, Some(0)),
            (0, 2),
            &["3.0", "4.0"],
            2,
        ),
        buffer("cast 5.0", Activation, (16, Some(64)), (2, 3), &["5.0"], 1),
        buffer(
            "matmul 6.0",
            Activation,
            (32, Some(0)),
            (3, 5),
            &["6.0", "7.0"],
            2,
        ),
        buffer(
            "matmul workspace",
            Workspace,
            (96, Some(128)),
            (3, 3),
            &[],
            0,
        ),
        buffer("probs", Output, (32, None), (5, 5), &["8.0"], 0),
    ];
    let options = PlanOptions {
        streams: 1,
        alignment: 64,
    };
    (g, plan(options, schedule, buffers, 256))
}

/// Asserts `plan` breaks `rule` with a detail containing every one of `needles`.
#[track_caller]
fn rejects(graph: &Graph, plan: &Plan, rule: &str, needles: &[&str]) {
    let error = verify_plan(graph, plan, &crate::testing::TestWorkspaces)
        .expect_err("the plan should be rejected");
    assert_eq!(error.rule, rule, "{error}");
    for needle in needles {
        assert!(error.detail.contains(needle), "`{needle}` not in: {error}");
    }
    assert_eq!(
        error.to_string(),
        format!("invalid plan: {rule}: {}", error.detail)
    );
}

/// Breaks a copy of the serial plan with `edit` and asserts the rejection.
#[track_caller]
fn serial_rejects(edit: impl FnOnce(&mut Plan), rule: &str, needles: &[&str]) {
    let (graph, mut plan) = serial();
    edit(&mut plan);
    rejects(&graph, &plan, rule, needles);
}

#[test]
fn the_serial_plan_is_valid() {
    let (graph, plan) = serial();
    assert_eq!(
        verify_plan(&graph, &plan, &crate::testing::TestWorkspaces),
        Ok(())
    );
}

#[test]
fn schedule_runs_every_op_once_after_its_operands() {
    serial_rejects(
        |p| p.schedule.swap(0, 1),
        "schedule",
        &["step 0", "node 4", "reads 3.0", "node 3 (mul)"],
    );
    serial_rejects(
        |p| drop(p.schedule.pop()),
        "schedule",
        &["node 8 (softmax) never runs"],
    );
    serial_rejects(
        |p| p.schedule.push(p.schedule[5].clone()),
        "schedule",
        &["node 8", "steps 5 and 6"],
    );
    serial_rejects(
        |p| p.schedule[0].node = 1,
        "schedule",
        &["step 0", "node 1 (param)", "not an op"],
    );
    serial_rejects(|p| p.schedule[0].node = 42, "schedule", &["node 42"]);
}

#[test]
fn schedule_steps_carry_their_op_and_an_existing_stream() {
    serial_rejects(
        |p| p.schedule[2].op = "cast{to=f32}".into(),
        "schedule",
        &["step 2", "cast{to=f32}", "node 5"],
    );
    serial_rejects(
        |p| p.schedule[3].stream = 1,
        "schedule",
        &["step 3", "stream 1, of 1"],
    );
    serial_rejects(|p| p.options.streams = 0, "schedule", &["step 0", "of 0"]);
}

#[test]
fn events_exist_and_are_recorded_before_they_are_waited_for() {
    serial_rejects(
        |p| p.schedule[1].waits = vec![0],
        "events",
        &["step 1", "event 0, of 0"],
    );
    let unrecorded = |p: &mut Plan| {
        p.events = 1;
        p.schedule[1].waits = vec![0];
        p.schedule[1].records = vec![0];
    };
    serial_rejects(
        unrecorded,
        "events",
        &["step 1 waits for event 0", "no earlier step"],
    );
}

#[test]
fn storage_gives_every_value_one_buffer() {
    serial_rejects(|p| p.buffers[2].id = 5, "storage", &["index 2 has id 5"]);
    serial_rejects(
        |p| drop(p.value_buffers.remove(6)),
        "storage",
        &["value 6.0", "node 6 (matmul", "no buffer"],
    );
    serial_rejects(
        |p| p.value_buffers.push(("9.0".into(), 0)),
        "storage",
        &["`9.0`"],
    );
    serial_rejects(
        |p| p.value_buffers.push(("x".into(), 0)),
        "storage",
        &["`x`"],
    );
    serial_rejects(
        |p| p.value_buffers.push(("3.0".into(), 3)),
        "storage",
        &["value 3.0 is listed twice"],
    );
    serial_rejects(
        |p| p.value_buffers[5].1 = 42,
        "storage",
        &["value 5.0", "buffer 42, of 8"],
    );
}

#[test]
fn storage_lists_agree_and_buffers_are_large_enough() {
    serial_rejects(
        |p| drop(p.buffers[5].values.pop()),
        "storage",
        &["buffer 5 (`matmul 6.0`)", "lists 1 values", "maps 2"],
    );
    let moved = |p: &mut Plan| p.buffers[4].values.push("6.0".into());
    serial_rejects(
        moved,
        "storage",
        &["buffer 4 (`cast 5.0`)", "value 6.0", "Some(5)"],
    );
    serial_rejects(
        |p| p.buffers[3].size = 16,
        "storage",
        &["buffer 3 (`mul 3.0`)", "16 bytes", "3.0 of 32"],
    );
}

#[test]
fn storage_gives_each_step_that_needs_scratch_one_workspace() {
    serial_rejects(
        |p| p.buffers[6].size = 64,
        "storage",
        &["buffer 6", "64 bytes", "step 3 needs 96"],
    );
    serial_rejects(
        |p| p.buffers[6].end = 4,
        "storage",
        &["buffer 6", "steps 3..=4"],
    );
    let moved = |p: &mut Plan| (p.buffers[6].start, p.buffers[6].end) = (4, 4);
    serial_rejects(moved, "storage", &["buffer 6", "step 4, which needs none"]);
    let reclassed = |p: &mut Plan| p.buffers[6].class = Activation;
    serial_rejects(
        reclassed,
        "storage",
        &["step 3", "node 6 (matmul", "96 bytes of workspace"],
    );
    let twice = |p: &mut Plan| {
        let mut again = p.buffers[6].clone();
        again.id = 8;
        p.buffers.push(again);
    };
    serial_rejects(twice, "storage", &["step 3 has workspaces 6 and 8"]);
}

#[test]
fn classes_follow_inputs_and_the_arena() {
    serial_rejects(
        |p| p.buffers[1].class = BufferClass::Input,
        "classes",
        &["buffer 1 (`w`)", "param 1.0", "Input"],
    );
    serial_rejects(
        |p| p.buffers[4].class = Param,
        "classes",
        &["buffer 4 (`cast 5.0`)", "Param"],
    );
    serial_rejects(
        |p| p.buffers[7].offset = Some(0),
        "classes",
        &["buffer 7 (`probs`)", "Output with offset Some(0)"],
    );
    serial_rejects(
        |p| p.buffers[3].offset = None,
        "classes",
        &["buffer 3 (`mul 3.0`)", "Activation with offset None"],
    );
}
