use std::time::Instant;

use kiln_ir::{DType, Graph, InputKind, Op, TensorType, ValueId};

use super::*;
use crate::schedule::{ADAMW_EARLY, LIST, NODE_ORDER};
use crate::test_graphs::*;

#[test]
fn a_chain_reuses_bytes_down_to_the_lower_bound() {
    let g = softmax_chain(6, 8, 16);
    let plan = plan_default(&g);
    check_arena(&plan);
    let activations: Vec<_> = plan.buffers.iter().filter(|b| b.class.in_arena()).collect();
    assert_eq!(activations.len(), 5);
    let sum: u64 = activations.iter().map(|b| b.size).sum();
    assert_eq!(sum, 5 * 512);
    assert_eq!(plan.lower_bound_bytes, 2 * 512);
    assert_eq!(plan.arena_bytes, plan.lower_bound_bytes);
    assert_eq!(plan.lower_bound_bytes, live_peak(&plan));
    assert_eq!(plan.schedule_strategy, NODE_ORDER);
    assert_eq!(plan.program, "chain");
    assert_eq!(plan.offset_candidates.len(), 6);
    assert!(plan
        .offset_candidates
        .contains(&(plan.offset_strategy.clone(), plan.arena_bytes)));
}

#[test]
fn planning_twice_gives_the_same_plan_and_hash() {
    let g = synthetic_train(6, 8, 16);
    for streams in [1, 3] {
        let options = PlanOptions {
            streams,
            alignment: 256,
        };
        let first = plan(&g, &options, &crate::testing::TestWorkspaces).unwrap();
        let second = plan(&g, &options, &crate::testing::TestWorkspaces).unwrap();
        assert_eq!(first, second);
        assert_eq!(first.hash, second.hash);
        assert_eq!(first.hash, plan_hash(&first).unwrap());
        assert_eq!(first.hash.len(), 16);
        assert!(first.hash.chars().all(|c| c.is_ascii_hexdigit()));
    }
    let one = plan(&g, &PlanOptions::default(), &crate::testing::TestWorkspaces).unwrap();
    let aligned = plan(
        &g,
        &PlanOptions {
            streams: 1,
            alignment: 512,
        },
        &crate::testing::TestWorkspaces,
    )
    .unwrap();
    assert_ne!(one.hash, aligned.hash);
    let mut edited = one.clone();
    edited.arena_bytes += 1;
    assert_ne!(plan_hash(&edited).unwrap(), one.hash);
}

#[test]
fn the_lowest_peak_schedule_wins() {
    let plan = plan_default(&two_branches());
    assert_eq!(plan.schedule_strategy, LIST);
    assert_eq!(plan.lower_bound_bytes, 4096 + 256);
    check_arena(&plan);

    let g = train_like();
    let plan = plan_default(&g);
    assert_eq!(plan.schedule_strategy, ADAMW_EARLY);
    assert_eq!(plan.lower_bound_bytes, 16384 + 1024);
    let nodes: Vec<usize> = plan.schedule.iter().map(|s| s.node).collect();
    // x, w, m, v, step, lr are nodes 0-5; the update (node 11) runs right after its gradient.
    assert_eq!(nodes, [6, 7, 11, 8, 9, 10, 12, 13]);
    check_arena(&plan);
}

#[test]
fn plan_fields_follow_the_graph() {
    let g = synthetic_train(2, 4, 8);
    let plan = plan_default(&g);
    check_arena(&plan);
    for (id, b) in plan.buffers.iter().enumerate() {
        assert_eq!(b.id, id);
    }
    // Inputs first, in node order: x, step, lr, then w/m/v per layer.
    let names: Vec<&str> = plan.buffers[..6].iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["x", "step", "lr", "w0", "adamw.m.w0", "adamw.v.w0"]);
    // Every value once, sorted numerically by node then port.
    let values: Vec<(usize, usize)> = plan
        .value_buffers
        .iter()
        .map(|(v, _)| {
            let (node, port) = v.split_once('.').unwrap();
            (node.parse().unwrap(), port.parse().unwrap())
        })
        .collect();
    let mut sorted = values.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(values, sorted);
    let value_count: usize = g
        .node_indices()
        .map(|n| g.node(n).unwrap().outputs.len())
        .sum();
    assert_eq!(values.len(), value_count);
    assert!(values.iter().any(|&(node, _)| node >= 10));
    for (value, b) in &plan.value_buffers {
        assert!(
            plan.buffers[*b].values.contains(value),
            "{value} not in buffer {b}"
        );
    }
    let step = &plan.schedule[0];
    assert_eq!(step.op, "matmul{transpose_a=false, transpose_b=false}");
    assert_eq!(
        (step.stream, step.waits.len(), step.records.len()),
        (0, 0, 0)
    );
    let op_nodes = g
        .node_indices()
        .filter(|&n| matches!(g.node(n).unwrap().kind, kiln_ir::graph::NodeKind::Op(_)));
    assert_eq!(plan.schedule.len(), op_nodes.count());
    // Buffers read by no one after their writer still live at the writer's step.
    for b in &plan.buffers {
        assert!(b.start <= b.end, "{b:?}");
    }
}

#[test]
fn offsets_respect_every_alignment() {
    // f32[3,5] = 60 bytes: unaligned at every alignment above 4.
    let g = softmax_chain(5, 3, 5);
    for alignment in [1, 4, 64, 256, 4096] {
        let plan = plan(
            &g,
            &PlanOptions {
                streams: 1,
                alignment,
            },
            &crate::testing::TestWorkspaces,
        )
        .unwrap();
        check_arena(&plan);
        assert_eq!(
            plan.lower_bound_bytes,
            2 * 60u64.div_ceil(alignment) * alignment
        );
        assert_eq!(plan.arena_bytes % alignment, 0);
    }
}

#[test]
fn workspaces_outputs_and_writes_are_placed_by_class() {
    let mut g = Graph::new("classes");
    let pmv = param_with_moments(&mut g, "w", &[4, 4]);
    let step = step_input(&mut g);
    let bf16 = |d: &[usize]| TensorType::new(DType::BF16, d).unwrap();
    let a = g.input("a", InputKind::Input, bf16(&[4, 8])).unwrap();
    let b = g.input("b", InputKind::Input, bf16(&[8, 4])).unwrap();
    let y = matmul(&mut g, a, b, false);
    let grad = op1(&mut g, Op::Softmax, &[y]);
    update(&mut g, "w", pmv, grad, step);
    let loss = op1(&mut g, Op::Scale { alpha: 0.5 }, &[grad]);
    g.output("loss", loss).unwrap();
    let plan = plan_default(&g);
    check_arena(&plan);
    let by_class = |class| plan.buffers.iter().filter(move |b| b.class == class);
    let workspace: Vec<_> = by_class(BufferClass::Workspace).collect();
    assert_eq!(workspace.len(), 1);
    assert_eq!(workspace[0].size, (32 + 32) * 4);
    assert_eq!(workspace[0].start, workspace[0].end);
    // loss (computed in place over grad, after the update read grad) and the 3 writes.
    assert_eq!(by_class(BufferClass::Output).count(), 4);
    for b in by_class(BufferClass::Output) {
        assert_eq!((b.offset, b.end), (None, plan.schedule.len() - 1));
    }
    let loss = plan.buffers.iter().find(|b| b.name == "loss").unwrap();
    assert_eq!(loss.values.len(), 2);
    // y is the only activation; it and the workspace are live at the matmul's step.
    assert_eq!(by_class(BufferClass::Activation).count(), 1);
    assert_eq!(plan.arena_bytes, 256 + 256);
}

#[test]
fn bad_options_and_bad_graphs_are_errors() {
    let g = softmax_chain(2, 2, 2);
    let err = plan(
        &g,
        &PlanOptions {
            streams: 0,
            alignment: 256,
        },
        &crate::testing::TestWorkspaces,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Option {
                option: "streams",
                ..
            }
        ),
        "{err}"
    );
    let err = plan(
        &g,
        &PlanOptions {
            streams: 1,
            alignment: 0,
        },
        &crate::testing::TestWorkspaces,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Option {
                option: "alignment",
                ..
            }
        ),
        "{err}"
    );

    // Refused before the stream plan sizes anything by the count.
    for streams in [MAX_STREAMS + 1, 1 << 32, usize::MAX] {
        let options = PlanOptions {
            streams,
            ..PlanOptions::default()
        };
        let err = plan(&g, &options, &crate::testing::TestWorkspaces).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "plan option `streams`: {streams} is more than the 64 streams the planner supports"
            )
        );
    }
    let widest = PlanOptions {
        streams: MAX_STREAMS,
        ..PlanOptions::default()
    };
    plan(&g, &widest, &crate::testing::TestWorkspaces).unwrap();

    let mut broken = softmax_chain(2, 2, 2);
    let missing = ValueId {
        node: broken.node_indices().next().unwrap(),
        port: 7,
    };
    broken.push_unchecked(Some(("ghost".to_string(), missing)), None);
    let err = plan(
        &broken,
        &PlanOptions::default(),
        &crate::testing::TestWorkspaces,
    )
    .unwrap_err();
    assert!(matches!(err, Error::Graph(_)), "{err}");
    assert!(err.to_string().contains("ghost"), "{err}");
}

#[test]
fn a_graph_without_ops_plans_to_an_empty_arena() {
    let mut g = Graph::new("inputs-only");
    let x = input(&mut g, "x", InputKind::Input, &[4]);
    g.output("x", x).unwrap();
    let plan = plan_default(&g);
    assert!(plan.schedule.is_empty());
    assert_eq!(
        (plan.arena_bytes, plan.lower_bound_bytes, plan.events),
        (0, 0, 0)
    );
    assert_eq!(plan.buffers.len(), 1);
    assert_eq!(plan.buffers[0].class, BufferClass::Input);
}

#[test]
fn a_five_thousand_node_graph_plans_correctly_and_fast() {
    let g = synthetic_train(450, 16, 32);
    let nodes = g.node_indices().count();
    assert!(nodes >= 4900, "{nodes} nodes");
    for streams in [1, 4] {
        let options = PlanOptions {
            streams,
            alignment: 256,
        };
        // The fastest of three runs (the first also pays for warming the allocator).
        let mut elapsed = std::time::Duration::MAX;
        let mut planned = None;
        for _ in 0..3 {
            let started = Instant::now();
            planned = Some(plan(&g, &options, &crate::testing::TestWorkspaces).unwrap());
            elapsed = elapsed.min(started.elapsed());
        }
        let plan = planned.unwrap();
        println!(
            "{nodes} nodes, {streams} stream(s): planned in {elapsed:?}; {} buffers, arena {} \
             (lower bound {}), schedule {}, offsets {}, {} events",
            plan.buffers.len(),
            plan.arena_bytes,
            plan.lower_bound_bytes,
            plan.schedule_strategy,
            plan.offset_strategy,
            plan.events
        );
        check_arena(&plan);
        let sum: u64 = plan
            .buffers
            .iter()
            .filter(|b| b.class.in_arena())
            .map(|b| b.size)
            .sum();
        // Half the activations are kept for the backward pass; the rest share bytes.
        assert!(
            plan.arena_bytes < sum,
            "arena {} of {sum}",
            plan.arena_bytes
        );
    }
}
