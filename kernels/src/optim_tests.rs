//! Tests of `optim`: AdamW against a textbook scalar f64 AdamW written here, descent on a
//! quadratic, and every rejection.

use super::*;
use crate::testing::{assert_close, rng, signed, uniform};
use crate::Element;

/// AdamW as the paper writes it (Loshchilov & Hutter, with Adam's bias correction), in f64.
fn reference_step(
    param: &mut [f64],
    grad: &[f64],
    m: &mut [f64],
    v: &mut [f64],
    step: u64,
    c: &AdamW,
) {
    for i in 0..param.len() {
        param[i] -= c.lr * c.weight_decay * param[i];
        m[i] = c.beta1 * m[i] + (1.0 - c.beta1) * grad[i];
        v[i] = c.beta2 * v[i] + (1.0 - c.beta2) * grad[i] * grad[i];
        let m_hat = m[i] / (1.0 - c.beta1.powi(step as i32));
        let v_hat = v[i] / (1.0 - c.beta2.powi(step as i32));
        param[i] -= c.lr * m_hat / (v_hat.sqrt() + c.eps);
    }
}

/// The optimizer state of one tensor, kept in T and read back as f64.
struct State<T> {
    dims: Vec<usize>,
    param: Vec<T>,
    m: Vec<T>,
    v: Vec<T>,
}

impl<T: Real> State<T> {
    fn new(dims: &[usize], param: &[f64], m: &[f64], v: &[f64]) -> Self {
        let to = |values: &[f64]| values.iter().map(|&x| T::of(x)).collect();
        State {
            dims: dims.to_vec(),
            param: to(param),
            m: to(m),
            v: to(v),
        }
    }

    fn step(&mut self, grad: &[f64], step: u64, config: &AdamW) {
        let grad: Vec<T> = grad.iter().map(|&x| T::of(x)).collect();
        let dims = &self.dims[..];
        adamw(
            &mut TensorViewMut::contiguous(&mut self.param, dims).unwrap(),
            &TensorView::contiguous(&grad, dims).unwrap(),
            &mut TensorViewMut::contiguous(&mut self.m, dims).unwrap(),
            &mut TensorViewMut::contiguous(&mut self.v, dims).unwrap(),
            (step, None),
            config,
        )
        .unwrap();
    }

    fn read(values: &[T]) -> Vec<f64> {
        values.iter().map(|&x| Element::to_f64(x)).collect()
    }
}

fn round_f32(values: &[f64]) -> Vec<f64> {
    values.iter().map(|&v| v as f32 as f64).collect()
}

const CONFIGS: &[AdamW] = &[
    AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-2,
    },
    AdamW {
        lr: 1e-2,
        beta1: 0.8,
        beta2: 0.99,
        eps: 1e-6,
        weight_decay: 0.1,
    },
    // beta1 < 0.5 takes torch's other lerp formula.
    AdamW {
        lr: 3e-3,
        beta1: 0.3,
        beta2: 0.5,
        eps: 1e-8,
        weight_decay: 0.0,
    },
];

#[test]
fn default_is_torch_default() {
    assert_eq!(AdamW::default(), CONFIGS[0]);
}

#[test]
fn adamw_matches_reference_over_several_steps() {
    let mut rng = rng("adamw_matches_reference_over_several_steps");
    let shapes: &[&[usize]] = &[&[5], &[3, 7], &[17, 9], &[2, 0]];
    for config in CONFIGS {
        for &dims in shapes {
            let numel: usize = dims.iter().product();
            // Both a fresh state (zeros, steps 1..) and a state mid-training (steps 10..).
            for first_step in [1u64, 10] {
                let param = signed(&mut rng, numel);
                let (m, v) = if first_step == 1 {
                    (vec![0.0; numel], vec![0.0; numel])
                } else {
                    (
                        uniform(&mut rng, numel, -0.1, 0.1),
                        uniform(&mut rng, numel, 0.0, 0.1),
                    )
                };
                let what = format!("{config:?} {dims:?} from step {first_step}");

                let (mut p_ref, mut m_ref, mut v_ref) = (param.clone(), m.clone(), v.clone());
                let mut state64 = State::<f64>::new(dims, &param, &m, &v);
                for step in first_step..first_step + 6 {
                    let grad = signed(&mut rng, numel);
                    reference_step(&mut p_ref, &grad, &mut m_ref, &mut v_ref, step, config);
                    state64.step(&grad, step, config);
                }
                let (p64, m64, v64) = (
                    State::read(&state64.param),
                    State::read(&state64.m),
                    State::read(&state64.v),
                );
                assert_close(&format!("f64 param {what}"), &p64, &p_ref, 1e-12, 1e-15);
                assert_close(&format!("f64 m {what}"), &m64, &m_ref, 1e-12, 1e-15);
                assert_close(&format!("f64 v {what}"), &v64, &v_ref, 1e-12, 1e-15);

                // f32 state from the same (rounded) start, fed the same rounded gradients.
                let (param, m, v) = (round_f32(&param), round_f32(&m), round_f32(&v));
                let (mut p_ref, mut m_ref, mut v_ref) = (param.clone(), m.clone(), v.clone());
                let mut state32 = State::<f32>::new(dims, &param, &m, &v);
                for step in first_step..first_step + 6 {
                    let grad = round_f32(&signed(&mut rng, numel));
                    reference_step(&mut p_ref, &grad, &mut m_ref, &mut v_ref, step, config);
                    state32.step(&grad, step, config);
                }
                let p32 = State::read(&state32.param);
                let (m32, v32) = (State::read(&state32.m), State::read(&state32.v));
                assert_close(&format!("f32 param {what}"), &p32, &p_ref, 1e-5, 1e-6);
                assert_close(&format!("f32 m {what}"), &m32, &m_ref, 1e-5, 1e-7);
                assert_close(&format!("f32 v {what}"), &v32, &v_ref, 1e-5, 1e-9);
            }
        }
    }
}

#[test]
fn first_step_moves_each_parameter_by_about_lr() {
    // From zero moments, bias correction makes step 1 a sign step: p·(1 − lr·wd) − lr·g/(|g|+ε').
    let config = AdamW::default();
    let param = [0.5, -0.25, 2.0];
    let grad = [0.3, -0.02, 1e-3];
    let mut state = State::<f64>::new(&[3], &param, &[0.0; 3], &[0.0; 3]);
    state.step(&grad, 1, &config);
    let want: Vec<f64> = param
        .iter()
        .zip(&grad)
        .map(|(p, g)| p * (1.0 - config.lr * config.weight_decay) - config.lr * g.signum())
        .collect();
    assert_close("step 1", &State::read(&state.param), &want, 0.0, 1e-7);
}

#[test]
fn a_few_steps_decrease_a_quadratic() {
    let mut rng = rng("a_few_steps_decrease_a_quadratic");
    let numel = 13;
    let target = signed(&mut rng, numel);
    // Start at least 0.5 away in every coordinate, so steps of about lr never overshoot.
    let start: Vec<f64> = target
        .iter()
        .zip(uniform(&mut rng, numel, 0.5, 1.5))
        .zip(signed(&mut rng, numel))
        .map(|((t, distance), side)| t + distance * side.signum())
        .collect();
    let loss = |p: &[f64]| -> f64 { p.iter().zip(&target).map(|(p, t)| (p - t) * (p - t)).sum() };
    let gradient =
        |p: &[f64]| -> Vec<f64> { p.iter().zip(&target).map(|(p, t)| 2.0 * (p - t)).collect() };
    let config = AdamW {
        lr: 1e-2,
        ..AdamW::default()
    };

    let mut state64 = State::<f64>::new(&[numel], &start, &[0.0; 13], &[0.0; 13]);
    let mut state32 = State::<f32>::new(&[numel], &start, &[0.0; 13], &[0.0; 13]);
    let (mut last64, mut last32) = (loss(&start), loss(&round_f32(&start)));
    for step in 1..=10 {
        let p64 = State::read(&state64.param);
        state64.step(&gradient(&p64), step, &config);
        let now64 = loss(&State::read(&state64.param));
        assert!(now64 < last64, "f64 step {step}: {now64} >= {last64}");
        last64 = now64;

        let p32 = State::read(&state32.param);
        state32.step(&gradient(&p32), step, &config);
        let now32 = loss(&State::read(&state32.param));
        assert!(now32 < last32, "f32 step {step}: {now32} >= {last32}");
        last32 = now32;
    }
    assert!(last64 < 0.9 * loss(&start), "{last64} vs {}", loss(&start));
}

#[track_caller]
fn assert_argument(result: Result<()>, argument: &str) {
    let err = result.unwrap_err();
    assert!(matches!(err, Error::Argument { .. }), "{err}");
    assert!(err.to_string().contains(&format!("`{argument}`")), "{err}");
}

/// Runs one step on a valid [2,3] f32 problem with the given config and step.
fn step_f32(step: u64, config: &AdamW) -> Result<()> {
    let mut param = [0.5f32; 6];
    let grad = [0.1f32; 6];
    let (mut m, mut v) = ([0f32; 6], [0f32; 6]);
    adamw(
        &mut TensorViewMut::contiguous(&mut param[..], [2, 3]).unwrap(),
        &TensorView::contiguous(&grad[..], [2, 3]).unwrap(),
        &mut TensorViewMut::contiguous(&mut m[..], [2, 3]).unwrap(),
        &mut TensorViewMut::contiguous(&mut v[..], [2, 3]).unwrap(),
        (step, None),
        config,
    )
}

#[test]
fn rejects_bad_step_and_config() {
    let ok = AdamW::default();
    assert!(step_f32(1, &ok).is_ok());
    assert_argument(step_f32(0, &ok), "step");
    let bad = |edit: fn(&mut AdamW)| {
        let mut config = ok;
        edit(&mut config);
        step_f32(1, &config)
    };
    // The rate is data: a NaN one runs, and gives NaN parameters (as the GPU kernel does).
    let mut param = [0.5f32; 6];
    let (mut m, mut v) = ([0f32; 6], [0f32; 6]);
    let nan_rate = AdamW { lr: f64::NAN, ..ok };
    adamw(
        &mut TensorViewMut::contiguous(&mut param[..], [6]).unwrap(),
        &TensorView::contiguous(&[0.1f32; 6][..], [6]).unwrap(),
        &mut TensorViewMut::contiguous(&mut m[..], [6]).unwrap(),
        &mut TensorViewMut::contiguous(&mut v[..], [6]).unwrap(),
        (1, None),
        &nan_rate,
    )
    .unwrap();
    assert!(param.iter().all(|p| p.is_nan()), "{param:?}");
    assert_argument(bad(|c| c.eps = -1e-8), "eps");
    assert_argument(bad(|c| c.eps = f64::INFINITY), "eps");
    assert_argument(bad(|c| c.weight_decay = -0.1), "weight_decay");
    assert_argument(bad(|c| c.beta1 = 1.0), "beta1");
    assert_argument(bad(|c| c.beta1 = -0.1), "beta1");
    assert_argument(bad(|c| c.beta2 = 1.0), "beta2");
    assert_argument(bad(|c| c.beta2 = f64::NAN), "beta2");
}

#[test]
fn rejects_wrong_shapes_dtypes_and_layouts() {
    let config = AdamW::default();
    let mut param = [0.5f32; 6];
    let grad = [0.1f32; 6];
    let grad64 = [0.1f64; 6];
    let (mut m, mut v) = ([0f32; 6], [0f32; 6]);
    let names = |err: Error, operand: &str| {
        assert!(err.to_string().contains(&format!("`{operand}`")), "{err}");
        err
    };
    let mut run = |grad: &TensorView<'_>, m_dims: [usize; 2], v_dims: [usize; 2]| {
        adamw(
            &mut TensorViewMut::contiguous(&mut param[..], [2, 3]).unwrap(),
            grad,
            &mut TensorViewMut::contiguous(&mut m[..], m_dims).unwrap(),
            &mut TensorViewMut::contiguous(&mut v[..], v_dims).unwrap(),
            (1, None),
            &config,
        )
        .unwrap_err()
    };
    let g = TensorView::contiguous(&grad[..], [2, 3]).unwrap();
    let g_wrong = TensorView::contiguous(&grad[..], [3, 2]).unwrap();
    let err = names(run(&g_wrong, [2, 3], [2, 3]), "grad");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let err = names(run(&g, [6, 1], [2, 3]), "m");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let err = names(run(&g, [2, 3], [1, 6]), "v");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let g64 = TensorView::contiguous(&grad64[..], [2, 3]).unwrap();
    let err = names(run(&g64, [2, 3], [2, 3]), "grad");
    assert!(matches!(err, Error::DType { .. }), "{err}");
    let g_transposed = TensorView::new(&grad[..], [2, 3], &[1, 2], 0).unwrap();
    let err = names(run(&g_transposed, [2, 3], [2, 3]), "grad");
    assert!(matches!(err, Error::NotContiguous { .. }), "{err}");

    let mut ids = [1i64; 6];
    let mut m64 = [0f64; 6];
    let mut v64 = [0f64; 6];
    let err = adamw(
        &mut TensorViewMut::contiguous(&mut ids[..], [2, 3]).unwrap(),
        &g64,
        &mut TensorViewMut::contiguous(&mut m64[..], [2, 3]).unwrap(),
        &mut TensorViewMut::contiguous(&mut v64[..], [2, 3]).unwrap(),
        (1, None),
        &config,
    )
    .unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedDType { op: "adamw", .. }),
        "{err}"
    );
}

/// A gradient scale gives exactly the step of the pre-scaled gradient (`g · s` rounded to f32,
/// as torch's `clip_grad_norm_` leaves it in `.grad`).
#[test]
fn a_grad_scale_steps_like_the_scaled_gradient() {
    let mut rng = rng("a_grad_scale_steps_like_the_scaled_gradient");
    let n = 37;
    let param = signed(&mut rng, n);
    let grad: Vec<f32> = signed(&mut rng, n)
        .iter()
        .map(|&g| 2.0 * g as f32)
        .collect();
    let moment: Vec<f32> = uniform(&mut rng, n, 0.0, 0.5)
        .iter()
        .map(|&x| x as f32)
        .collect();
    let scale = 0.3137f32;
    let scaled: Vec<f32> = grad.iter().map(|&g| g * scale).collect();
    let run = |grad: &[f32], grad_scale: Option<f32>| {
        let mut p: Vec<f32> = param.iter().map(|&x| x as f32).collect();
        let (mut m, mut v) = (moment.clone(), moment.clone());
        adamw(
            &mut TensorViewMut::contiguous(&mut p[..], [n]).unwrap(),
            &TensorView::contiguous(grad, [n]).unwrap(),
            &mut TensorViewMut::contiguous(&mut m[..], [n]).unwrap(),
            &mut TensorViewMut::contiguous(&mut v[..], [n]).unwrap(),
            (3, grad_scale),
            &AdamW::default(),
        )
        .unwrap();
        [p, m, v].map(|x| x.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
    };
    assert_eq!(run(&grad, Some(scale)), run(&scaled, None));
    assert_ne!(run(&grad, Some(scale)), run(&grad, None));
}

#[test]
fn clip_grad_norm_is_the_global_norm_and_torchs_factor() {
    let mut rng = rng("clip_grad_norm_is_the_global_norm_and_torchs_factor");
    let a: Vec<f32> = signed(&mut rng, 60).iter().map(|&g| g as f32).collect();
    let b: Vec<f32> = signed(&mut rng, 7)
        .iter()
        .map(|&g| 3.0 * g as f32)
        .collect();
    let views = [
        TensorView::contiguous(&a[..], [6, 10]).unwrap(),
        TensorView::contiguous(&b[..], [7]).unwrap(),
    ];
    let want = a
        .iter()
        .chain(&b)
        .map(|&g| f64::from(g).powi(2))
        .sum::<f64>()
        .sqrt();
    let (norm, scale) = clip_grad_norm(&views, 1.0).unwrap();
    assert_close("norm", &[f64::from(norm)], &[want], 1e-7, 0.0);
    assert!(want > 1.0, "{want}");
    assert_close(
        "scale",
        &[f64::from(scale)],
        &[1.0 / (want + 1e-6)],
        1e-7,
        0.0,
    );
    // Under the limit the gradients are left as they are.
    let (_, scale) = clip_grad_norm(&views, 2.0 * want).unwrap();
    assert_eq!(scale, 1.0);
    // A NaN anywhere makes the norm and the factor NaN, as torch's (no silent scale of 1).
    let mut poisoned = b.clone();
    poisoned[3] = f32::NAN;
    let views = [TensorView::contiguous(&poisoned[..], [7]).unwrap()];
    let (norm, scale) = clip_grad_norm(&views, 1.0).unwrap();
    assert!(norm.is_nan() && scale.is_nan(), "{norm} {scale}");
    let err = clip_grad_norm(&views, 0.0).unwrap_err();
    assert!(err.to_string().contains("`max_norm`"), "{err}");
}

/// The unnamed rows' embedding update and then the named rows' give the bits of the scatter's
/// table then AdamW (and the bf16 copy, the rounding of the new table), on fresh random tables
/// with repeated ids, onto a base or not, the moments already nonzero (step 3); each alone
/// leaves the other rows as they were in all four tensors.
#[test]
fn the_embedding_update_gives_the_bits_of_the_scatter_then_adamw() {
    let mut rng = rng("embedding_adamw");
    let (vocab, hidden, ids) = (13, 5, [4i64, 0, 4, 12, 7, 4, 0]);
    let named_rows = [0usize, 4, 7, 12];
    let config = AdamW::default();
    let f32s = |values: Vec<f64>| -> Vec<f32> { values.iter().map(|&x| x as f32).collect() };
    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    let rows_of = |x: &[f32], named: bool| -> Vec<u32> {
        (0..vocab)
            .filter(|r| named_rows.contains(r) == named)
            .flat_map(|r| bits(&x[r * hidden..(r + 1) * hidden]))
            .collect()
    };
    for onto in [false, true] {
        let n = vocab * hidden;
        let (param, m) = (f32s(signed(&mut rng, n)), f32s(signed(&mut rng, n)));
        let v = f32s(uniform(&mut rng, n, 0.0, 1.0));
        let copy: Vec<bf16> = f32s(signed(&mut rng, n))
            .iter()
            .map(|&x| bf16::from_f32(x))
            .collect();
        let grad_out = f32s(signed(&mut rng, ids.len() * hidden));
        let base = f32s(signed(&mut rng, n));
        let ids_view = TensorView::contiguous(&ids[..], [ids.len()]).unwrap();
        let grad_view = TensorView::contiguous(&grad_out[..], [ids.len(), hidden]).unwrap();
        let base_view = TensorView::contiguous(&base[..], [vocab, hidden]).unwrap();
        let base_view = onto.then_some(&base_view);
        let dims = [vocab, hidden];

        let mut table = vec![f32::NAN; n];
        let mut want = (param.clone(), m.clone(), v.clone());
        let mut table_view = TensorViewMut::contiguous(&mut table[..], dims).unwrap();
        crate::embedding::embedding_backward(&ids_view, &grad_view, base_view, &mut table_view)
            .unwrap();
        adamw(
            &mut TensorViewMut::contiguous(&mut want.0[..], dims).unwrap(),
            &TensorView::contiguous(&table[..], dims).unwrap(),
            &mut TensorViewMut::contiguous(&mut want.1[..], dims).unwrap(),
            &mut TensorViewMut::contiguous(&mut want.2[..], dims).unwrap(),
            (3, None),
            &config,
        )
        .unwrap();

        let mut got = (param.clone(), m.clone(), v.clone(), copy.clone());
        let update = |got: &mut (Vec<f32>, Vec<f32>, Vec<f32>, Vec<bf16>), rows| {
            let (mut row, mut named) = (vec![f32::NAN; hidden], vec![0xffu8; vocab.div_ceil(8)]);
            let state = TableState {
                param: &mut TensorViewMut::contiguous(&mut got.0[..], dims).unwrap(),
                m: &mut TensorViewMut::contiguous(&mut got.1[..], dims).unwrap(),
                v: &mut TensorViewMut::contiguous(&mut got.2[..], dims).unwrap(),
                copy: Some(&mut TensorViewMut::contiguous(&mut got.3[..], dims).unwrap()),
            };
            let scatter = Scatter {
                ids: &ids_view,
                grad_out: (rows == EmbeddingRows::Named).then_some(&grad_view),
                base: base_view,
            };
            let scratch = (
                &mut TensorViewMut::contiguous(&mut row[..], [hidden]).unwrap(),
                &mut named[..],
            );
            embedding_adamw(state, rows, scatter, scratch, 3, &config).unwrap();
        };
        update(&mut got, EmbeddingRows::Unnamed);
        let copy_bits = |c: &[bf16]| -> Vec<f32> { c.iter().map(|x| x.to_f32()).collect() };
        for (name, old, new) in [
            ("param", &param, &got.0),
            ("m", &m, &got.1),
            ("v", &v, &got.2),
        ] {
            assert_eq!(
                rows_of(new, true),
                rows_of(old, true),
                "{name}'s named rows, onto {onto}"
            );
            assert_ne!(
                rows_of(new, false),
                rows_of(old, false),
                "{name}'s other rows"
            );
        }
        let (old_copy, new_copy) = (copy_bits(&copy), copy_bits(&got.3));
        assert_eq!(
            rows_of(&new_copy, true),
            rows_of(&old_copy, true),
            "copy's named rows"
        );
        let after_unnamed = got.clone();
        update(&mut got, EmbeddingRows::Named);
        for (name, old, new) in [
            ("param", &after_unnamed.0, &got.0),
            ("m", &after_unnamed.1, &got.1),
        ] {
            assert_eq!(
                rows_of(new, false),
                rows_of(old, false),
                "{name}'s unnamed rows, onto {onto}"
            );
        }
        assert_eq!(bits(&got.0), bits(&want.0), "param, onto {onto}");
        assert_eq!(bits(&got.1), bits(&want.1), "m, onto {onto}");
        assert_eq!(bits(&got.2), bits(&want.2), "v, onto {onto}");
        let rounded: Vec<f32> = want.0.iter().map(|&p| bf16::from_f32(p).to_f32()).collect();
        assert_eq!(
            bits(&copy_bits(&got.3)),
            bits(&rounded),
            "copy, onto {onto}"
        );
        assert_ne!(bits(&got.0), bits(&table), "the update moved the table");
    }
}

#[test]
fn the_embedding_update_refuses_an_id_outside_the_table_or_named_rows_without_a_gradient() {
    let (mut p, mut m, mut v) = (vec![0.5f32; 6], vec![0f32; 6], vec![0f32; 6]);
    let (mut row, mut named) = ([0f32; 2], [0u8; 1]);
    let grad = [1f32; 2];
    let grad = TensorView::contiguous(&grad[..], [1, 2]).unwrap();
    for (rows, grad_out, wrong) in [
        (EmbeddingRows::Named, Some(&grad), "ids"),
        (EmbeddingRows::Unnamed, None, "ids"),
        (EmbeddingRows::Named, None, "grad_out"),
    ] {
        let ids = [if wrong == "ids" { 3i64 } else { 1 }];
        let state = TableState {
            param: &mut TensorViewMut::contiguous(&mut p[..], [3, 2]).unwrap(),
            m: &mut TensorViewMut::contiguous(&mut m[..], [3, 2]).unwrap(),
            v: &mut TensorViewMut::contiguous(&mut v[..], [3, 2]).unwrap(),
            copy: None,
        };
        let ids_view = TensorView::contiguous(&ids[..], [1]).unwrap();
        let scatter = Scatter {
            ids: &ids_view,
            grad_out,
            base: None,
        };
        let scratch = (
            &mut TensorViewMut::contiguous(&mut row[..], [2]).unwrap(),
            &mut named[..],
        );
        let err = embedding_adamw(state, rows, scatter, scratch, 1, &AdamW::default()).unwrap_err();
        assert!(err.to_string().contains(wrong), "{err}");
        assert_eq!(p, [0.5; 6], "nothing is written");
    }
}
