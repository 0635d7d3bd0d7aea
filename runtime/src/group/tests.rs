//! What a group shares, computed without a backend: its memory sizes, its shared inputs, the
//! refusal of programs that disagree on one, and index rules that follow a shared slot. The
//! two programs here, and [`members_equal_standalone_executables`], are the backends' group
//! tests too.

use std::collections::BTreeMap;

use kiln_ir::{DType, Graph, InputKind, Op, TensorType, ValueId};
use kiln_kernels::testing;
use kiln_planner::{plan, Plan, PlanOptions};
use rand::rngs::StdRng;

use super::GroupMemory;
use crate::backend::{Executable, RunMode};
use crate::index_inputs::group_index_rules;
use crate::{Error, Tensor, Workspaces};

fn random(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let values = testing::to_f32(&testing::signed(rng, dims.iter().product()));
    Tensor::from_vec(values, dims).unwrap()
}

fn bits(tensor: &Tensor) -> Vec<u64> {
    let values = tensor.to_f64_vec().unwrap();
    values.iter().map(|v| v.to_bits()).collect()
}

/// `plan` with `value` moved into the buffer of `input`: an in-place result over an input.
pub(crate) fn in_place(plan: &mut Plan, value: ValueId, input: ValueId) {
    let key = |v: ValueId| format!("{}.{}", v.node.index(), v.port);
    let buffer_of = |plan: &Plan, v| plan.value_buffers.iter().position(|(k, _)| *k == key(v));
    let buffer = plan.value_buffers[buffer_of(plan, input).unwrap()].1;
    let index = buffer_of(plan, value).unwrap();
    plan.value_buffers[index].1 = buffer;
}

fn ty(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims).unwrap()
}

/// `accumulate`: `s ← s + x·w`, output `y = s'·w`; param `w`, state `s`, per-run `x` [3, 4].
pub(crate) fn accumulate() -> Graph {
    let mut graph = Graph::new("accumulate");
    let w = graph.input("w", InputKind::Param, ty(&[3, 4])).unwrap();
    let s = graph.input("s", InputKind::State, ty(&[3, 4])).unwrap();
    let x = graph.input("x", InputKind::Input, ty(&[3, 4])).unwrap();
    let p = graph.op1(Op::Mul, &[x, w]).unwrap();
    let s2 = graph.op1(Op::Add, &[s, p]).unwrap();
    let y = graph.op1(Op::Mul, &[s2, w]).unwrap();
    graph.output("y", y).unwrap();
    graph.write("s", s2).unwrap();
    graph
}

/// `decay`: `s ← w·s + Σ x/2` (x summed over its first dim), output `z = softmax(s')`; the
/// same `s` and `w` as [`accumulate`], a per-run `x` of another shape, [8, 3, 4], and a larger
/// arena. The product may overwrite `w`, not `s`, so `s` is not written in place.
pub(crate) fn decay() -> Graph {
    let mut graph = Graph::new("decay");
    let s = graph.input("s", InputKind::State, ty(&[3, 4])).unwrap();
    let w = graph.input("w", InputKind::Param, ty(&[3, 4])).unwrap();
    let x = graph.input("x", InputKind::Input, ty(&[8, 3, 4])).unwrap();
    let half = graph.op1(Op::Scale { alpha: 0.5 }, &[x]).unwrap();
    let shape = [3, 4].into();
    let r = graph.op1(Op::SumToShape { shape }, &[half]).unwrap();
    let a = graph.op1(Op::Mul, &[w, s]).unwrap();
    let s2 = graph.op1(Op::Add, &[a, r]).unwrap();
    let z = graph.op1(Op::Softmax, &[s2]).unwrap();
    graph.output("z", z).unwrap();
    graph.write("s", s2).unwrap();
    graph
}

/// `graph` planned for `workspaces` on `streams` streams.
pub(crate) fn planned(graph: &Graph, streams: usize, workspaces: &Workspaces) -> Plan {
    let options = PlanOptions {
        streams,
        ..PlanOptions::default()
    };
    plan(graph, &options, workspaces).unwrap()
}

/// Makes a group's members (boxed) and what they share.
pub(crate) type MakeGroup<'m> =
    &'m dyn Fn(&[(&Graph, &Plan)]) -> (Vec<Box<dyn Executable>>, GroupMemory);

/// Makes a standalone executable.
pub(crate) type MakeStandalone<'m> = &'m dyn Fn(&Graph, &Plan) -> Box<dyn Executable>;

/// The plans of [`accumulate`] (on `streams[0]` streams, its `s` updated in place) and
/// [`decay`] (on `streams[1]`, its `s` copied back).
pub(crate) fn plans(streams: [usize; 2], workspaces: &Workspaces) -> (Graph, Plan, Graph, Plan) {
    let (a, b) = (accumulate(), decay());
    let mut plan_a = planned(&a, streams[0], workspaces);
    in_place(&mut plan_a, a.writes()[0].1, a.input_named("s").unwrap());
    let plan_b = planned(&b, streams[1], workspaces);
    (a, plan_a, b, plan_b)
}

/// Two groups of [`plans`] (one run eagerly, one replayed) and a standalone executable per
/// run: the members take turns, each run's output and the state it writes bit-equal a
/// standalone executable's fed the same param, state and input; every member then reads the
/// state that run wrote and the param, including one set through the other member; the group
/// has one arena of the larger plan's bytes.
pub(crate) fn members_equal_standalone_executables(
    rng: &mut StdRng,
    streams: [usize; 2],
    workspaces: &Workspaces,
    (group, standalone): (MakeGroup, MakeStandalone),
) {
    let (a, plan_a, b, plan_b) = plans(streams, workspaces);
    let programs = [(&a, &plan_a), (&b, &plan_b)];
    let (eager, memory) = group(&programs);
    let (replayed, replayed_memory) = group(&programs);
    assert_eq!(replayed_memory, memory);
    assert_ne!(plan_a.arena_bytes, plan_b.arena_bytes);
    let arenas = (plan_a.arena_bytes, plan_b.arena_bytes);
    assert_eq!(memory.arena_bytes, arenas.0.max(arenas.1));
    assert_eq!(memory.arena_sum_bytes, arenas.0 + arenas.1);
    let mut groups = [(eager, RunMode::Eager), (replayed, RunMode::Graph)];

    let mut weight = random(rng, &[3, 4]);
    let mut state = random(rng, &[3, 4]);
    for (members, _) in &mut groups {
        // Through `accumulate` alone: `decay` reads the same slots without a set.
        members[0].set("w", &weight).unwrap();
        members[0].set("s", &state).unwrap();
    }
    for step in 0..6 {
        let member = step % 2;
        let (graph, plan, output, dims) = match member {
            0 => (&a, &plan_a, "y", &[3, 4][..]),
            _ => (&b, &plan_b, "z", &[8, 3, 4][..]),
        };
        if step == 3 {
            // A new param through `decay`: `accumulate` reads it next.
            weight = random(rng, &[3, 4]);
            for (members, _) in &mut groups {
                members[1].set("w", &weight).unwrap();
            }
        }
        let x = random(rng, dims);
        let values = BTreeMap::from([
            ("w".to_string(), weight.clone()),
            ("s".to_string(), state.clone()),
            ("x".to_string(), x.clone()),
        ]);
        let mut alone = standalone(graph, plan);
        for (name, tensor) in &values {
            alone.set(name, tensor).unwrap();
        }
        alone.run(RunMode::Eager).unwrap();
        let (want, want_state) = (alone.get(output).unwrap(), alone.get("s").unwrap());
        assert_ne!(bits(&want_state), bits(&state), "step {step}: s moves");
        for (members, mode) in &mut groups {
            let what = format!("streams {streams:?}, {mode:?}, step {step}");
            members[member].set("x", &x).unwrap();
            members[member].run(*mode).unwrap();
            let got = members[member].get(output).unwrap();
            assert_eq!(bits(&got), bits(&want), "{what}: `{output}`");
            // One slot each: every member sees the state the run wrote, and the param.
            for other in members.iter() {
                assert_eq!(bits(&other.get("s").unwrap()), bits(&want_state), "{what}");
                assert_eq!(bits(&other.get("w").unwrap()), bits(&weight), "{what}");
            }
        }
        state = want_state;
    }
}

#[test]
fn the_memory_is_the_largest_arena_and_each_shared_input_once() {
    let (a, b) = (accumulate(), decay());
    let (plan_a, plan_b) = (
        planned(&a, 1, &Workspaces::Any),
        planned(&b, 1, &Workspaces::Any),
    );
    assert_ne!(plan_a.arena_bytes, plan_b.arena_bytes);
    let memory = GroupMemory::of(&[(&a, &plan_a), (&b, &plan_b)]).unwrap();
    let arenas = [plan_a.arena_bytes, plan_b.arena_bytes];
    assert_eq!(memory.arena_bytes, *arenas.iter().max().unwrap());
    assert_eq!(memory.arena_sum_bytes, arenas.iter().sum::<u64>());
    let names: Vec<&str> = memory
        .shared_inputs
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    // In the order of first appearance; the per-run `x` of each program is not shared.
    assert_eq!(names, ["w", "s"]);
    assert_eq!(memory.shared_input_bytes, 2 * 12 * 4);
    assert_eq!(memory.shared("s"), Some(1));
    assert_eq!(memory.shared("x"), None);
}

#[test]
fn a_shared_input_of_another_type_or_kind_is_refused_naming_both() {
    let a = accumulate();
    let plan_a = planned(&a, 1, &Workspaces::Any);
    // `w` as a param of another shape, then `s` as a param instead of a state.
    for (name, kind, dims) in [
        ("w", InputKind::Param, [4, 3]),
        ("s", InputKind::Param, [3, 4]),
    ] {
        let mut other = Graph::new("other");
        let input = other.input(name, kind, ty(&dims)).unwrap();
        let doubled = other.op1(Op::Scale { alpha: 2.0 }, &[input]).unwrap();
        other.output("doubled", doubled).unwrap();
        let plan_other = planned(&other, 1, &Workspaces::Any);
        let err = GroupMemory::of(&[(&a, &plan_a), (&other, &plan_other)]).unwrap_err();
        let Error::GroupInput { name: named, .. } = &err else {
            panic!("not a group input error: {err}");
        };
        assert_eq!(named, name);
        let text = err.to_string();
        let (_, _, first_kind, first) = (a.inputs().into_iter())
            .find(|(_, n, _, _)| *n == name)
            .unwrap();
        let want = [
            format!("`{name}`"),
            "`accumulate` (program 0)".to_string(),
            format!("{} {first}", first_kind.name()),
            "`other` (program 1)".to_string(),
            format!("{} {}", kind.name(), ty(&dims)),
        ];
        for part in want {
            assert!(text.contains(&part), "{text} lacks {part}");
        }
    }
    // Per-run inputs of one name are the programs' own: another shape is fine.
    let b = decay();
    let plan_b = planned(&b, 1, &Workspaces::Any);
    GroupMemory::of(&[(&a, &plan_a), (&b, &plan_b)]).unwrap();
    assert!(GroupMemory::of(&[]).is_err());
}

/// `rows` (a state of 4 ids) indexes table `table` of `vocab` rows.
fn lookup(name: &str, table: &str, vocab: usize) -> Graph {
    let mut graph = Graph::new(name);
    let rows = TensorType::new(DType::I64, [4]).unwrap();
    let table = graph
        .input(table, InputKind::Param, ty(&[vocab, 2]))
        .unwrap();
    let rows = graph.input("rows", InputKind::State, rows).unwrap();
    let out = graph.op1(Op::Embedding, &[table, rows]).unwrap();
    graph.output("out", out).unwrap();
    graph
}

#[test]
fn a_shared_index_input_is_checked_against_every_member_that_reads_it() {
    let (big, small) = (lookup("big", "e10", 10), lookup("small", "e5", 5));
    let plans = [&big, &small].map(|g| planned(g, 1, &Workspaces::Any));
    let memory = GroupMemory::of(&[(&big, &plans[0]), (&small, &plans[1])]).unwrap();
    let rules = group_index_rules(&[&big, &small], &memory);
    let rows = |v: Vec<i64>| Tensor::from_vec(v, [4]).unwrap();
    for member in &rules {
        member.check("rows", &rows(vec![0, 4, 2, 3])).unwrap();
    }
    // Fine for `big` alone, but `small` reads the same slot.
    let err = rules[0].check("rows", &rows(vec![0, 7, 2, 3])).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("0..5") && text.contains("of `small`"),
        "{text}"
    );
    assert!(rules[1].check("rows", &rows(vec![0, 7, 2, 3])).is_err());
}

#[test]
fn the_fixture_plans_lower_for_the_device_and_differ_in_arena() {
    for streams in [[1, 1], [2, 1]] {
        let (a, plan_a, b, plan_b) = plans(streams, &Workspaces::Cuda);
        assert_ne!(plan_a.arena_bytes, plan_b.arena_bytes);
        let lowered_a = crate::lower_for_device(&a, &plan_a, Default::default()).unwrap();
        assert_eq!(lowered_a.in_place_writes, ["s"]);
        assert!(lowered_a.copied_writes.is_empty());
        let lowered_b = crate::lower_for_device(&b, &plan_b, Default::default()).unwrap();
        assert_eq!(lowered_b.copied_writes, ["s"]);
        assert!(lowered_b.in_place_writes.is_empty());
    }
}
