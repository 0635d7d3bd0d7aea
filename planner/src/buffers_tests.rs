use kiln_ir::{DType, Graph, InputKind, Op, Shape, TensorType};

use super::*;
use crate::test_graphs::*;

/// Buffers of `g` in node order.
fn build(g: &Graph) -> Buffers {
    let program = Program::new(g)
        .unwrap()
        .with_workspaces(&crate::testing::TestWorkspaces);
    let order: Vec<usize> = (0..program.ops.len()).collect();
    Buffers::build(&program, &order).unwrap()
}

/// (class, start, end) of every buffer.
fn lifetimes(b: &Buffers) -> Vec<(BufferClass, usize, usize)> {
    b.list.iter().map(|b| (b.class, b.start, b.end)).collect()
}

#[test]
fn chain_values_get_fresh_buffers_living_from_writer_to_last_reader() {
    let g = softmax_chain(4, 8, 16);
    let b = build(&g);
    use BufferClass::*;
    assert_eq!(
        lifetimes(&b),
        [
            (Input, 0, 3),
            (Activation, 0, 1),
            (Activation, 1, 2),
            (Activation, 2, 3),
            (Output, 3, 3)
        ]
    );
    assert_eq!(b.of_value, [0, 1, 2, 3, 4]);
    assert!(b.list.iter().all(|b| b.size == 8 * 16 * 4));
    assert_eq!(b.list[0].uses, 1);
    assert_eq!(b.list[4].uses, 0);
    assert_eq!(b.list[0].name, "x");
    assert_eq!(b.list[1].name, "softmax %1.0");
    assert_eq!(b.list[4].name, "y");
    assert_eq!(b.list[2].users, [1, 2]);
}

#[test]
fn views_share_their_operand_buffer_and_extend_its_lifetime() {
    let mut g = Graph::new("views");
    let x = input(&mut g, "x", InputKind::Input, &[2, 3, 4]);
    let a = op1(&mut g, Op::Softmax, &[x]); // step 0
    let r = op1(
        &mut g,
        Op::Reshape {
            shape: Shape::new(&[6, 4]),
        },
        &[a],
    ); // step 1
    let t = op1(&mut g, Op::Transpose { dim0: 0, dim1: 1 }, &[r]); // step 2
    let c = op1(&mut g, Op::Contiguous, &[t]); // step 3
    let d = op1(&mut g, Op::Softmax, &[c]); // step 4
    g.output("d", d).unwrap();
    let b = build(&g);
    let shared = b.of_value[1];
    assert_eq!(b.of_value[1..4], [shared; 3]);
    let buffer = &b.list[shared];
    assert_eq!(buffer.values, [1, 2, 3]);
    assert_eq!((buffer.start, buffer.end), (0, 3));
    assert_eq!(buffer.size, 2 * 3 * 4 * 4);
    // Reads of a (by reshape), r (by transpose) and t (by contiguous).
    assert_eq!(buffer.uses, 3);
    assert_ne!(b.of_value[4], shared);
    assert_eq!(b.list.len(), 4); // x, a/r/t, c, d
}

#[test]
fn an_elementwise_result_takes_over_its_dying_operand() {
    let mut g = Graph::new("inplace");
    let x = input(&mut g, "x", InputKind::Input, &[8, 16]);
    let bias = input(&mut g, "bias", InputKind::Param, &[16]);
    let a = op1(&mut g, Op::Softmax, &[x]); // step 0
    let s = op1(&mut g, Op::Add, &[a, bias]); // step 1: a dies here
    let k = op1(&mut g, Op::Scale { alpha: 2.0 }, &[s]); // step 2: s is read again below
    let m = op1(&mut g, Op::Mul, &[k, s]); // step 3: k dies, s dies
    let y = op1(&mut g, Op::Softmax, &[m]);
    g.output("y", y).unwrap();
    let b = build(&g);
    // One value per node here, so value numbers are node indices.
    let buf = |v: kiln_ir::ValueId| b.of_value[v.node.index()];
    assert_eq!(buf(s), buf(a), "s takes over a");
    assert_ne!(
        buf(k),
        buf(s),
        "s is read after k, so k must not overwrite it"
    );
    assert_eq!(buf(m), buf(k), "m takes over k (s is a different buffer)");
    assert_eq!(b.overwritten[1], [buf(a)]);
    assert_eq!(b.overwritten[2], Vec::<usize>::new());
    let shared = &b.list[buf(a)];
    assert_eq!((shared.start, shared.end), (0, 3));
    assert_eq!(shared.values.len(), 2);
    assert_eq!(b.list[buf(k)].users, [2, 3, 4]);
}

#[test]
fn inputs_transposed_views_and_other_aliasing_operands_are_not_overwritten() {
    let mut g = Graph::new("no-inplace");
    let x = input(&mut g, "x", InputKind::Input, &[8, 8]);
    let from_input = op1(&mut g, Op::Scale { alpha: 3.0 }, &[x]);
    let a = op1(&mut g, Op::Softmax, &[from_input]);
    let t = op1(&mut g, Op::Transpose { dim0: 0, dim1: 1 }, &[a]);
    // Writing row-major over a while reading it transposed would corrupt it.
    let through_transpose = op1(&mut g, Op::Scale { alpha: 2.0 }, &[t]);
    let c = op1(&mut g, Op::Softmax, &[through_transpose]);
    let t2 = op1(&mut g, Op::Transpose { dim0: 0, dim1: 1 }, &[c]);
    // c is read row-major and transposed by the same op: no in-place.
    let mixed = op1(&mut g, Op::Add, &[c, t2]);
    let squared = op1(&mut g, Op::Mul, &[mixed, mixed]);
    g.output("y", squared).unwrap();
    let b = build(&g);
    let buf = |v: kiln_ir::ValueId| b.of_value[v.node.index()];
    assert_ne!(buf(from_input), buf(x));
    assert_eq!(buf(t), buf(a));
    assert_ne!(buf(through_transpose), buf(a));
    assert_ne!(buf(mixed), buf(c));
    // The same value twice is fine: every element is read where it is written.
    assert_eq!(buf(squared), buf(mixed));
    assert_eq!(b.list[buf(squared)].class, BufferClass::Output);
}

#[test]
fn a_bf16_matmul_gets_a_workspace_living_only_at_its_step() {
    let mut g = Graph::new("bf16");
    let bf16 = |d: &[usize]| TensorType::new(DType::BF16, d).unwrap();
    let a = g.input("a", InputKind::Input, bf16(&[4, 8])).unwrap();
    let w = g.input("w", InputKind::Param, bf16(&[8, 16])).unwrap();
    let y = matmul(&mut g, a, w, false); // step 0
    let z = op1(&mut g, Op::Softmax, &[y]); // step 1
    g.output("z", z).unwrap();
    let b = build(&g);
    use BufferClass::*;
    assert_eq!(
        lifetimes(&b),
        [
            (Input, 0, 1),
            (Param, 0, 1),
            (Activation, 0, 1),
            (Workspace, 0, 0),
            (Output, 1, 1)
        ]
    );
    assert_eq!(b.list[3].size, (4 * 8 + 8 * 16) * 4);
    assert_eq!(b.list[3].name, "matmul %2 workspace");
    assert!(b.list[3].values.is_empty());
}

#[test]
fn outputs_and_written_values_leave_the_arena_but_views_of_inputs_stay_inputs() {
    let mut g = Graph::new("io");
    let pmv = param_with_moments(&mut g, "w", &[4, 4]);
    let step = step_input(&mut g);
    let x = input(&mut g, "x", InputKind::Input, &[4, 4]);
    let grad = op1(&mut g, Op::Softmax, &[x]); // step 0
    let view = op1(
        &mut g,
        Op::Reshape {
            shape: Shape::new(&[16]),
        },
        &[pmv[0]],
    ); // step 1
    g.output("w_flat", view).unwrap();
    let loss = op1(&mut g, Op::Scale { alpha: 0.5 }, &[grad]); // step 2
    g.output("loss", loss).unwrap();
    update(&mut g, "w", pmv, grad, step); // step 3
    let b = build(&g);
    let buf = |v: kiln_ir::ValueId| &b.list[b.of_value[v.node.index()]];
    assert_eq!(buf(view).class, BufferClass::Param);
    assert_eq!(buf(view).name, "w");
    assert_eq!(buf(loss).class, BufferClass::Output);
    assert_eq!((buf(loss).start, buf(loss).end), (2, 3));
    assert_eq!(buf(loss).name, "loss");
    // The AdamW results do not overwrite the param and moments: fresh output buffers.
    let writes: Vec<_> = b
        .list
        .iter()
        .filter(|b| b.name.starts_with("write "))
        .collect();
    assert_eq!(writes.len(), 3);
    for w in writes {
        assert_eq!((w.class, w.start, w.end), (BufferClass::Output, 3, 3));
    }
    assert_eq!(buf(grad).class, BufferClass::Activation);
    assert_eq!((buf(grad).start, buf(grad).end), (0, 3));
}
