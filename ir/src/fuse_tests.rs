//! Tests of fusion rules on small hand-built graphs (the traced programs' rules are tested on
//! whole programs in `tests/programs.rs`).

use super::*;
use crate::{Shape, TensorType};

fn bf16(dims: &[usize]) -> TensorType {
    TensorType::new(DType::BF16, dims.to_vec()).unwrap()
}

fn ops(graph: &Graph) -> Vec<String> {
    graph.ops().map(|(_, op)| op.name().to_string()).collect()
}

/// `round_trip`: rounding back a widened dense bf16 value (through reshapes) is that value,
/// viewed as the rounding's shape; a widened transpose keeps its casts (the rounding is the
/// copy that makes it dense).
#[test]
fn round_trip_drops_the_casts_of_a_dense_value_only() {
    let mut g = Graph::new("round_trip");
    let x = g.input("x", InputKind::Input, bf16(&[2, 3])).unwrap();
    let wide = g.op1(Op::Cast { to: DType::F32 }, &[x]).unwrap();
    let flat = g
        .op1(
            Op::Reshape {
                shape: Shape::new(&[6]),
            },
            &[wide],
        )
        .unwrap();
    let back = g.op1(Op::Cast { to: DType::BF16 }, &[flat]).unwrap();
    g.output("back", back).unwrap();
    let same = g.op1(Op::Cast { to: DType::BF16 }, &[wide]).unwrap();
    g.output("same", same).unwrap();
    let fused = fuse(&g).unwrap();
    assert_eq!(ops(&fused), ["reshape"]);
    let [(_, back), (_, same)] = fused.outputs() else {
        panic!("two outputs")
    };
    assert_eq!(fused.value_type(*back).unwrap(), &bf16(&[6]));
    assert_eq!(same, &fused.input_named("x").unwrap());

    let mut g = Graph::new("round_trip_of_a_view");
    let x = g.input("x", InputKind::Input, bf16(&[2, 3])).unwrap();
    let t = g.op1(Op::Transpose { dim0: 0, dim1: 1 }, &[x]).unwrap();
    let wide = g.op1(Op::Cast { to: DType::F32 }, &[t]).unwrap();
    let back = g.op1(Op::Cast { to: DType::BF16 }, &[wide]).unwrap();
    g.output("back", back).unwrap();
    let fused = fuse(&g).unwrap();
    assert_eq!(ops(&fused), ["transpose", "cast", "cast"]);
}

/// `widened`: a cast of a bf16 value that several ops read, each as a stored operand (SwiGLU
/// and its backward reading rounded gate and up, a sum), is gone, each op reading the bf16
/// value; where another reader takes the gate's cast as an operand of its own dtype (a
/// product), that cast stays, and so does up's (SwiGLU reads gate and up of one dtype).
#[test]
fn widened_drops_a_cast_that_only_stored_operands_read() {
    for f32_reader in [false, true] {
        let mut g = Graph::new("widened");
        let f32t = TensorType::new(DType::F32, vec![4]).unwrap();
        let gate = g.input("gate", InputKind::Input, bf16(&[4])).unwrap();
        let up = g.input("up", InputKind::Input, bf16(&[4])).unwrap();
        let grad = g.input("grad", InputKind::Input, f32t).unwrap();
        let gate_wide = g.op1(Op::Cast { to: DType::F32 }, &[gate]).unwrap();
        let up_wide = g.op1(Op::Cast { to: DType::F32 }, &[up]).unwrap();
        let out = g.op1(Op::SwiGlu, &[gate_wide, up_wide]).unwrap();
        let grads = g
            .op(Op::SwiGluBackward, &[gate_wide, up_wide, grad])
            .unwrap();
        g.output("out", out).unwrap();
        g.output("grad_gate", grads[0]).unwrap();
        // A sum reads either term stored: the cast may go all the same.
        let sum = g.op1(Op::Add, &[gate_wide, grad]).unwrap();
        g.output("sum", sum).unwrap();
        if f32_reader {
            let product = g.op1(Op::Mul, &[gate_wide, grad]).unwrap();
            g.output("product", product).unwrap();
        }
        let fused = fuse(&g).unwrap();
        let names = ops(&fused);
        let casts = names.iter().filter(|n| *n == "cast").count();
        assert_eq!(casts, if f32_reader { 2 } else { 0 }, "{names:?}");
        let swiglu = (fused.node_indices())
            .find(|&n| matches!(op_of(&fused, n), Some(Op::SwiGlu)))
            .unwrap();
        let read: Vec<DType> = (fused.operands(swiglu).iter())
            .map(|v| fused.value_type(*v).unwrap().dtype)
            .collect();
        let want = if f32_reader { DType::F32 } else { DType::BF16 };
        assert_eq!(read, [want, want], "{names:?}");
    }
}

/// `rounded`: a result read only where it is rounded on entry, directly or through reshapes
/// (a linear's input), is written rounded; where a reshape of it is also an output, or read by
/// an op that takes it in f32, it stays f32.
#[test]
fn a_value_read_rounded_through_a_reshape_is_written_rounded_only_if_no_view_needs_f32() {
    let linear = Op::Linear {
        biases: vec![false],
        swiglu: false,
        add_rmsnorm: None,
        rope_kv: None,
    };
    let flat = Op::Reshape {
        shape: Shape::new(&[40, 8]),
    };
    // f: 0, the view read by the linear alone; 1, the view also an output; 2, the view also
    // read by a scale (f32).
    let build = |f: usize| {
        let mut g = Graph::new("rounded_views");
        let x = g.input(
            "x",
            InputKind::Input,
            TensorType::new(DType::F32, [4, 10, 8]).unwrap(),
        );
        let x = x.unwrap();
        let w = g.input(
            "w",
            InputKind::Param,
            TensorType::new(DType::F32, [8]).unwrap(),
        );
        let normed = g.op1(Op::RmsNorm { eps: 1e-6 }, &[x, w.unwrap()]).unwrap();
        let view = g.op1(flat.clone(), &[normed]).unwrap();
        let weight = g.input("lw", InputKind::Param, bf16(&[6, 8])).unwrap();
        let y = g.op1(linear.clone(), &[view, weight]).unwrap();
        g.output("y", y).unwrap();
        match f {
            1 => g.output("view", view).unwrap(),
            2 => {
                let scaled = g.op1(Op::Scale { alpha: 2.0 }, &[view]).unwrap();
                g.output("scaled", scaled).unwrap()
            }
            _ => {}
        }
        fuse(&g).unwrap()
    };
    assert_eq!(ops(&build(0)), ["rounded_rmsnorm", "reshape", "linear"]);
    assert_eq!(ops(&build(1)), ["rmsnorm", "reshape", "linear"]);
    assert_eq!(ops(&build(2)), ["rmsnorm", "reshape", "linear", "scale"]);
}

/// `loss_grad`: the LM-head loss and its backward on bf16 operands, the seed an input made
/// after the loss (as autodiff adds it), are one op standing for the loss and both gradients;
/// f32 operands, a computed `grad_loss`, or an `lse` read elsewhere keep the two ops.
#[test]
fn loss_grad_takes_the_loss_and_its_backward_where_the_seed_is_an_input() {
    let f32 = |dims: &[usize]| TensorType::new(DType::F32, dims.to_vec()).unwrap();
    let build = |dtype: DType, computed_seed: bool, keep_lse: bool| {
        let ty = |dims: &[usize]| TensorType::new(dtype, dims.to_vec()).unwrap();
        let mut g = Graph::new("loss_grad");
        let x = g.input("x", InputKind::Input, ty(&[3, 4])).unwrap();
        let w = g.input("w", InputKind::Param, ty(&[9, 4])).unwrap();
        let i64s = TensorType::new(DType::I64, vec![3]).unwrap();
        let t = g.input("t", InputKind::Input, i64s).unwrap();
        let op = Op::LinearCrossEntropy { ignore_index: -100 };
        let r = g.op(op, &[x, w, t]).unwrap();
        let seed = g.input("loss_seed", InputKind::Input, f32(&[])).unwrap();
        let seed = match computed_seed {
            true => g.op1(Op::Scale { alpha: 2.0 }, &[seed]).unwrap(),
            false => seed,
        };
        let op = Op::LinearCrossEntropyBackward { ignore_index: -100 };
        let grads = g.op(op, &[x, w, t, r[1], seed]).unwrap();
        g.output("loss", r[0]).unwrap();
        g.output("grad_x", grads[0]).unwrap();
        g.output("grad_w", grads[1]).unwrap();
        if keep_lse {
            g.output("lse", r[1]).unwrap();
        }
        g
    };
    let fused = fuse(&build(DType::BF16, false, false)).unwrap();
    crate::verify(&fused).unwrap();
    assert_eq!(ops(&fused), ["linear_cross_entropy_grad"]);
    let node = fused.outputs()[0].1.node;
    let outputs: Vec<ValueId> = fused.outputs().iter().map(|(_, v)| *v).collect();
    let ports: Vec<ValueId> = (0..3).map(|port| ValueId { node, port }).collect();
    assert_eq!(outputs, ports, "the loss and both gradients, in order");
    // Split back (a memory budget's fallback): the two ops, the same outputs' types.
    let split = split_loss_grads(&fused).unwrap();
    crate::verify(&split).unwrap();
    let pair = ["linear_cross_entropy", "linear_cross_entropy_backward"];
    assert_eq!(ops(&split), pair);
    let types = |g: &Graph| -> Vec<TensorType> {
        (g.outputs().iter())
            .map(|(_, v)| g.value_type(*v).unwrap().clone())
            .collect()
    };
    assert_eq!(types(&split), types(&fused));
    for (dtype, computed, keep) in [
        (DType::F32, false, false),
        (DType::BF16, true, false),
        (DType::BF16, false, true),
    ] {
        let names = ops(&fuse(&build(dtype, computed, keep)).unwrap());
        assert!(
            names.contains(&"linear_cross_entropy_backward".to_string()),
            "{dtype:?} computed={computed} keep={keep}: {names:?}"
        );
    }
}
