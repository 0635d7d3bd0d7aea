//! Hand-built graphs and plan checks shared by the planner's tests.

use kiln_ir::{AdamWConfig, DType, Graph, InputKind, Op, Shape, TensorType, ValueId};

use crate::{Plan, PlanOptions};

pub fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims)
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
        lr: 1e-3,
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

/// `adamw(param, grad, m, v, step)`, writing all three results back.
pub fn update(g: &mut Graph, name: &str, pmv: [ValueId; 3], grad: ValueId, step: ValueId) {
    let [p, m, v] = pmv;
    let out = g
        .op(Op::AdamW(adamw_config()), &[p, grad, m, v, step])
        .unwrap();
    g.write(name, out[0]).unwrap();
    g.write(&format!("adamw.m.{name}"), out[1]).unwrap();
    g.write(&format!("adamw.v.{name}"), out[2]).unwrap();
}

pub fn step_input(g: &mut Graph) -> ValueId {
    g.input(
        "step",
        InputKind::Input,
        TensorType::new(DType::I64, Shape::scalar()),
    )
    .unwrap()
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

/// Plans with default options, panicking on error (tests only).
pub fn plan_default(g: &Graph) -> Plan {
    crate::plan(g, &PlanOptions::default()).unwrap()
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

/// Position of each node in a plan's schedule.
pub fn step_of_node(plan: &Plan, node: ValueId) -> usize {
    plan.schedule
        .iter()
        .position(|s| s.node == node.node.index())
        .unwrap()
}
