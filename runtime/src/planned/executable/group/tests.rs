//! An executable group on the CPU: members bit-equal to standalone executables fed the same
//! values, a state one member writes read by the other's next run, a param set through one
//! seen by the other, eager runs and replays alike (`group::tests` drives them), and the
//! "never set" rule across members.

use kiln_ir::Graph;
use kiln_kernels::testing;
use kiln_planner::Plan;
use rand::rngs::StdRng;

use super::super::CpuExecutable;
use crate::backend::{Backend, Executable};
use crate::group::tests::{accumulate, members_equal_standalone_executables, planned, plans};
use crate::{Error, Tensor, Workspaces};

fn random(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let values = testing::to_f32(&testing::signed(rng, dims.iter().product()));
    Tensor::from_vec(values, dims).unwrap()
}

fn boxed(executables: Vec<CpuExecutable>) -> Vec<Box<dyn Executable>> {
    (executables.into_iter())
        .map(|e| Box::new(e) as Box<dyn Executable>)
        .collect()
}

#[test]
fn members_share_params_and_state_and_equal_standalone_executables() {
    let mut rng = testing::rng("group_members");
    for streams in [[1, 1], [2, 1]] {
        // Poisoned runs, against poisoned standalone executables.
        let group = |programs: &[(&Graph, &Plan)]| {
            let (executables, memory) = CpuExecutable::group(programs, true).unwrap();
            (boxed(executables), memory)
        };
        let standalone = |graph: &Graph, plan: &Plan| {
            Box::new(CpuExecutable::new_with_poison(graph, plan, true).unwrap())
                as Box<dyn Executable>
        };
        let makers = (&group as _, &standalone as _);
        members_equal_standalone_executables(&mut rng, streams, &Workspaces::Any, makers);
        // Through the backend.
        let group = |programs: &[(&Graph, &Plan)]| {
            let group = Backend::Cpu.compile_group(programs).unwrap();
            (group.executables, group.memory)
        };
        let standalone = |graph: &Graph, plan: &Plan| Backend::Cpu.compile(graph, plan).unwrap();
        let makers = (&group as _, &standalone as _);
        members_equal_standalone_executables(&mut rng, streams, &Workspaces::Any, makers);
    }
}

#[test]
fn a_run_needs_every_input_set_through_some_member() {
    let mut rng = testing::rng("group_never_set");
    let (a, plan_a, b, plan_b) = plans([1, 1], &Workspaces::Any);
    let programs = [(&a, &plan_a), (&b, &plan_b)];
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
