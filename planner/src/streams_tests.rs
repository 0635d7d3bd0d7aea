use kiln_ir::{Graph, InputKind, Op};

use super::*;
use crate::test_graphs::*;
use crate::PlanOptions;

/// A miniature backward pass (node order = steps):
/// 0 h = x·w1, 1 dh = dy·w2, 2 gw2 = hᵀ·dy, 3 adamw(w2), 4 gw1 = hᵀ·dh, 5 adamw(w1),
/// 6 o = 2h (in place over h), 7 y = softmax(o).
fn backward() -> Graph {
    let mut g = Graph::new("backward");
    let x = input(&mut g, "x", InputKind::Input, &[8, 16]);
    let dy = input(&mut g, "dy", InputKind::Input, &[8, 16]);
    let w1 = param_with_moments(&mut g, "w1", &[16, 16]);
    let w2 = param_with_moments(&mut g, "w2", &[16, 16]);
    let step = step_input(&mut g);
    let h = matmul(&mut g, x, w1[0], false);
    let dh = matmul(&mut g, dy, w2[0], false);
    let gw2 = matmul(&mut g, h, dy, true);
    update(&mut g, "w2", w2, gw2, step);
    let gw1 = matmul(&mut g, h, dh, true);
    update(&mut g, "w1", w1, gw1, step);
    let o = op1(&mut g, Op::Scale { alpha: 2.0 }, &[h]);
    let y = op1(&mut g, Op::Softmax, &[o]);
    g.output("y", y).unwrap();
    g
}

fn node_order_streams(g: &Graph, streams: usize) -> (StreamPlan, Buffers) {
    let program = Program::new(g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    let order: Vec<usize> = (0..program.ops.len()).collect();
    let buffers = Buffers::build(&program, &order).unwrap();
    let plan = StreamPlan::new(&program, &order, &buffers, streams);
    (plan, buffers)
}

#[test]
fn one_stream_has_no_events_and_keeps_every_end() {
    let g = backward();
    let (plan, buffers) = node_order_streams(&g, 1);
    assert_eq!(plan.stream_of_step, [0; 8]);
    assert_eq!(plan.events, 0);
    assert!(plan.waits.iter().chain(&plan.records).all(Vec::is_empty));
    for b in buffers.list.iter().filter(|b| b.class.in_arena()) {
        assert_eq!(plan.busy_until(&b.users, b.end), [b.end], "{}", b.name);
    }
}

#[test]
fn two_streams_put_weight_gradients_and_their_updates_on_stream_one() {
    let g = backward();
    let (plan, buffers) = node_order_streams(&g, 2);
    assert_eq!(plan.stream_of_step, [0, 0, 1, 1, 1, 1, 0, 0]);
    // gw2 waits for h; w2's update waits for dh, the other reader of w2, so that it may write
    // w2 in place, and gw1 then knows dh (and h) already; o overwrites h in place, so it waits
    // until gw1, the last reader of h on stream 1.
    assert_eq!(
        plan.waits,
        [
            vec![],
            vec![],
            vec![0],
            vec![1],
            vec![],
            vec![],
            vec![2],
            vec![]
        ]
    );
    assert_eq!(
        plan.records,
        [
            vec![0],
            vec![1],
            vec![],
            vec![],
            vec![2],
            vec![],
            vec![],
            vec![]
        ]
    );
    assert_eq!(plan.events, 3);
    // dh is last read at step 4 on stream 1; step 5 follows it on stream 1 and step 6 waits
    // for it on stream 0, so its bytes are free after step 4 on every stream.
    let dh = &buffers.list[buffers.of_value[program_value(&g, 1)]];
    assert_eq!((dh.start, dh.end), (1, 4));
    assert_eq!(plan.busy_until(&dh.users, dh.end), [4, 4]);
}

/// Value number of op `op`'s first result (ops follow the 9 inputs, one result each until
/// the first AdamW, so this holds for ops 0..=2).
fn program_value(g: &Graph, op: usize) -> usize {
    let program = Program::new(g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    program.ops[op].results[0]
}

#[test]
fn three_streams_round_robin_and_join_both_before_the_in_place_write() {
    let g = backward();
    let (plan, buffers) = node_order_streams(&g, 3);
    assert_eq!(plan.stream_of_step, [0, 0, 1, 1, 2, 2, 0, 0]);
    assert_eq!(plan.records[0], [0]);
    assert_eq!(plan.waits[2], [0]);
    assert_eq!(plan.records[1], [1]);
    assert_eq!(plan.waits[4], [1]);
    // Step 6 needs both side streams: gw1 (step 4, event 2) and gw2 (step 2, event 3).
    assert_eq!(plan.records[4], [2]);
    assert_eq!(plan.records[2], [3]);
    assert_eq!(plan.waits[6], [2, 3]);
    assert_eq!(plan.events, 4);
    // gw2 is last read by its update at step 3 on stream 1, and no step ever waits for step
    // 3: only stream 1 itself knows it is done, so its bytes stay busy to the end elsewhere.
    let gw2 = &buffers.list[buffers.of_value[program_value(&g, 2)]];
    assert_eq!((gw2.start, gw2.end), (2, 3));
    assert_eq!(plan.busy_until(&gw2.users, gw2.end), [7, 3, 5]);
}

#[test]
fn only_gradient_gemms_move_off_stream_zero() {
    let mut g = Graph::new("not-gradients");
    let x = input(&mut g, "x", InputKind::Input, &[8, 16]);
    let w = input(&mut g, "w", InputKind::Param, &[16, 16]);
    let a = matmul(&mut g, x, w, false);
    let named = matmul(&mut g, a, x, true);
    g.output("grad.w", named).unwrap();
    let logits = matmul(&mut g, a, w, false);
    g.output("logits", logits).unwrap();
    let (plan, _) = node_order_streams(&g, 4);
    assert_eq!(plan.stream_of_step, [0, 1, 0]);
    assert_eq!(plan.waits[1], [0]);
}

#[test]
fn planned_backward_graphs_are_race_free_minimal_and_share_bytes_safely() {
    for streams in 1..=4 {
        let g = backward();
        let options = PlanOptions {
            streams,
            alignment: 256,
        };
        let plan = crate::plan(&g, &options, &crate::testing::TestWorkspaces).unwrap();
        check_streams(&g, &plan);
        check_arena(&plan);
        if streams > 1 {
            assert!(plan.events > 0);
            assert!(plan.schedule.iter().any(|s| s.stream > 0));
        }
    }
}

#[test]
fn a_wait_already_covered_on_the_waiting_stream_is_not_repeated() {
    let mut g = Graph::new("covered");
    let x = input(&mut g, "x", InputKind::Input, &[8, 16]);
    let dy = input(&mut g, "dy", InputKind::Input, &[8, 16]);
    let w = input(&mut g, "w", InputKind::Param, &[16, 16]);
    let h = matmul(&mut g, x, w, false);
    let g1 = matmul(&mut g, h, dy, true);
    g.output("grad.a", g1).unwrap();
    let g2 = matmul(&mut g, h, x, true);
    g.output("grad.b", g2).unwrap();
    let (plan, _) = node_order_streams(&g, 2);
    assert_eq!(plan.stream_of_step, [0, 1, 1]);
    // Step 2 reads h too, but stream 1 already waited for it before step 1.
    assert_eq!(plan.waits, [vec![], vec![0], vec![]]);
    assert_eq!(plan.events, 1);
    let planned = crate::plan(
        &g,
        &PlanOptions {
            streams: 2,
            alignment: 256,
        },
        &crate::testing::TestWorkspaces,
    )
    .unwrap();
    check_streams(&g, &planned);
}

/// `chains` weight-gradient GEMMs, each reading its own activation, with stream-0 work
/// between them: 0 h0, then per chain k: gk = hkᵀ·dy (+ cast), h(k+1) = softmax(hk).
fn many_chains(chains: usize) -> Graph {
    let mut g = Graph::new("chains");
    let dy = input(&mut g, "dy", InputKind::Input, &[8, 16]);
    let mut h = op1(&mut g, Op::Softmax, &[dy]);
    for k in 0..chains {
        let gk = matmul(&mut g, h, dy, true);
        let rounded = op1(
            &mut g,
            Op::Cast {
                to: kiln_ir::DType::BF16,
            },
            &[gk],
        );
        let back = op1(
            &mut g,
            Op::Cast {
                to: kiln_ir::DType::F32,
            },
            &[rounded],
        );
        g.output(&format!("grad.w{k}"), back).unwrap();
        h = op1(&mut g, Op::Softmax, &[h]);
    }
    g.output("h", h).unwrap();
    g
}

#[test]
fn stream_zero_joins_a_side_stream_when_its_next_chain_starts() {
    let chains = SIDE_LAG + 3;
    let g = many_chains(chains);
    let (plan, buffers) = node_order_streams(&g, 2);
    // Steps: 0 h0; per chain k (base 1+4k): matmul, cast, cast on stream 1, softmax on 0.
    let mut streams = vec![0];
    for _ in 0..chains {
        streams.extend([1, 1, 1, 0]);
    }
    assert_eq!(plan.stream_of_step, streams);
    // Each chain waits for the activation it reads; once chain k starts, the softmax right
    // after it joins chain k - SIDE_LAG (its last cast), and no earlier softmax joins.
    assert_eq!(plan.waits[1], [0]);
    for k in 0..chains {
        let softmax = 4 + 4 * k;
        let want = match k.checked_sub(SIDE_LAG) {
            Some(joined) => vec![plan.records[3 + 4 * joined][0]],
            None => Vec::new(),
        };
        assert_eq!(plan.waits[softmax], want, "chain {k}");
    }
    // Chain 0's bf16 gradient (value 3) is last read at step 3 on stream 1; stream 0 learns
    // that at its join at step 4 (SIDE_LAG + 1), so the stream-0 steps before it may not
    // reuse its bytes. Without joins no stream-0 step would ever come after it.
    let rounded = &buffers.list[buffers.of_value[3]];
    assert_eq!((rounded.start, rounded.end), (2, 3));
    assert_eq!(
        plan.busy_until(&rounded.users, rounded.end),
        [4 * SIDE_LAG, 3]
    );
    let planned = crate::plan(
        &g,
        &PlanOptions {
            streams: 2,
            alignment: 256,
        },
        &crate::testing::TestWorkspaces,
    )
    .unwrap();
    check_streams(&g, &planned);
    check_arena(&planned);
}

#[test]
fn a_read_through_a_view_waits_for_the_op_that_wrote_the_data() {
    let mut g = Graph::new("view-dependency");
    let x = input(&mut g, "x", InputKind::Input, &[2, 4, 16]);
    let dy = input(&mut g, "dy", InputKind::Input, &[8, 16]);
    let h = op1(&mut g, Op::Softmax, &[x]);
    let flat = op1(
        &mut g,
        Op::Reshape {
            shape: kiln_ir::Shape::new(&[8, 16]),
        },
        &[h],
    );
    let gw = matmul(&mut g, flat, dy, true);
    g.output("grad.w", gw).unwrap();
    let (plan, _) = node_order_streams(&g, 2);
    assert_eq!(plan.stream_of_step, [0, 0, 1]);
    // The reshape moves no data: the matmul waits for the softmax that wrote it.
    assert_eq!(plan.records, [vec![0], vec![], vec![]]);
    assert_eq!(plan.waits[2], [0]);
}
