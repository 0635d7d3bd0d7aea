//! An executable group on the CPU: members bit-equal to standalone executables fed the same
//! values, a state one member writes read by the other's next run, a param set through one
//! seen by the other, eager runs and replays alike, and the "never set" rule across members.

use std::collections::BTreeMap;

use kiln_ir::Graph;
use kiln_kernels::testing;
use kiln_planner::Plan;

use super::super::tests::{bits, in_place, random};
use super::super::CpuExecutable;
use crate::backend::{Backend, Executable, RunMode};
use crate::group::tests::{accumulate, decay, planned};
use crate::{Error, Tensor, Workspaces};

/// A standalone executable of `graph` run once on `values`: its output `output`, and `s`.
fn standalone(
    graph: &Graph,
    plan: &Plan,
    values: &BTreeMap<String, Tensor>,
    output: &str,
) -> (Tensor, Tensor) {
    let mut exe = CpuExecutable::new_with_poison(graph, plan, true).unwrap();
    for (name, tensor) in values {
        exe.set(name, tensor).unwrap();
    }
    exe.run().unwrap();
    (exe.get(output).unwrap(), exe.get("s").unwrap())
}

#[test]
fn members_share_params_and_state_and_equal_standalone_executables() {
    let mut rng = testing::rng("group_members");
    let (a, b) = (accumulate(), decay());
    for streams in [1, 2] {
        let mut plan_a = planned(&a, streams, &Workspaces::Any);
        // `accumulate` updates `s` in place (through the group's one working copy of `s`),
        // `decay` copies its new `s` back.
        in_place(&mut plan_a, a.writes()[0].1, a.input_named("s").unwrap());
        let plan_b = planned(&b, streams, &Workspaces::Any);
        let programs = [(&a, &plan_a), (&b, &plan_b)];
        let (eager, memory) = CpuExecutable::group(&programs, true).unwrap();
        let eager: Vec<Box<dyn Executable>> = (eager.into_iter())
            .map(|e| Box::new(e) as Box<dyn Executable>)
            .collect();
        let replayed = Backend::Cpu.compile_group(&programs).unwrap();
        assert_eq!(replayed.memory, memory);
        assert_ne!(plan_a.arena_bytes, plan_b.arena_bytes);
        assert_eq!(
            memory.arena_bytes,
            plan_a.arena_bytes.max(plan_b.arena_bytes)
        );
        assert_eq!(
            memory.arena_sum_bytes,
            plan_a.arena_bytes + plan_b.arena_bytes
        );
        let mut groups = [
            (eager, RunMode::Eager),
            (replayed.executables, RunMode::Graph),
        ];

        let mut weight = random(&mut rng, &[3, 4]);
        let mut state = random(&mut rng, &[3, 4]);
        for (members, _) in &mut groups {
            // Through `accumulate` alone: `decay` reads the same slots without a set.
            members[0].set("w", &weight).unwrap();
            members[0].set("s", &state).unwrap();
        }
        // The members take turns; each run reads the state the other's run wrote.
        for step in 0..6 {
            let member = step % 2;
            let (graph, plan, output, dims) = match member {
                0 => (&a, &plan_a, "y", &[3, 4][..]),
                _ => (&b, &plan_b, "z", &[8, 3, 4][..]),
            };
            if step == 3 {
                // A new param through `decay`: `accumulate` reads it next.
                weight = random(&mut rng, &[3, 4]);
                for (members, _) in &mut groups {
                    members[1].set("w", &weight).unwrap();
                }
            }
            let x = random(&mut rng, dims);
            let values = BTreeMap::from([
                ("w".to_string(), weight.clone()),
                ("s".to_string(), state.clone()),
                ("x".to_string(), x.clone()),
            ]);
            let (want, want_state) = standalone(graph, plan, &values, output);
            assert_ne!(bits(&want_state), bits(&state), "step {step}: s moves");
            for (members, mode) in &mut groups {
                let what = format!("{streams} streams, {mode:?}, step {step}");
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
}

#[test]
fn a_run_needs_every_input_set_through_some_member() {
    let mut rng = testing::rng("group_never_set");
    let (a, b) = (accumulate(), decay());
    let plans = [&a, &b].map(|g| planned(g, 1, &Workspaces::Any));
    let programs = [(&a, &plans[0]), (&b, &plans[1])];
    let (mut members, _) = CpuExecutable::group(&programs, false).unwrap();
    let missing = |members: &mut Vec<CpuExecutable>| members[1].run().unwrap_err().to_string();
    let text = missing(&mut members);
    assert!(
        ["`s`", "`w`", "`x`"].iter().all(|n| text.contains(n)),
        "{text}"
    );
    // `s` and `accumulate`'s own `x` through `accumulate`: `decay` lacks `w` and its `x`.
    members[0].set("s", &random(&mut rng, &[3, 4])).unwrap();
    members[0].set("x", &random(&mut rng, &[3, 4])).unwrap();
    let text = members[1].capture().unwrap_err().to_string();
    assert!(text.contains("`w`") && text.contains("`x`"), "{text}");
    assert!(!text.contains("`s`"), "{text}");
    members[1].set("w", &random(&mut rng, &[3, 4])).unwrap();
    let text = missing(&mut members);
    assert!(text.contains("`x`") && !text.contains("`w`"), "{text}");
    members[1].set("x", &random(&mut rng, &[8, 3, 4])).unwrap();
    members[1].run().unwrap();
    members[0].run().unwrap();

    // A shared slot keeps its one type through every member.
    let err = members[1]
        .set("s", &random(&mut rng, &[8, 3, 4]))
        .unwrap_err();
    assert!(
        matches!(&err, Error::InputType { name, .. } if name == "s"),
        "{err}"
    );
}

#[test]
fn a_group_of_programs_that_disagree_on_a_shared_input_is_refused() {
    let a = accumulate();
    let mut other = Graph::new("other");
    let ty = kiln_ir::TensorType::new(kiln_ir::DType::F32, [4, 3]).unwrap();
    let s = other.input("s", kiln_ir::InputKind::State, ty).unwrap();
    other.write("s", s).unwrap();
    let plans = [&a, &other].map(|g| planned(g, 1, &Workspaces::Any));
    let err = Backend::Cpu
        .compile_group(&[(&a, &plans[0]), (&other, &plans[1])])
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("`s`") && text.contains("`accumulate`") && text.contains("`other`"),
        "{text}"
    );
}
