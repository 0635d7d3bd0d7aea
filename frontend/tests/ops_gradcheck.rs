//! Every differentiable op of the eager oracle, through the tape, against central finite
//! differences in f64 on fresh random inputs.

use kiln_frontend::{ops, ops::Transpose, Var};
use kiln_kernels::testing;
use kiln_runtime::Tensor;
use rand::rngs::StdRng;

/// Checks the tape's gradient of `L = Σ c ⊙ f(inputs)` (random `c`) for every input.
fn gradcheck(
    rng: &mut StdRng,
    name: &str,
    inputs: &[(Vec<f64>, Vec<usize>)],
    f: impl Fn(&[Var]) -> Var,
) {
    let leaves = |values: &[Vec<f64>]| -> Vec<Var> {
        values
            .iter()
            .zip(inputs)
            .map(|(v, (_, dims))| {
                Var::leaf(Tensor::from_vec(v.clone(), dims.as_slice()).unwrap()).unwrap()
            })
            .collect()
    };
    let base: Vec<Vec<f64>> = inputs.iter().map(|(v, _)| v.clone()).collect();
    let vars = leaves(&base);
    let out = f(&vars);
    let c = testing::signed(rng, out.value().numel());
    let c_var = Var::constant(Tensor::from_vec(c.clone(), out.shape().clone()).unwrap());
    ops::sum(&ops::mul(&out, &c_var).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    for (index, var) in vars.iter().enumerate() {
        let numeric = testing::central_difference(
            |p| {
                let mut values = base.clone();
                values[index] = p.to_vec();
                testing::dot(&f(&leaves(&values)).value().to_f64_vec().unwrap(), &c)
            },
            &base[index],
            1e-6,
        );
        let analytic = var
            .grad()
            .map(|g| g.to_f64_vec().unwrap())
            .unwrap_or_else(|| vec![0.0; numeric.len()]);
        testing::assert_close(
            &format!("{name}: input {index}"),
            &analytic,
            &numeric,
            1e-6,
            1e-8,
        );
    }
}

fn input(rng: &mut StdRng, dims: &[usize]) -> (Vec<f64>, Vec<usize>) {
    (testing::signed(rng, dims.iter().product()), dims.to_vec())
}

#[test]
fn matmul_all_transpose_flags() {
    let mut rng = testing::rng("matmul_all_transpose_flags");
    let (m, k, n) = (3, 5, 4);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let a_dims = if ta { [2, k, m] } else { [2, m, k] };
        let b_dims = if tb { [2, n, k] } else { [2, k, n] };
        let inputs = [input(&mut rng, &a_dims), input(&mut rng, &b_dims)];
        gradcheck(&mut rng, &format!("matmul ta={ta} tb={tb}"), &inputs, |v| {
            ops::matmul(&v[0], &v[1], Transpose { a: ta, b: tb }).unwrap()
        });
    }
}

#[test]
fn linear_with_bias() {
    let mut rng = testing::rng("linear_with_bias");
    let inputs = [
        input(&mut rng, &[2, 3, 5]),
        input(&mut rng, &[7, 5]),
        input(&mut rng, &[7]),
    ];
    gradcheck(&mut rng, "linear", &inputs, |v| {
        ops::linear(&v[0], &v[1], Some(&v[2]), None).unwrap()
    });
}

#[test]
fn elementwise_with_broadcast() {
    let mut rng = testing::rng("elementwise_with_broadcast");
    let inputs = [input(&mut rng, &[3, 4]), input(&mut rng, &[4])];
    gradcheck(&mut rng, "add", &inputs, |v| {
        ops::add(&v[0], &v[1]).unwrap()
    });
    gradcheck(&mut rng, "mul", &inputs, |v| {
        ops::mul(&v[0], &v[1]).unwrap()
    });
    gradcheck(&mut rng, "scale", &inputs[..1], |v| {
        ops::scale(&v[0], -1.7).unwrap()
    });
    gradcheck(&mut rng, "sum", &inputs[..1], |v| ops::sum(&v[0]).unwrap());
}

#[test]
fn views() {
    let mut rng = testing::rng("views");
    let inputs = [input(&mut rng, &[2, 3, 4])];
    gradcheck(&mut rng, "transpose+contiguous", &inputs, |v| {
        ops::contiguous(&ops::transpose(&v[0], 0, 2).unwrap()).unwrap()
    });
    gradcheck(&mut rng, "reshape", &inputs, |v| {
        ops::reshape(&v[0], [6, 4]).unwrap()
    });
}

#[test]
fn embedding() {
    let mut rng = testing::rng("embedding");
    let ids = Tensor::from_vec(vec![3i64, 0, 3, 5, 1], [5]).unwrap();
    let inputs = [input(&mut rng, &[6, 3])];
    gradcheck(&mut rng, "embedding", &inputs, |v| {
        ops::embedding(&v[0], &ids).unwrap()
    });
}

#[test]
fn norms() {
    let mut rng = testing::rng("norms");
    let x = input(&mut rng, &[3, 7]);
    let r = input(&mut rng, &[3, 7]);
    let w = (testing::uniform(&mut rng, 7, 0.5, 1.5), vec![7]);
    gradcheck(&mut rng, "rmsnorm", &[x.clone(), w.clone()], |v| {
        ops::rmsnorm(&v[0], &v[1], 1e-6).unwrap()
    });
    // Both outputs feed the loss, as the residual stream does in a model.
    gradcheck(&mut rng, "add_rmsnorm", &[x, r, w], |v| {
        let (sum, out) = ops::add_rmsnorm(&v[0], &v[1], &v[2], 1e-6).unwrap();
        ops::add(&ops::scale(&sum, 0.3).unwrap(), &out).unwrap()
    });
}

#[test]
fn rope_with_bias() {
    let mut rng = testing::rng("rope_with_bias");
    let positions = Tensor::from_vec(vec![0i64, 1, 2, 7, 3, 4], [2, 3]).unwrap();
    let inputs = [input(&mut rng, &[2, 3, 2, 6]), input(&mut rng, &[12])];
    gradcheck(&mut rng, "rope", &inputs, |v| {
        ops::rope(&v[0], &positions, Some(&v[1]), 10000.0).unwrap()
    });
    gradcheck(&mut rng, "rope (no bias)", &inputs[..1], |v| {
        ops::rope(&v[0], &positions, None, 500.0).unwrap()
    });
}

#[test]
fn attention_gqa() {
    let mut rng = testing::rng("attention_gqa");
    for (q_heads, kv_heads, seq, keys) in [(4, 2, 3, 3), (2, 2, 2, 4), (3, 1, 3, 3)] {
        let inputs = [
            input(&mut rng, &[2, q_heads, seq, 5]),
            input(&mut rng, &[2, kv_heads, keys, 5]),
            input(&mut rng, &[2, kv_heads, keys, 5]),
        ];
        gradcheck(
            &mut rng,
            &format!("attention {q_heads}/{kv_heads} T={seq} S={keys}"),
            &inputs,
            |v| ops::attention(&v[0], &v[1], &v[2], 0.4).unwrap(),
        );
    }
}

#[test]
fn activations_and_loss() {
    let mut rng = testing::rng("activations_and_loss");
    let inputs = [input(&mut rng, &[3, 5]), input(&mut rng, &[3, 5])];
    gradcheck(&mut rng, "swiglu", &inputs, |v| {
        ops::swiglu(&v[0], &v[1]).unwrap()
    });
    gradcheck(&mut rng, "softmax", &inputs[..1], |v| {
        ops::softmax(&v[0]).unwrap()
    });
    let targets = Tensor::from_vec(vec![4i64, -100, 0], [3]).unwrap();
    gradcheck(&mut rng, "cross_entropy", &inputs[..1], |v| {
        ops::cross_entropy(&v[0], &targets, -100).unwrap()
    });
}
