//! Every op the scenario tests do not reach, as a one-op graph, bit for bit against its kernel
//! called directly on fresh tensors.

mod common;

use common::{bits, random_f32, random_ids, run_one, zeros};
use kiln_ir::{DType, Op, Shape};
use kiln_kernels::{activation, elementwise, embedding, loss, norm, rope, testing};
use kiln_kernels::{TensorView, TensorViewMut};
use kiln_runtime::{launch, Tensor};
use rand::rngs::StdRng;

/// Runs `kernel` directly on `inputs` into fresh tensors of `results` (dims, dtype).
fn direct(
    inputs: &[&Tensor],
    results: &[(&[usize], DType)],
    kernel: impl FnOnce(&[TensorView<'_>], &mut [TensorViewMut<'_>]) -> kiln_kernels::Result<()>,
) -> Vec<Tensor> {
    let fresh: Vec<Tensor> = results.iter().map(|(d, t)| zeros(d, *t)).collect();
    launch(inputs, &fresh.iter().collect::<Vec<_>>(), kernel).unwrap();
    fresh
}

#[track_caller]
fn assert_same(got: &[Tensor], want: &[Tensor], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: result count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (g.dtype(), g.dims()),
            (w.dtype(), w.dims()),
            "{what}: result {i}"
        );
        assert_eq!(bits(g), bits(w), "{what}: result {i}");
    }
}

fn f32s(rng: &mut StdRng, dims: &[usize]) -> Tensor {
    random_f32(rng, dims).0
}

#[test]
fn elementwise_ops_match_their_kernels() {
    let mut rng = testing::rng("elementwise_ops_match_their_kernels");
    let (a, b) = (f32s(&mut rng, &[3, 2, 5]), f32s(&mut rng, &[2, 5]));
    let f = DType::F32;
    let got = run_one(Op::Mul, &[&a, &b]).unwrap();
    let want = direct(&[&a, &b], &[(&[3, 2, 5], f)], |i, o| {
        elementwise::mul(&i[0], &i[1], &mut o[0])
    });
    assert_same(&got, &want, "mul");

    let got = run_one(Op::Scale { alpha: -0.3 }, &[&a]).unwrap();
    let want = direct(&[&a], &[(&[3, 2, 5], f)], |i, o| {
        elementwise::scale(&i[0], -0.3, &mut o[0])
    });
    assert_same(&got, &want, "scale");

    let shape = Shape::new(&[2, 5]);
    let got = run_one(Op::SumToShape { shape }, &[&a]).unwrap();
    let want = direct(&[&a], &[(&[2, 5], f)], |i, o| {
        elementwise::sum_to_shape(&i[0], &mut o[0])
    });
    assert_same(&got, &want, "sum_to_shape");

    let shape = Shape::new(&[4, 2, 5]);
    let got = run_one(Op::BroadcastTo { shape }, &[&b]).unwrap();
    let want = direct(&[&b], &[(&[4, 2, 5], f)], |i, o| {
        elementwise::broadcast_to(&i[0], &mut o[0])
    });
    assert_same(&got, &want, "broadcast_to");

    for to in [DType::BF16, DType::F64] {
        let got = run_one(Op::Cast { to }, &[&a]).unwrap();
        let want = direct(&[&a], &[(&[3, 2, 5], to)], |i, o| {
            kiln_kernels::copy::cast(&i[0], &mut o[0])
        });
        assert_same(&got, &want, "cast");
    }
}

#[test]
fn matmul_variants_match_the_fast_kernel() {
    let mut rng = testing::rng("matmul_variants_match_the_fast_kernel");
    for (ta, tb, a_dims, b_dims, out_dims) in [
        (false, false, [2, 3, 4], [2, 4, 5], [2, 3, 5]),
        (true, false, [2, 4, 3], [2, 4, 5], [2, 3, 5]),
        (true, true, [2, 4, 3], [2, 5, 4], [2, 3, 5]),
    ] {
        let (a, b) = (f32s(&mut rng, &a_dims), f32s(&mut rng, &b_dims));
        let op = Op::MatMul {
            transpose_a: ta,
            transpose_b: tb,
        };
        let transpose = kiln_kernels::matmul::Transpose { a: ta, b: tb };
        // bf16 operands give f32 through the widened workspace; f32 needs none.
        for dtype in [DType::F32, DType::BF16] {
            let cast = |t: &Tensor| run_one(Op::Cast { to: dtype }, &[t]).unwrap();
            let (a, b) = (cast(&a).remove(0), cast(&b).remove(0));
            let got = run_one(op.clone(), &[&a, &b]).unwrap();
            let mut workspace = vec![0f32; a.numel() + b.numel()];
            let want = direct(&[&a, &b], &[(&out_dims, DType::F32)], |i, o| {
                kiln_kernels::matmul::matmul(&i[0], &i[1], &mut o[0], transpose, &mut workspace)
            });
            assert_same(&got, &want, &format!("matmul {ta} {tb} {dtype}"));
        }
    }
}

#[test]
fn norm_ops_match_their_kernels() {
    let mut rng = testing::rng("norm_ops_match_their_kernels");
    let dims: &[usize] = &[3, 7];
    let f = DType::F32;
    let (x, r, g, gs) = (
        f32s(&mut rng, dims),
        f32s(&mut rng, dims),
        f32s(&mut rng, dims),
        f32s(&mut rng, dims),
    );
    let w = f32s(&mut rng, &[7]);
    let eps = 1e-5;

    let got = run_one(Op::RmsNormBackward { eps }, &[&x, &w, &g]).unwrap();
    let want = direct(&[&x, &w, &g], &[(dims, f), (&[7], f)], |i, o| {
        let (gx, gw) = o.split_at_mut(1);
        norm::rmsnorm_backward(&i[0], &i[1], &i[2], eps, &mut gx[0], &mut gw[0])
    });
    assert_same(&got, &want, "rmsnorm_backward");

    let got = run_one(Op::AddRmsNorm { eps }, &[&x, &r, &w]).unwrap();
    let want = direct(&[&x, &r, &w], &[(dims, f), (dims, f)], |i, o| {
        let (sum, out) = o.split_at_mut(1);
        norm::add_rmsnorm(&i[0], &i[1], &i[2], eps, &mut sum[0], &mut out[0])
    });
    assert_same(&got, &want, "add_rmsnorm");

    // With and without the sum's own gradient: the two must differ.
    let mut grad_inputs = Vec::new();
    for with_grad_sum in [false, true] {
        let mut operands = vec![&x, &w, &g];
        operands.extend(with_grad_sum.then_some(&gs));
        let got = run_one(Op::AddRmsNormBackward { eps }, &operands).unwrap();
        let want = direct(&operands, &[(dims, f), (&[7], f)], |i, o| {
            let (gi, gw) = o.split_at_mut(1);
            norm::add_rmsnorm_backward(&i[0], &i[1], &i[2], i.get(3), eps, &mut gi[0], &mut gw[0])
        });
        assert_same(
            &got,
            &want,
            &format!("add_rmsnorm_backward {with_grad_sum}"),
        );
        grad_inputs.push(bits(&got[0]));
    }
    assert_ne!(grad_inputs[0], grad_inputs[1], "grad_sum was ignored");
}

#[test]
fn rope_ops_match_their_kernels() {
    let mut rng = testing::rng("rope_ops_match_their_kernels");
    let (b, t, h, d, theta) = (2, 3, 2, 6, 10000.0);
    let x = f32s(&mut rng, &[b, t, h, d]);
    let bias = f32s(&mut rng, &[h * d]);
    let positions = random_ids(&mut rng, &[b, t], 50).0;
    let bhtd: &[usize] = &[b, h, t, d];
    for with_bias in [false, true] {
        let mut operands = vec![&x, &positions];
        operands.extend(with_bias.then_some(&bias));
        let op = Op::Rope {
            theta,
            bias: with_bias,
        };
        let got = run_one(op, &operands).unwrap();
        let want = direct(&operands, &[(bhtd, DType::F32)], |i, o| {
            rope::rope(&i[0], &i[1], i.get(2), theta, &mut o[0])
        });
        assert_same(&got, &want, &format!("rope bias={with_bias}"));
    }
    let grad = f32s(&mut rng, bhtd);
    let got = run_one(Op::RopeBackward { theta }, &[&grad, &positions]).unwrap();
    let want = direct(
        &[&grad, &positions],
        &[(&[b, t, h, d], DType::F32)],
        |i, o| rope::rope_backward(&i[0], &i[1], theta, &mut o[0]),
    );
    assert_same(&got, &want, "rope_backward");
}

#[test]
fn activation_loss_and_embedding_backward_ops_match_their_kernels() {
    let mut rng = testing::rng("activation_loss_and_embedding_backward_ops_match_their_kernels");
    let dims: &[usize] = &[4, 9];
    let f = DType::F32;
    let (a, b, g) = (
        f32s(&mut rng, dims),
        f32s(&mut rng, dims),
        f32s(&mut rng, dims),
    );

    let got = run_one(Op::SwiGlu, &[&a, &b]).unwrap();
    let want = direct(&[&a, &b], &[(dims, f)], |i, o| {
        activation::swiglu(&i[0], &i[1], &mut o[0])
    });
    assert_same(&got, &want, "swiglu");

    let got = run_one(Op::SwiGluBackward, &[&a, &b, &g]).unwrap();
    let want = direct(&[&a, &b, &g], &[(dims, f), (dims, f)], |i, o| {
        let (gg, gu) = o.split_at_mut(1);
        activation::swiglu_backward(&i[0], &i[1], &i[2], &mut gg[0], &mut gu[0])
    });
    assert_same(&got, &want, "swiglu_backward");

    let got = run_one(Op::Softmax, &[&a]).unwrap();
    let want = direct(&[&a], &[(dims, f)], |i, o| {
        activation::softmax(&i[0], &mut o[0])
    });
    assert_same(&got, &want, "softmax");
    let y = &want[0];

    let got = run_one(Op::SoftmaxBackward, &[y, &g]).unwrap();
    let want = direct(&[y, &g], &[(dims, f)], |i, o| {
        activation::softmax_backward(&i[0], &i[1], &mut o[0])
    });
    assert_same(&got, &want, "softmax_backward");

    let targets = Tensor::from_vec(vec![3i32, -1, 8, 0], [4]).unwrap();
    let grad_loss = Tensor::from_vec(vec![0.75f32], Shape::scalar()).unwrap();
    let op = Op::CrossEntropyBackward { ignore_index: -1 };
    let got = run_one(op, &[&a, &targets, &grad_loss]).unwrap();
    let want = direct(&[&a, &targets, &grad_loss], &[(dims, f)], |i, o| {
        loss::cross_entropy_backward(&i[0], &i[1], -1, &i[2], &mut o[0])
    });
    assert_same(&got, &want, "cross_entropy_backward");

    let ids = random_ids(&mut rng, &[2, 2], 6).0;
    let grad = f32s(&mut rng, &[2, 2, 9]);
    let got = run_one(
        Op::EmbeddingBackward {
            vocab: 6,
            onto: false,
        },
        &[&ids, &grad],
    )
    .unwrap();
    let want = direct(&[&ids, &grad], &[(&[6, 9], f)], |i, o| {
        embedding::embedding_backward(&i[0], &i[1], None, &mut o[0])
    });
    assert_same(&got, &want, "embedding_backward");
}

#[test]
fn f64_graphs_run_in_f64() {
    let mut rng = testing::rng("f64_graphs_run_in_f64");
    let a = Tensor::from_vec(testing::signed(&mut rng, 12), [3, 4]).unwrap();
    let b = Tensor::from_vec(testing::signed(&mut rng, 20), [4, 5]).unwrap();
    let op = Op::MatMul {
        transpose_a: false,
        transpose_b: false,
    };
    let got = run_one(op, &[&a, &b]).unwrap();
    let transpose = kiln_kernels::matmul::Transpose { a: false, b: false };
    let want = direct(&[&a, &b], &[(&[3, 5], DType::F64)], |i, o| {
        kiln_kernels::matmul::matmul(&i[0], &i[1], &mut o[0], transpose, &mut [])
    });
    assert_same(&got, &want, "matmul f64");
}
