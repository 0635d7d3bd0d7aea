//! Tests of the matmul kernels against a plain f64 product, against each other, and of the
//! matmul VJP rule against central differences.

use half::bf16;
use kiln_ir::{DType, Shape};

use super::*;
use crate::element::Element;
use crate::testing::{self, central_difference, dot};

const TRANSPOSES: [Transpose; 4] = [
    Transpose { a: false, b: false },
    Transpose { a: true, b: false },
    Transpose { a: false, b: true },
    Transpose { a: true, b: true },
];

/// One product: batch dims, M, K, N, and whether `b` is a shared rank-2 matrix.
#[derive(Clone, Copy, Debug)]
struct Case {
    batch: &'static [usize],
    m: usize,
    k: usize,
    n: usize,
    b_shared: bool,
}

const fn case(batch: &'static [usize], m: usize, k: usize, n: usize, b_shared: bool) -> Case {
    Case {
        batch,
        m,
        k,
        n,
        b_shared,
    }
}

const CASES: [Case; 16] = [
    case(&[], 7, 13, 5, true),
    case(&[], 1, 1, 1, true),
    case(&[], 33, 70, 41, true),
    case(&[], 19, 257, 130, true),
    case(&[3], 4, 9, 6, false),
    case(&[2, 3], 5, 3, 7, false),
    case(&[2], 7, 13, 5, true),
    case(&[2, 2], 9, 4, 17, true),
    // Zero-sized dims.
    case(&[], 0, 5, 3, true),
    case(&[], 4, 5, 0, true),
    case(&[], 4, 0, 3, true),
    case(&[2], 3, 0, 4, false),
    case(&[2], 3, 0, 4, true),
    case(&[0], 3, 4, 5, false),
    case(&[0], 3, 4, 5, true),
    case(&[2], 0, 4, 5, true),
];

impl Case {
    fn batch_count(&self) -> usize {
        self.batch.iter().product()
    }

    /// Stored shapes of a, b and out under `t`.
    fn shapes(&self, t: Transpose) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
        let with = |batch: &[usize], rows, cols| [batch, &[rows, cols][..]].concat();
        let a = if t.a {
            with(self.batch, self.k, self.m)
        } else {
            with(self.batch, self.m, self.k)
        };
        let b_batch = if self.b_shared { &[][..] } else { self.batch };
        let b = if t.b {
            with(b_batch, self.n, self.k)
        } else {
            with(b_batch, self.k, self.n)
        };
        (a, b, with(self.batch, self.m, self.n))
    }

    /// The product in f64, written from the definition, and for each element the sum of
    /// |terms|, which bounds the rounding error of any summation order.
    fn naive(&self, a: &[f64], b: &[f64], t: Transpose) -> (Vec<f64>, Vec<f64>) {
        let Case { m, k, n, .. } = *self;
        let (mut out, mut magnitude) = (Vec::new(), Vec::new());
        for batch in 0..self.batch_count() {
            let a_mat = &a[batch * m * k..];
            let b_mat = if self.b_shared {
                b
            } else {
                &b[batch * k * n..]
            };
            for i in 0..m {
                for j in 0..n {
                    let (mut sum, mut abs) = (0.0, 0.0);
                    for p in 0..k {
                        let x = if t.a {
                            a_mat[p * m + i]
                        } else {
                            a_mat[i * k + p]
                        };
                        let y = if t.b {
                            b_mat[j * k + p]
                        } else {
                            b_mat[p * n + j]
                        };
                        sum += x * y;
                        abs += (x * y).abs();
                    }
                    out.push(sum);
                    magnitude.push(abs);
                }
            }
        }
        (out, magnitude)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Reference,
    Fast,
}

/// Runs one path with inputs of type `A` and output `O`; `out` starts as NaN so stale
/// values would leak into the result.
fn run<A: Element, O: Element>(
    path: Path,
    (a, a_shape): (&[f64], &[usize]),
    (b, b_shape): (&[f64], &[usize]),
    out_shape: &[usize],
    t: Transpose,
) -> Result<Vec<f64>> {
    let a: Vec<A> = a.iter().map(|&x| A::from_f64(x)).collect();
    let b: Vec<A> = b.iter().map(|&x| A::from_f64(x)).collect();
    let mut out = vec![O::from_f64(f64::NAN); out_shape.iter().product()];
    let (av, bv) = (
        TensorView::contiguous(&a, a_shape)?,
        TensorView::contiguous(&b, b_shape)?,
    );
    let mut outv = TensorViewMut::contiguous(&mut out, out_shape)?;
    match path {
        Path::Reference => matmul_reference(&av, &bv, &mut outv, t)?,
        Path::Fast => {
            let len = matmul_workspace_len(A::DTYPE, av.shape(), bv.shape(), t);
            // Garbage in the workspace must not matter either.
            matmul(&av, &bv, &mut outv, t, &mut vec![f32::NAN; len])?
        }
    }
    Ok(out.iter().map(|&x| x.to_f64()).collect())
}

/// Inputs rounded to `A`, so the f64 truth sees exactly what the kernel sees.
fn inputs<A: Element>(rng: &mut rand::rngs::StdRng, len: usize) -> Vec<f64> {
    testing::signed(rng, len)
        .iter()
        .map(|&x| A::from_f64(x).to_f64())
        .collect()
}

/// `|got − want| <= tol · Σ|terms|` per element (0 for empty sums, where it must be exact).
#[track_caller]
fn assert_within(what: &str, got: &[f64], want: &[f64], magnitude: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, ((g, w), mag)) in got.iter().zip(want).zip(magnitude).enumerate() {
        assert!(
            (g - w).abs() <= tol * mag,
            "{what}: element {i}: got {g}, want {w} (Σ|terms| {mag})"
        );
    }
}

fn check_against_naive<A: Element, O: Element>(name: &str, tol: f64) {
    let mut rng = testing::rng(name);
    for case in CASES {
        for t in TRANSPOSES {
            let (a_shape, b_shape, out_shape) = case.shapes(t);
            let a = inputs::<A>(&mut rng, a_shape.iter().product());
            let b = inputs::<A>(&mut rng, b_shape.iter().product());
            let (want, magnitude) = case.naive(&a, &b, t);
            let what = format!("{case:?} {t:?}");
            let a = (&a[..], &a_shape[..]);
            let b = (&b[..], &b_shape[..]);
            let reference = run::<A, O>(Path::Reference, a, b, &out_shape, t).unwrap();
            let fast = run::<A, O>(Path::Fast, a, b, &out_shape, t).unwrap();
            assert_within(
                &format!("reference {what}"),
                &reference,
                &want,
                &magnitude,
                tol,
            );
            assert_within(&format!("fast {what}"), &fast, &want, &magnitude, tol);
            // Two roundings of the same sum are each within tol of the truth.
            assert_within(
                &format!("fast vs reference {what}"),
                &fast,
                &reference,
                &magnitude,
                2.0 * tol,
            );
        }
    }
}

#[test]
fn f32_matches_naive_product() {
    check_against_naive::<f32, f32>("f32_matches_naive_product", 1e-5);
}

#[test]
fn f64_matches_naive_product() {
    check_against_naive::<f64, f64>("f64_matches_naive_product", 1e-13);
}

#[test]
fn bf16_matches_naive_product() {
    check_against_naive::<bf16, f32>("bf16_matches_naive_product", 1e-5);
}

/// With K = 1 every output is one product of two bf16 values, which f32 holds exactly: any
/// lossy widening (through f16, or rounding to bf16) would show.
#[test]
fn bf16_products_are_exact_in_f32() {
    let mut rng = testing::rng("bf16_products_are_exact_in_f32");
    let big = testing::uniform(&mut rng, 12, 100.0, 60000.0);
    let small = testing::uniform(&mut rng, 12, -1e-3, 1e-3);
    let a: Vec<f64> = [&big[..6], &small[..6]]
        .concat()
        .iter()
        .map(|&x| <bf16 as Element>::from_f64(x).to_f64())
        .collect();
    let b: Vec<f64> = [&small[6..], &big[6..]]
        .concat()
        .iter()
        .map(|&x| <bf16 as Element>::from_f64(x).to_f64())
        .collect();
    let (m, n) = (12, 12);
    for path in [Path::Reference, Path::Fast] {
        let got = run::<bf16, f32>(
            path,
            (&a, &[m, 1]),
            (&b, &[1, n]),
            &[m, n],
            Transpose::default(),
        )
        .unwrap();
        for i in 0..m {
            for j in 0..n {
                assert_eq!(got[i * n + j], a[i] * b[j], "{path:?} ({i}, {j})");
            }
        }
    }
}

#[test]
fn fast_path_is_deterministic() {
    let mut rng = testing::rng("fast_path_is_deterministic");
    let (m, k, n) = (67, 301, 45);
    let a = inputs::<f32>(&mut rng, m * k);
    let b = inputs::<f32>(&mut rng, k * n);
    let t = Transpose { a: false, b: true };
    let once = run::<f32, f32>(Path::Fast, (&a, &[m, k]), (&b, &[n, k]), &[m, n], t).unwrap();
    let again = run::<f32, f32>(Path::Fast, (&a, &[m, k]), (&b, &[n, k]), &[m, n], t).unwrap();
    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&once), bits(&again));
}

/// The VJP rule autodiff uses for `out = a · b` (2-D): `grad_a = g · bᵀ` and `grad_b = aᵀ · g`,
/// both computed by `matmul` with transpose flags, match central differences of
/// `L = dot(g, a · b)`.
#[test]
fn vjp_is_matmul_with_transpose_flags() {
    let mut rng = testing::rng("vjp_is_matmul_with_transpose_flags");
    let (m, k, n) = (5, 7, 3);
    let a = testing::signed(&mut rng, m * k);
    let b = testing::signed(&mut rng, k * n);
    let g = testing::signed(&mut rng, m * n);
    let product = |a: &[f64], b: &[f64]| {
        run::<f64, f64>(
            Path::Fast,
            (a, &[m, k]),
            (b, &[k, n]),
            &[m, n],
            Transpose::default(),
        )
        .unwrap()
    };
    let want_a = central_difference(|x| dot(&g, &product(x, &b)), &a, 1e-6);
    let want_b = central_difference(|x| dot(&g, &product(&a, x)), &b, 1e-6);

    let g_b_t = Transpose { a: false, b: true };
    let grad_a = run::<f64, f64>(Path::Fast, (&g, &[m, n]), (&b, &[k, n]), &[m, k], g_b_t).unwrap();
    let a_t_g = Transpose { a: true, b: false };
    let grad_b = run::<f64, f64>(Path::Fast, (&a, &[m, k]), (&g, &[m, n]), &[k, n], a_t_g).unwrap();
    testing::assert_close("grad_a", &grad_a, &want_a, 1e-6, 1e-6);
    testing::assert_close("grad_b", &grad_b, &want_b, 1e-6, 1e-6);
}

#[test]
fn workspace_len_covers_widened_inputs() {
    let (a, b) = (Shape::new(&[2, 7, 13]), Shape::new(&[13, 5]));
    let t = Transpose::default();
    assert_eq!(matmul_workspace_len(DType::F32, &a, &b, t), 0);
    assert_eq!(matmul_workspace_len(DType::F64, &a, &b, t), 0);
    assert_eq!(
        matmul_workspace_len(DType::BF16, &a, &b, t),
        2 * 7 * 13 + 13 * 5
    );
}

mod rejections;
