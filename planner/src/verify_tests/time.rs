//! Tests of the rules of memory and time: `lifetimes`, `aliasing`, `alignment`, `bounds`,
//! `lower_bound`, `overlap`, and happens-before across streams.

use kiln_ir::{Graph, InputKind, Op, Shape};

use super::super::{check_schedule, order, verify_plan, Program};
use super::{buffer, f32t, plan, rejects, serial_rejects, steps};
use crate::{BufferClass, Plan, PlanOptions};

use BufferClass::{Activation, Input, Output, Param};

fn serial_options() -> PlanOptions {
    PlanOptions {
        streams: 1,
        alignment: 64,
    }
}

#[test]
fn lifetimes_cover_every_write_and_read() {
    serial_rejects(
        |p| p.buffers[3].end = 1,
        "lifetimes",
        &["buffer 3 (`mul 3.0`)", "0..=1", "step 2", "4.0"],
    );
    serial_rejects(
        |p| p.buffers[5].start = 4,
        "lifetimes",
        &["buffer 5", "step 3", "6.0"],
    );
    serial_rejects(
        |p| p.buffers[4].start = 3,
        "lifetimes",
        &["buffer 4", "step 2", "5.0"],
    );
    serial_rejects(
        |p| p.buffers[7].end = 6,
        "lifetimes",
        &["buffer 7 (`probs`)", "5..=6, of 6"],
    );
    serial_rejects(
        |p| p.buffers[4].end = 1,
        "lifetimes",
        &["buffer 4", "2..=1"],
    );
}

#[test]
fn lifetimes_of_inputs_start_at_zero_and_kept_values_last_to_the_end() {
    // h is first read at step 3, but is bound before the run.
    serial_rejects(
        |p| p.buffers[2].start = 1,
        "lifetimes",
        &["buffer 2 (`h`)", "step 0", "2.0"],
    );
    // w is last read at step 0, but the next run reads it again.
    serial_rejects(
        |p| p.buffers[1].end = 4,
        "lifetimes",
        &["buffer 1 (`w`)", "step 5", "1.0"],
    );
}

#[test]
fn lifetimes_count_uses_and_name_the_first_writer_stream() {
    serial_rejects(
        |p| p.buffers[3].uses = 1,
        "lifetimes",
        &["buffer 3", "claims 1 uses", "read 2 times"],
    );
    serial_rejects(
        |p| p.buffers[7].uses = 1,
        "lifetimes",
        &["buffer 7", "claims 1 uses", "read 0 times"],
    );
    let moved = |p: &mut Plan| {
        p.options.streams = 2;
        p.buffers[4].stream = 1;
    };
    serial_rejects(
        moved,
        "lifetimes",
        &["buffer 4", "stream 1", "first written on stream 0"],
    );
}

/// `x` read by two scales, their sum the output: an in-place op is safe only at step 1.
fn two_readers() -> Graph {
    let mut g = Graph::new("two_readers");
    let x = g.input("x", InputKind::Input, f32t(&[4])).unwrap();
    let a = g.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap();
    let b = g.op1(Op::Scale { alpha: 3.0 }, &[x]).unwrap();
    let o = g.op1(Op::Add, &[a, b]).unwrap();
    g.output("o", o).unwrap();
    g
}

fn two_readers_plan(x_holds: &[&str], other: &[&str], other_start: usize) -> Plan {
    let g = two_readers();
    let schedule = steps(&g, &[(1, 0, &[], &[]), (2, 0, &[], &[]), (3, 0, &[], &[])]);
    let buffers = vec![
        buffer("x", Input, (16, None), (0, 2), x_holds, 3),
        buffer(
            "scale",
            Activation,
            (16, Some(0)),
            (other_start, 2),
            other,
            1,
        ),
        buffer("o", Output, (16, None), (2, 2), &["3.0"], 0),
    ];
    plan(serial_options(), schedule, buffers, 64)
}

#[test]
fn aliasing_allows_overwriting_an_operand_at_its_last_read() {
    let plan = two_readers_plan(&["0.0", "2.0"], &["1.0"], 0);
    assert_eq!(
        verify_plan(&two_readers(), &plan, &crate::testing::TestWorkspaces),
        Ok(())
    );
}

#[test]
fn aliasing_rejects_overwriting_an_operand_read_later() {
    let plan = two_readers_plan(&["0.0", "1.0"], &["2.0"], 1);
    let needles = ["step 0 writes 1.0 over 0.0", "step 1 reads 0.0"];
    rejects(&two_readers(), &plan, "aliasing", &needles);
}

#[test]
fn aliasing_rejects_unrelated_values_in_one_buffer() {
    let mut plan = two_readers_plan(&["0.0"], &["1.0", "2.0"], 0);
    plan.buffers[0].end = 1;
    plan.buffers[0].uses = 2;
    plan.buffers[1].uses = 2;
    rejects(
        &two_readers(),
        &plan,
        "aliasing",
        &["buffer 1 (`scale`)", "1.0 and 2.0"],
    );
}

/// A param updated in place by an add; `written` says whether the graph writes it back.
fn param_update(written: bool) -> (Graph, Plan) {
    let mut g = Graph::new("update");
    let w = g.input("w", InputKind::Param, f32t(&[4])).unwrap();
    let d = g.input("d", InputKind::Input, f32t(&[4])).unwrap();
    let y = g.op1(Op::Add, &[w, d]).unwrap();
    if written {
        g.write("w", y).unwrap();
    }
    let buffers = vec![
        buffer("w", Param, (16, None), (0, 0), &["0.0", "2.0"], 1),
        buffer("d", Input, (16, None), (0, 0), &["1.0"], 1),
    ];
    let schedule = steps(&g, &[(2, 0, &[], &[])]);
    (g, plan(serial_options(), schedule, buffers, 0))
}

#[test]
fn aliasing_overwrites_a_param_only_when_the_graph_writes_it() {
    let (graph, plan) = param_update(true);
    assert_eq!(
        verify_plan(&graph, &plan, &crate::testing::TestWorkspaces),
        Ok(())
    );
    let (graph, plan) = param_update(false);
    let needles = [
        "step 0 writes 2.0 over 0.0",
        "destroying 0.0",
        "kept after the run",
    ];
    rejects(&graph, &plan, "aliasing", &needles);
}

/// `softmax(x)` viewed by a reshape to `[1, 4]`; `then` is applied to (softmax, view).
fn viewed(then: impl FnOnce(&mut Graph, kiln_ir::ValueId, kiln_ir::ValueId)) -> Graph {
    let mut g = Graph::new("viewed");
    let x = g.input("x", InputKind::Input, f32t(&[4])).unwrap();
    let s = g.op1(Op::Softmax, &[x]).unwrap();
    let v = g
        .op1(
            Op::Reshape {
                shape: Shape::new(&[1, 4]),
            },
            &[s],
        )
        .unwrap();
    then(&mut g, s, v);
    g
}

#[test]
fn aliasing_keeps_views_in_their_operand_buffer() {
    let g = viewed(|g, _, v| {
        let t = g.op1(Op::Softmax, &[v]).unwrap();
        g.output("t", t).unwrap();
    });
    let schedule = steps(&g, &[(1, 0, &[], &[]), (2, 0, &[], &[]), (3, 0, &[], &[])]);
    let buffers = vec![
        buffer("x", Input, (16, None), (0, 0), &["0.0"], 1),
        buffer("softmax", Activation, (16, Some(0)), (0, 1), &["1.0"], 1),
        buffer("reshape", Activation, (16, Some(64)), (1, 2), &["2.0"], 1),
        buffer("t", Output, (16, None), (2, 2), &["3.0"], 0),
    ];
    let plan = plan(serial_options(), schedule, buffers, 128);
    rejects(&g, &plan, "aliasing", &["view 2.0", "operand 1.0"]);
}

#[test]
fn aliasing_rejects_reading_another_view_of_the_bytes_overwritten() {
    let g = viewed(|g, s, v| {
        let y = g.op1(Op::Add, &[v, s]).unwrap();
        g.output("y", y).unwrap();
    });
    let schedule = steps(&g, &[(1, 0, &[], &[]), (2, 0, &[], &[]), (3, 0, &[], &[])]);
    let buffers = vec![
        buffer("x", Input, (16, None), (0, 0), &["0.0"], 1),
        buffer(
            "softmax",
            Activation,
            (16, Some(0)),
            (0, 2),
            &["1.0", "2.0", "3.0"],
            3,
        ),
    ];
    let plan = plan(serial_options(), schedule, buffers, 64);
    rejects(
        &g,
        &plan,
        "aliasing",
        &["step 2 writes 3.0 over 2.0", "also reading 1.0"],
    );
}

#[test]
fn alignment_divides_every_arena_offset() {
    serial_rejects(
        |p| p.buffers[6].offset = Some(160),
        "alignment",
        &["buffer 6", "offset 160", "64"],
    );
    serial_rejects(|p| p.options.alignment = 0, "alignment", &["0"]);
}

#[test]
fn bounds_keep_buffers_inside_an_arena_no_smaller_than_the_bound() {
    serial_rejects(
        |p| p.arena_bytes = 200,
        "bounds",
        &["buffer 6 (`matmul workspace`)", "byte 224", "200"],
    );
    serial_rejects(
        |p| p.arena_bytes = 224,
        "bounds",
        &["arena_bytes 224", "lower_bound_bytes 256"],
    );
}

#[test]
fn lower_bound_is_the_exact_peak_of_live_bytes() {
    serial_rejects(
        |p| p.lower_bound_bytes = 192,
        "lower_bound",
        &["192", "256 bytes are live at step 3"],
    );
    // Rounding: with 32-byte alignment the peak is 32 + 32 + 96 = 160 (cast's 16 bytes round up).
    let realigned = |p: &mut Plan| p.options.alignment = 32;
    serial_rejects(
        realigned,
        "lower_bound",
        &["256", "160 bytes are live at step 3"],
    );
}

#[test]
fn overlap_forbids_sharing_bytes_while_both_live_on_one_stream() {
    let shared = [
        "buffer 4 (`cast 5.0`) and buffer 5 (`matmul 6.0`)",
        "bytes 64..80",
        "step 3",
    ];
    serial_rejects(|p| p.buffers[5].offset = Some(64), "overlap", &shared);
}

/// Two streams: `a = 2x; b = 3a` on stream 0, `c = 4x` on stream 1 after event 0 (recorded
/// after b), `d = b + c` on stream 0 after event 1 (recorded after c). c reuses a's bytes:
/// every use of a happens before c is written.
fn two_streams() -> (Graph, Plan) {
    let mut g = Graph::new("two_streams");
    let x = g.input("x", InputKind::Input, f32t(&[4])).unwrap();
    let a = g.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap();
    let b = g.op1(Op::Scale { alpha: 3.0 }, &[a]).unwrap();
    let c = g.op1(Op::Scale { alpha: 4.0 }, &[x]).unwrap();
    let d = g.op1(Op::Add, &[b, c]).unwrap();
    g.output("d", d).unwrap();
    let schedule = steps(
        &g,
        &[
            (1, 0, &[], &[]),
            (2, 0, &[], &[0]),
            (3, 1, &[0], &[1]),
            (4, 0, &[1], &[]),
        ],
    );
    let mut buffers = vec![
        buffer("x", Input, (16, None), (0, 2), &["0.0"], 2),
        buffer("a", Activation, (16, Some(0)), (0, 1), &["1.0"], 1),
        buffer("b", Activation, (16, Some(64)), (1, 3), &["2.0"], 1),
        buffer("c", Activation, (16, Some(0)), (2, 3), &["3.0"], 1),
        buffer("d", Output, (16, None), (3, 3), &["4.0"], 0),
    ];
    buffers[3].stream = 1;
    let options = PlanOptions {
        streams: 2,
        alignment: 64,
    };
    (g, plan(options, schedule, buffers, 128))
}

#[test]
fn the_two_stream_plan_is_valid() {
    let (graph, plan) = two_streams();
    assert_eq!(plan.events, 2);
    assert_eq!(
        verify_plan(&graph, &plan, &crate::testing::TestWorkspaces),
        Ok(())
    );
}

#[test]
fn overlap_across_streams_needs_an_event() {
    let (graph, mut plan) = two_streams();
    plan.schedule[2].waits.clear();
    let needles = [
        "buffer 1 (`a`) and buffer 3 (`c`)",
        "bytes 0..16",
        "no event",
    ];
    rejects(&graph, &plan, "overlap", &needles);
}

#[test]
fn events_order_every_read_after_its_producer() {
    let (graph, mut plan) = two_streams();
    plan.schedule[3].waits.clear();
    rejects(&graph, &plan, "events", &["step 3 reads 3.0 from step 2"]);
}

/// The happens-before order of three scales of one input on three streams with `events`.
fn happens_before(events: &[(usize, usize, &[usize], &[usize])]) -> order::HappensBefore {
    let mut g = Graph::new("fan");
    let x = g.input("x", InputKind::Input, f32t(&[4])).unwrap();
    for alpha in [1.0, 2.0, 3.0] {
        g.op1(Op::Scale { alpha }, &[x]).unwrap();
    }
    let plan = plan(
        PlanOptions {
            streams: 3,
            alignment: 64,
        },
        steps(&g, events),
        vec![],
        0,
    );
    let program = Program::read(&g, &crate::testing::TestWorkspaces);
    let step_of = check_schedule(&program, &plan).unwrap();
    order::check_events(&program, &plan, &step_of).unwrap()
}

#[test]
fn happens_before_is_transitive_and_waits_see_the_latest_record() {
    let chain = happens_before(&[(1, 0, &[], &[0]), (2, 1, &[0], &[1]), (3, 2, &[1], &[])]);
    assert!(chain.before(0, 1) && chain.before(1, 2) && chain.before(0, 2));
    assert!(!chain.before(2, 0) && !chain.before(1, 1));
    // Event 0 is recorded again on stream 1: the wait of step 2 sees only that record.
    let rerecorded = happens_before(&[(1, 0, &[], &[0]), (2, 1, &[], &[0]), (3, 2, &[0], &[])]);
    assert!(rerecorded.before(1, 2));
    assert!(!rerecorded.before(0, 2) && !rerecorded.before(0, 1));
}
