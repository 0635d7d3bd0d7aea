//! The executable against `execute`, bit for bit, on small hand-built graphs: eager runs,
//! replays, state carried between runs, write-backs staged through scratch, and refusals.

use std::collections::BTreeMap;

use kiln_ir::{DType, Graph, InputKind, Op, TensorType};
use kiln_kernels::testing;
use kiln_planner::{plan, Plan, PlanOptions};
use rand::rngs::StdRng;

use super::CpuExecutable;
use crate::group::tests::in_place;
use crate::planned::execute;
use crate::planned::tests::chain;
use crate::{Error, Tensor};

fn random(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    let values = testing::to_f32(&testing::signed(rng, dims.iter().product()));
    Tensor::from_vec(values, dims).unwrap()
}

fn bits(tensor: &Tensor) -> Vec<u64> {
    let values = tensor.to_f64_vec().unwrap();
    values.iter().map(|v| v.to_bits()).collect()
}

/// An executable of `graph` with every input of `values` set.
fn executable(graph: &Graph, plan: &Plan, values: &BTreeMap<String, Tensor>) -> CpuExecutable {
    let mut executable = CpuExecutable::new_with_poison(graph, plan, true).unwrap();
    for (name, tensor) in values {
        executable.set(name, tensor).unwrap();
    }
    executable
}

/// The executable's outputs and written inputs equal `execute`'s, bit for bit.
#[track_caller]
fn assert_same(
    graph: &Graph,
    executable: &CpuExecutable,
    outputs: &BTreeMap<String, Tensor>,
    values: &BTreeMap<String, Tensor>,
) {
    assert!(!outputs.is_empty());
    for (name, want) in outputs {
        let got = executable.get(name).unwrap();
        assert_eq!(got.dims(), want.dims(), "output {name}");
        assert_eq!(bits(&got), bits(want), "output {name}");
        assert!(bits(want).iter().any(|&b| b != 0), "output {name} is zero");
    }
    for (name, _) in graph.writes() {
        assert_eq!(
            bits(&executable.get(name).unwrap()),
            bits(&values[name]),
            "write {name}"
        );
    }
}

#[test]
fn a_chain_run_and_replayed_equals_execute() {
    let mut rng = testing::rng("executable_chain");
    let (graph, plan, mut values) = chain(&mut rng);
    let mut exe = executable(&graph, &plan, &values);
    let outputs = execute(&graph, &plan, &mut values, true).unwrap();
    exe.run().unwrap();
    assert_same(&graph, &exe, &outputs, &values);

    // A fresh per-run input, then the recording: the same bits as execute on it.
    let x = random(&mut rng, &[4, 8]);
    values.insert("x".into(), x.clone());
    exe.set("x", &x).unwrap();
    exe.capture().unwrap();
    assert!(exe.captured_launches().unwrap() >= plan.schedule.len());
    let outputs = execute(&graph, &plan, &mut values, true).unwrap();
    exe.replay().unwrap();
    assert_same(&graph, &exe, &outputs, &values);
    // Replaying again on unchanged inputs changes nothing: inputs are never clobbered.
    exe.replay().unwrap();
    assert_same(&graph, &exe, &outputs, &values);
}

/// `s' = s + x` written back to `s`, `m' = m * x` written back to `m`, and outputs of both;
/// `u` is written the value of input `w` and `w` that of `u` (a swap through the slots).
fn accumulator(rng: &mut StdRng) -> (Graph, BTreeMap<String, Tensor>) {
    let mut graph = Graph::new("accumulate");
    let mut values = BTreeMap::new();
    let ty = TensorType::new(DType::F32, [3, 4]).unwrap();
    let mut input = |name: &str, kind: InputKind| {
        values.insert(name.to_string(), random(rng, &[3, 4]));
        graph.input(name, kind, ty.clone()).unwrap()
    };
    let s = input("s", InputKind::State);
    let m = input("m", InputKind::State);
    let u = input("u", InputKind::State);
    let w = input("w", InputKind::State);
    let x = input("x", InputKind::Input);
    let s2 = graph.op1(Op::Add, &[s, x]).unwrap();
    let m2 = graph.op1(Op::Mul, &[m, x]).unwrap();
    let y = graph.op1(Op::Mul, &[s2, m2]).unwrap();
    let t = graph
        .op1(Op::Transpose { dim0: 0, dim1: 1 }, &[m2])
        .unwrap();
    graph.output("y", y).unwrap();
    graph.output("t", t).unwrap();
    graph.output("u_before", u).unwrap();
    graph.write("s", s2).unwrap();
    graph.write("m", m2).unwrap();
    graph.write("u", w).unwrap();
    graph.write("w", u).unwrap();
    (graph, values)
}

#[test]
fn state_is_carried_between_runs_and_replays() {
    let mut rng = testing::rng("executable_state");
    let (graph, mut values) = accumulator(&mut rng);
    for streams in [1, 2] {
        let options = PlanOptions {
            streams,
            ..Default::default()
        };
        let plan = plan(&graph, &options, &crate::Workspaces::Any).unwrap();
        let mut eager = executable(&graph, &plan, &values);
        let mut replayed = executable(&graph, &plan, &values);
        replayed.capture().unwrap();
        let mut want = values.clone();
        for step in 0..4 {
            let x = random(&mut rng, &[3, 4]);
            want.insert("x".into(), x.clone());
            let outputs = execute(&graph, &plan, &mut want, true).unwrap();
            eager.set("x", &x).unwrap();
            eager.run().unwrap();
            replayed.set("x", &x).unwrap();
            replayed.replay().unwrap();
            assert_same(&graph, &eager, &outputs, &want);
            assert_same(&graph, &replayed, &outputs, &want);
            // The swap went through: u holds the w of before, on every step.
            let (u, w) = (eager.get("u").unwrap(), eager.get("w").unwrap());
            assert_eq!(bits(&u), bits(&want["u"]), "step {step}");
            assert_ne!(bits(&u), bits(&w), "step {step}");
        }
        values.insert("x".into(), random(&mut rng, &[3, 4]));
    }
}

#[test]
fn misuse_is_refused_with_errors_naming_the_input() {
    let mut rng = testing::rng("executable_errors");
    let (graph, values) = accumulator(&mut rng);
    let plan = plan(&graph, &PlanOptions::default(), &crate::Workspaces::Any).unwrap();
    let mut exe = CpuExecutable::new(&graph, &plan).unwrap();
    assert_eq!(exe.captured_launches(), None);
    let err = exe.replay().unwrap_err().to_string();
    assert!(err.contains("nothing was captured"), "{err}");

    exe.set("s", &values["s"]).unwrap();
    exe.set("x", &values["x"]).unwrap();
    for err in [exe.run().unwrap_err(), exe.capture().unwrap_err()] {
        let err = err.to_string();
        assert!(
            err.contains("`m`") && err.contains("`u`") && err.contains("`w`"),
            "{err}"
        );
        assert!(!err.contains("`s`") && !err.contains("`x`"), "{err}");
    }

    let err = exe.set("nope", &values["s"]).unwrap_err().to_string();
    assert!(err.contains("`nope`"), "{err}");
    let wrong_shape = random(&mut rng, &[4, 3]);
    let err = exe.set("m", &wrong_shape).unwrap_err();
    assert!(
        matches!(&err, Error::InputType { name, .. } if name == "m"),
        "{err}"
    );
    let wrong_dtype = Tensor::from_vec(vec![1i64; 12], [3, 4]).unwrap();
    let err = exe.set("m", &wrong_dtype).unwrap_err();
    assert!(
        matches!(&err, Error::InputType { name, .. } if name == "m"),
        "{err}"
    );
    let err = exe.get("nope").unwrap_err().to_string();
    assert!(err.contains("`nope`"), "{err}");
    // A transposed tensor of the right shape is fine: its elements are copied in order.
    let transposed = random(&mut rng, &[4, 3]).transpose(0, 1).unwrap();
    exe.set("m", &transposed).unwrap();
    assert_eq!(bits(&exe.get("m").unwrap()), bits(&transposed));

    // A plan of another graph is refused when the executable is made, without a panic.
    let (other, _, _) = chain(&mut rng);
    assert!(CpuExecutable::new(&other, &plan).is_err());
}

#[test]
fn inputs_written_in_place_start_each_run_from_their_slots() {
    let mut rng = testing::rng("executable_in_place_inputs");
    let mut graph = Graph::new("in_place_inputs");
    let ty = TensorType::new(DType::F32, [3, 4]).unwrap();
    let s = graph.input("s", InputKind::State, ty.clone()).unwrap();
    let x = graph.input("x", InputKind::Input, ty).unwrap();
    let a = graph.op1(Op::Scale { alpha: 2.0 }, &[x]).unwrap();
    let s2 = graph.op1(Op::Add, &[s, a]).unwrap();
    let y = graph.op1(Op::Mul, &[a, s2]).unwrap();
    graph.output("y", y).unwrap();
    graph.write("s", s2).unwrap();
    let mut plan = plan(&graph, &PlanOptions::default(), &crate::Workspaces::Any).unwrap();
    // `a` overwrites the per-run input `x`, `s2` the state `s`: each is its input's last reader.
    in_place(&mut plan, a, x);
    in_place(&mut plan, s2, s);

    let mut values = BTreeMap::new();
    values.insert("s".to_string(), random(&mut rng, &[3, 4]));
    values.insert("x".to_string(), random(&mut rng, &[3, 4]));
    let mut eager = executable(&graph, &plan, &values);
    let mut replayed = executable(&graph, &plan, &values);
    replayed.capture().unwrap();
    let x = values["x"].clone();
    for _ in 0..3 {
        // `x` is set once: the runs never clobber its slot.
        let mut interpreted = values.clone();
        let want = crate::interpret(&graph, &mut interpreted).unwrap();
        let outputs = execute(&graph, &plan, &mut values, true).unwrap();
        assert_eq!(bits(&outputs["y"]), bits(&want["y"]));
        eager.run().unwrap();
        replayed.replay().unwrap();
        assert_same(&graph, &eager, &outputs, &values);
        assert_same(&graph, &replayed, &outputs, &values);
        assert_eq!(bits(&eager.get("x").unwrap()), bits(&x));
        assert_eq!(bits(&replayed.get("x").unwrap()), bits(&x));
    }
}

/// `w` (param) with its derived copy `bf16.w`; the program outputs the copy widened, and
/// writes `w + w` and the copy as its cast (the CUDA executable's tests use it too).
pub(crate) fn derived_copy_program() -> Graph {
    let mut g = Graph::new("copies");
    let w = g
        .input(
            "w",
            InputKind::Param,
            TensorType::new(DType::F32, [3, 4]).unwrap(),
        )
        .unwrap();
    let bf16 = TensorType::new(DType::BF16, [3, 4]).unwrap();
    let copy = g.input("bf16.w", InputKind::State, bf16).unwrap();
    g.derive("bf16.w", "w").unwrap();
    let widened = g.op1(Op::Cast { to: DType::F32 }, &[copy]).unwrap();
    g.output("seen", widened).unwrap();
    let updated = g.op1(Op::Add, &[w, w]).unwrap();
    g.write("w", updated).unwrap();
    let cast = g.op1(Op::Cast { to: DType::BF16 }, &[updated]).unwrap();
    g.write("bf16.w", cast).unwrap();
    g
}

#[test]
fn setting_a_param_sets_its_derived_copy_and_the_copy_is_not_set_directly() {
    let mut rng = testing::rng("derived_copies");
    let graph = derived_copy_program();
    let plan = plan(&graph, &PlanOptions::default(), &crate::Workspaces::Any).unwrap();
    let w = random(&mut rng, &[3, 4]);
    let rounded = w.cast_to(DType::BF16).unwrap().cast_to(DType::F32).unwrap();
    let mut exe = CpuExecutable::new(&graph, &plan).unwrap();
    exe.set("w", &w).unwrap();
    exe.run().unwrap();
    assert_eq!(bits(&exe.get("seen").unwrap()), bits(&rounded));
    // The program kept the copy derived: the cast of the updated param.
    let doubled = exe.get("w").unwrap();
    assert_eq!(
        bits(&exe.get("bf16.w").unwrap()),
        bits(&doubled.cast_to(DType::BF16).unwrap())
    );
    // The interpreter derives the copy from the param, whatever is bound under its name.
    let mut values = BTreeMap::from([
        ("w".to_string(), w.clone()),
        (
            "bf16.w".to_string(),
            Tensor::zeros([3, 4], DType::BF16, crate::Device::Cpu),
        ),
    ]);
    let interpreted = crate::interpret(&graph, &mut values).unwrap();
    assert_eq!(bits(&interpreted["seen"]), bits(&rounded));

    let copy = w.cast_to(DType::BF16).unwrap();
    for refused in [exe.set("bf16.w", &copy), exe.zero("bf16.w")] {
        let error = refused.unwrap_err().to_string();
        assert!(error.contains("derived from `w`"), "{error}");
    }
    // Zeroing the param zeroes its copy.
    exe.zero("w").unwrap();
    exe.run().unwrap();
    assert!(exe
        .get("seen")
        .unwrap()
        .to_f64_vec()
        .unwrap()
        .iter()
        .all(|&x| x == 0.0));
}
