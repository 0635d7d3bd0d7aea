//! Hand-built graphs and plan checks shared by the planner's tests.

use kiln_ir::{
    AdamWConfig, DType, EmbeddingRows, Graph, InputKind, Op, Shape, TensorType, ValueId,
};

use crate::{Plan, PlanOptions};

pub fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims).unwrap()
}

pub fn input(g: &mut Graph, name: &str, kind: InputKind, dims: &[usize]) -> ValueId {
    g.input(name, kind, f32t(dims)).unwrap()
}

pub fn op1(g: &mut Graph, op: Op, operands: &[ValueId]) -> ValueId {
    g.op1(op, operands).unwrap()
}

pub fn broadcast(g: &mut Graph, x: ValueId, dims: &[usize]) -> ValueId {
    op1(
        g,
        Op::BroadcastTo {
            shape: Shape::new(dims),
        },
        &[x],
    )
}

pub fn sum_to(g: &mut Graph, x: ValueId, dims: &[usize]) -> ValueId {
    op1(
        g,
        Op::SumToShape {
            shape: Shape::new(dims),
        },
        &[x],
    )
}

pub fn matmul(g: &mut Graph, a: ValueId, b: ValueId, transpose_a: bool) -> ValueId {
    let op = Op::MatMul {
        transpose_a,
        transpose_b: false,
    };
    op1(g, op, &[a, b])
}

pub fn adamw_config() -> AdamWConfig {
    AdamWConfig {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    }
}

/// Adds param `name` with its moments and returns it; the caller adds `step`.
pub fn param_with_moments(g: &mut Graph, name: &str, dims: &[usize]) -> [ValueId; 3] {
    [
        input(g, name, InputKind::Param, dims),
        input(g, &format!("adamw.m.{name}"), InputKind::State, dims),
        input(g, &format!("adamw.v.{name}"), InputKind::State, dims),
    ]
}

/// `adamw(param, grad, m, v, step, lr)`, writing all three results back.
pub fn update(g: &mut Graph, name: &str, pmv: [ValueId; 3], grad: ValueId, step: [ValueId; 2]) {
    let [p, m, v] = pmv;
    let [step, lr] = step;
    let out = g
        .op(Op::AdamW(adamw_config()), &[p, grad, m, v, step, lr])
        .unwrap();
    g.write(name, out[0]).unwrap();
    g.write(&format!("adamw.m.{name}"), out[1]).unwrap();
    g.write(&format!("adamw.v.{name}"), out[2]).unwrap();
}

/// The optimizer's `step` and `lr` inputs.
pub fn step_input(g: &mut Graph) -> [ValueId; 2] {
    let scalar = |g: &mut Graph, name: &str, dtype| {
        let ty = TensorType::new(dtype, Shape::scalar()).unwrap();
        g.input(name, InputKind::Input, ty).unwrap()
    };
    [scalar(g, "step", DType::I64), scalar(g, "lr", DType::F64)]
}

/// A chain of `len` softmaxes of `[rows, cols]` over an input; the last is output `y`.
pub fn softmax_chain(len: usize, rows: usize, cols: usize) -> Graph {
    let mut g = Graph::new("chain");
    let mut x = input(&mut g, "x", InputKind::Input, &[rows, cols]);
    for _ in 0..len {
        x = op1(&mut g, Op::Softmax, &[x]);
    }
    g.output("y", x).unwrap();
    g
}

/// Two independent branches, each a big broadcast reduced to a small vector; node order
/// materializes both big temporaries before reducing either.
pub fn two_branches() -> Graph {
    let mut g = Graph::new("branches");
    let x = input(&mut g, "x", InputKind::Input, &[4]);
    let t1 = broadcast(&mut g, x, &[256, 4]);
    let t2 = broadcast(&mut g, x, &[256, 4]);
    let r1 = sum_to(&mut g, t1, &[4]);
    let r2 = sum_to(&mut g, t2, &[4]);
    let z = op1(&mut g, Op::Add, &[r1, r2]);
    g.output("z", z).unwrap();
    g
}

/// A train-like graph where node order keeps a gradient alive across a big temporary, and a
/// small long-lived value lures the list scheduler into running it first.
pub fn train_like() -> Graph {
    let mut g = Graph::new("train");
    let x = input(&mut g, "x", InputKind::Input, &[4]);
    let pmv = param_with_moments(&mut g, "w", &[64, 4]);
    let step = step_input(&mut g);
    let t = broadcast(&mut g, x, &[16, 64, 4]); // op 0
    let grad = sum_to(&mut g, t, &[64, 4]); // op 1
    let s = broadcast(&mut g, x, &[8, 4]); // op 2
    let q = broadcast(&mut g, x, &[16, 64, 4]); // op 3
    let r = sum_to(&mut g, q, &[4]); // op 4
    update(&mut g, "w", pmv, grad, step); // op 5
    let y = sum_to(&mut g, s, &[4]); // op 6
    let z = op1(&mut g, Op::Add, &[r, y]); // op 7
    g.output("z", z).unwrap();
    g
}

/// Plans with default options, panicking on error (tests only).
pub fn plan_default(g: &Graph) -> Plan {
    crate::plan(g, &PlanOptions::default(), &crate::testing::TestWorkspaces).unwrap()
}

/// Checks a single-stream plan's arena: offsets exactly on arena buffers, aligned, inside the
/// arena; buffers whose lifetimes overlap get disjoint bytes; arena >= lower bound.
pub fn check_arena(plan: &Plan) {
    let align = plan.options.alignment;
    let arena: Vec<_> = plan.buffers.iter().filter(|b| b.class.in_arena()).collect();
    for b in &plan.buffers {
        assert_eq!(b.offset.is_some(), b.class.in_arena(), "{b:?}");
    }
    for b in &arena {
        let offset = b.offset.unwrap();
        assert_eq!(offset % align, 0, "{b:?} not aligned to {align}");
        assert!(
            offset + b.size <= plan.arena_bytes,
            "{b:?} outside the arena"
        );
    }
    for (i, a) in arena.iter().enumerate() {
        for b in &arena[i + 1..] {
            let live_together = a.start <= b.end && b.start <= a.end;
            let (ao, bo) = (a.offset.unwrap(), b.offset.unwrap());
            let disjoint = ao + a.size <= bo || bo + b.size <= ao || a.size == 0 || b.size == 0;
            assert!(!live_together || disjoint, "{a:?} and {b:?} share bytes");
        }
    }
    assert!(plan.arena_bytes >= plan.lower_bound_bytes);
}

/// Peak of live aligned arena bytes computed straight from a plan's buffers.
pub fn live_peak(plan: &Plan) -> u64 {
    let align = plan.options.alignment;
    (0..plan.schedule.len().max(1))
        .map(|step| {
            plan.buffers
                .iter()
                .filter(|b| b.class.in_arena() && b.start <= step && step <= b.end)
                .map(|b| b.size.div_ceil(align) * align)
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// What each step of a plan reads and writes, as buffer ids (views read, never write).
pub fn step_accesses(g: &Graph, plan: &Plan) -> Vec<(Vec<usize>, Vec<usize>)> {
    let buffer_of: std::collections::HashMap<&str, usize> = plan
        .value_buffers
        .iter()
        .map(|(v, b)| (v.as_str(), *b))
        .collect();
    let buffer = |v: ValueId| buffer_of[format!("{}.{}", v.node.index(), v.port).as_str()];
    // A result written in place writes its input's buffer too.
    let in_place: Vec<(ValueId, usize)> = (g.writes().iter())
        .filter(|(name, _)| plan.in_place_writes.contains(name))
        .filter_map(|(name, value)| {
            let (input, ..) = g.inputs().into_iter().find(|(_, n, ..)| n == name)?;
            Some((*value, buffer(input)))
        })
        .collect();
    plan.schedule
        .iter()
        .map(|step| {
            let node = g.node_indices().find(|n| n.index() == step.node).unwrap();
            let reads = g.operands(node).into_iter().map(buffer).collect();
            let kiln_ir::graph::NodeKind::Op(op) = &g.node(node).unwrap().kind else {
                panic!("step {step:?} is not an op");
            };
            let outputs = g.node(node).unwrap().outputs.len();
            let writes = (0..outputs)
                .filter(|&port| !matches!(op.alias(port), kiln_ir::Alias::ViewOf(_)))
                .flat_map(|port| {
                    let value = ValueId { node, port };
                    let input = in_place.iter().find(|(v, _)| *v == value).map(|&(_, b)| b);
                    std::iter::once(buffer(value)).chain(input)
                })
                .collect();
            (reads, writes)
        })
        .collect()
}

/// `hb[a][b]`: step a happens-before step b (program order per stream plus events).
pub fn happens_before(plan: &Plan) -> Vec<Vec<bool>> {
    let n = plan.schedule.len();
    let mut successors = vec![Vec::new(); n];
    for (s, step) in plan.schedule.iter().enumerate() {
        if let Some(next) = (s + 1..n).find(|&t| plan.schedule[t].stream == step.stream) {
            successors[s].push(next);
        }
        for &event in &step.records {
            for (t, waiter) in plan.schedule.iter().enumerate() {
                if waiter.waits.contains(&event) {
                    assert!(t > s, "step {t} waits for event {event} recorded later");
                    successors[s].push(t);
                }
            }
        }
    }
    let mut hb = vec![vec![false; n]; n];
    for s in (0..n).rev() {
        for &t in &successors[s] {
            hb[s][t] = true;
            let (head, tail) = hb.split_at_mut(t);
            for (x, &reach) in head[s].iter_mut().zip(&tail[0]) {
                *x |= reach;
            }
        }
    }
    hb
}

/// Pairs of steps (a < b) that must be ordered: they touch the same buffer and one writes it.
pub fn hazards(g: &Graph, plan: &Plan) -> Vec<(usize, usize)> {
    let access = step_accesses(g, plan);
    let mut pairs = Vec::new();
    for b in 0..access.len() {
        for a in 0..b {
            let (ra, wa) = &access[a];
            let (rb, wb) = &access[b];
            let conflict = wa.iter().any(|x| rb.contains(x) || wb.contains(x))
                || wb.iter().any(|x| ra.contains(x));
            if conflict {
                pairs.push((a, b));
            }
        }
    }
    pairs
}

/// Joins the planner promises: when a chain (a side-stream matmul) starts, the next stream-0
/// step comes after the end of the chain `SIDE_LAG` chains before it on that stream (the side
/// stream's last step before chain `SIDE_LAG - 1` back starts).
pub fn joins(plan: &Plan) -> Vec<(usize, usize)> {
    let steps = &plan.schedule;
    let mut starts: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    let mut pairs = Vec::new();
    for (g, step) in steps.iter().enumerate() {
        if step.stream == 0 || !step.op.starts_with("matmul") {
            continue;
        }
        let chains = starts.entry(step.stream).or_default();
        chains.push(g);
        let Some(&from) = chains
            .len()
            .checked_sub(crate::streams::SIDE_LAG)
            .map(|k| &chains[k])
        else {
            continue;
        };
        let previous = (0..from).rev().find(|&p| steps[p].stream == step.stream);
        let next_main = (g + 1..steps.len()).find(|&t| steps[t].stream == 0);
        if let (Some(p), Some(t)) = (previous, next_main) {
            pairs.push((p, t));
        }
    }
    pairs
}

/// Checks a multi-stream plan: every hazard and join is ordered, no wait is redundant, and two
/// arena buffers share bytes only if every use of one happens-before the other's first writer.
pub fn check_streams(g: &Graph, plan: &Plan) {
    let hb = happens_before(plan);
    let mut hazards = hazards(g, plan);
    for &(a, b) in &hazards {
        assert!(hb[a][b], "steps {a} and {b} race");
    }
    for &(a, b) in &joins(plan) {
        assert!(hb[a][b], "step {b} does not join step {a}");
    }
    hazards.extend(joins(plan));
    for s in 0..plan.schedule.len() {
        for i in 0..plan.schedule[s].waits.len() {
            let mut without = plan.clone();
            without.schedule[s].waits.remove(i);
            let hb = happens_before(&without);
            assert!(
                hazards.iter().any(|&(a, b)| !hb[a][b]),
                "wait {i} of step {s} is redundant"
            );
        }
    }
    let access = step_accesses(g, plan);
    let uses = |buffer: usize| -> Vec<usize> {
        (0..access.len())
            .filter(|&s| access[s].0.contains(&buffer) || access[s].1.contains(&buffer))
            .collect()
    };
    let arena: Vec<_> = plan.buffers.iter().filter(|b| b.class.in_arena()).collect();
    for a in &arena {
        for b in &arena {
            let (ao, bo) = (a.offset.unwrap(), b.offset.unwrap());
            let share = ao < bo + b.size && bo < ao + a.size;
            if a.id == b.id || !share || a.start > b.start || (a.start == b.start && a.id > b.id) {
                continue;
            }
            let a_uses: Vec<usize> = if a.class == crate::BufferClass::Workspace {
                vec![a.start]
            } else {
                uses(a.id)
            };
            for u in a_uses {
                assert!(
                    hb[u][b.start],
                    "{} shares bytes with {} but its use at step {u} may run after step {}",
                    a.name, b.name, b.start
                );
            }
        }
    }
}

/// A synthetic training step of `layers` layers, about 11 nodes per layer: the forward pass
/// keeps activations for the backward pass, which computes a weight gradient per layer
/// (updated by AdamW) and an input gradient, partly in place.
pub fn synthetic_train(layers: usize, tokens: usize, hidden: usize) -> Graph {
    let mut g = Graph::new("synthetic-train");
    let x = input(&mut g, "x", InputKind::Input, &[tokens, hidden]);
    let step = step_input(&mut g);
    let params: Vec<[ValueId; 3]> = (0..layers)
        .map(|l| param_with_moments(&mut g, &format!("w{l}"), &[hidden, hidden]))
        .collect();
    let mut h = x;
    let mut saved = Vec::new();
    for pmv in &params {
        let a = matmul(&mut g, h, pmv[0], false);
        let b = op1(&mut g, Op::Softmax, &[a]);
        let next = op1(&mut g, Op::Add, &[b, h]);
        saved.push((h, a, b));
        h = next;
    }
    let mut grad = op1(&mut g, Op::Softmax, &[h]);
    for (l, pmv) in params.iter().enumerate().rev() {
        let (h_in, a, b) = saved[l];
        let gw = matmul(&mut g, h_in, grad, true);
        update(&mut g, &format!("w{l}"), *pmv, gw, step);
        let back = matmul(&mut g, grad, pmv[0], false);
        let gated = op1(&mut g, Op::Mul, &[back, b]);
        grad = op1(&mut g, Op::Add, &[gated, a]);
    }
    g.output("grad.x", grad).unwrap();
    g
}

/// An embedding's train step in miniature: `h = table[ids]`, logits `h·tableᵀ`, a backward
/// `grad` for the gathered rows that comes late (after more work on `h`), and the table's
/// update as the fusion pass makes it: its unnamed rows, then its named rows from `grad`, the
/// second reading the first's results; both write `table`, `adamw.m.table` and
/// `adamw.v.table`. When `tied`, the table is also the head: the head's gradient `head` (from
/// the logits) is the base of both updates, so the unnamed rows wait for it; otherwise they
/// need only the state.
pub fn embedding_train(tied: bool, [vocab, hidden, tokens]: [usize; 3]) -> Graph {
    let mut g = Graph::new("embedding-train");
    let [table, m, v] = param_with_moments(&mut g, "table", &[vocab, hidden]);
    let ids_type = TensorType::new(DType::I64, [tokens]).unwrap();
    let ids = g.input("ids", InputKind::Input, ids_type).unwrap();
    let [step, lr] = step_input(&mut g);
    let h = op1(&mut g, Op::Embedding, &[table, ids]);
    let transposed = Op::MatMul {
        transpose_a: false,
        transpose_b: true,
    };
    let logits = op1(&mut g, transposed, &[h, table]);
    let probs = op1(&mut g, Op::Softmax, &[logits]);
    let head = tied.then(|| matmul(&mut g, probs, h, true));
    let mut grad = op1(&mut g, Op::Softmax, &[h]);
    for _ in 0..4 {
        grad = op1(&mut g, Op::Softmax, &[grad]);
    }
    if !tied {
        g.output("probs", probs).unwrap();
    }
    let op = |rows| Op::EmbeddingAdamW {
        config: adamw_config(),
        onto: tied,
        copy: false,
        rows,
    };
    let mut operands = vec![table, m, v, step, lr, ids];
    operands.extend(head);
    let unnamed = g.op(op(EmbeddingRows::Unnamed), &operands).unwrap();
    let mut operands = vec![unnamed[0], unnamed[1], unnamed[2], step, lr, ids, grad];
    operands.extend(head);
    let named = g.op(op(EmbeddingRows::Named), &operands).unwrap();
    for (name, value) in ["table", "adamw.m.table", "adamw.v.table"]
        .iter()
        .zip(named)
    {
        g.write(name, value).unwrap();
    }
    g
}
