//! Tape autograd: accumulation rule, tied and shared leaves, diamonds, ready hooks, bound
//! gradient buffers and every rejection.

use std::cell::RefCell;
use std::rc::Rc;

use kiln_frontend::{ops, Error, Var};
use kiln_ir::DType;
use kiln_kernels::testing;
use kiln_runtime::{Device, Tensor};

fn leaf(values: Vec<f64>, dims: &[usize]) -> Var {
    Var::leaf(Tensor::from_vec(values, dims).unwrap()).unwrap()
}

fn leaf_f32(values: &[f64], dims: &[usize]) -> Var {
    Var::leaf(Tensor::from_vec(testing::to_f32(values), dims).unwrap()).unwrap()
}

fn constant(values: Vec<f64>, dims: &[usize]) -> Var {
    Var::constant(Tensor::from_vec(values, dims).unwrap())
}

fn grad_of(v: &Var) -> Vec<f64> {
    v.grad().expect("gradient").to_f64_vec().unwrap()
}

/// `Σ c_i · x_i`: a scalar whose gradient with respect to `x` is `c`.
fn weighted_sum(x: &Var, c: &Var) -> Var {
    ops::sum(&ops::mul(x, c).unwrap()).unwrap()
}

#[test]
fn leaf_used_twice_gets_both_contributions() {
    let mut rng = testing::rng("leaf_used_twice");
    let x_values = testing::signed(&mut rng, 7);
    let x = leaf(x_values.clone(), &[7]);
    // L = Σ x·x  →  dL/dx = 2x (two contributions through the two operands of mul).
    ops::sum(&ops::mul(&x, &x).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let want: Vec<f64> = x_values.iter().map(|v| 2.0 * v).collect();
    testing::assert_close("d(x·x)", &grad_of(&x), &want, 1e-15, 0.0);
}

#[test]
fn tied_weight_accumulates_and_is_ready_once() {
    let mut rng = testing::rng("tied_weight");
    let (vocab, hidden) = (5, 3);
    let w_values = testing::signed(&mut rng, vocab * hidden);
    let w = leaf(w_values.clone(), &[vocab, hidden]);
    let ids = Tensor::from_vec(vec![4i64, 0, 4, 2], [4]).unwrap();
    let fired = Rc::new(RefCell::new(Vec::<Vec<f64>>::new()));
    let record = fired.clone();
    w.on_grad_ready(move |g| record.borrow_mut().push(g.to_f64_vec().unwrap()))
        .unwrap();
    // Embedding and output head share `w`, as in a tied model.
    let c = constant(testing::signed(&mut rng, 4 * vocab), &[4, vocab]);
    let build = |w: &Var| {
        let h = ops::embedding(w, &ids).unwrap();
        let logits = ops::linear(&h, w, None, None).unwrap();
        weighted_sum(&logits, &c)
    };
    build(&w).backward().unwrap();
    assert_eq!(
        fired.borrow().len(),
        1,
        "hook fires once, not once per path"
    );
    assert_eq!(
        fired.borrow()[0],
        grad_of(&w),
        "hook sees the complete gradient"
    );

    let numeric = testing::central_difference(
        |p| {
            build(&leaf(p.to_vec(), &[vocab, hidden]))
                .value()
                .to_f64_vec()
                .unwrap()[0]
        },
        &w_values,
        1e-6,
    );
    testing::assert_close("tied grad", &grad_of(&w), &numeric, 1e-6, 1e-8);
}

#[test]
fn diamond_sums_both_branches() {
    let mut rng = testing::rng("diamond");
    let x = leaf(testing::signed(&mut rng, 6), &[2, 3]);
    let c1 = testing::signed(&mut rng, 6);
    let c2 = testing::signed(&mut rng, 6);
    // h = 3x is an intermediate with two consumers: its gradient is accumulated, not replaced.
    let h = ops::scale(&x, 3.0).unwrap();
    let a = ops::mul(&h, &constant(c1.clone(), &[2, 3])).unwrap();
    let b = ops::mul(&h, &constant(c2.clone(), &[2, 3])).unwrap();
    ops::sum(&ops::add(&a, &b).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let want: Vec<f64> = c1.iter().zip(&c2).map(|(p, q)| 3.0 * (p + q)).collect();
    testing::assert_close("diamond", &grad_of(&x), &want, 1e-15, 0.0);
}

#[test]
fn first_contribution_is_assigned_and_never_mutated() {
    let mut rng = testing::rng("first_contribution");
    let x = leaf(testing::signed(&mut rng, 4), &[4]);
    let y = leaf(testing::signed(&mut rng, 4), &[4]);
    let c = testing::signed(&mut rng, 4);
    let loss =
        |x: &Var, y: &Var| weighted_sum(&ops::add(x, y).unwrap(), &constant(c.clone(), &[4]));
    loss(&x, &y).backward().unwrap();
    // add hands one gradient tensor to both inputs: assigned as is, shared, no copy.
    let (gx, gy) = (x.grad().unwrap(), y.grad().unwrap());
    assert!(gx.storage().same(gy.storage()));
    assert_eq!(gx.to_f64_vec().unwrap(), c);
    // A second pass accumulates into x by allocating; y's gradient — the same tensor — and the
    // tensor we hold keep their values.
    ops::sum(&ops::scale(&x, 2.0).unwrap())
        .unwrap()
        .backward()
        .unwrap();
    let want: Vec<f64> = c.iter().map(|v| v + 2.0).collect();
    assert_eq!(grad_of(&x), want);
    assert_eq!(grad_of(&y), c);
    assert_eq!(gx.to_f64_vec().unwrap(), c);
    assert!(!x.grad().unwrap().storage().same(gx.storage()));
}

#[test]
fn hooks_fire_in_reverse_order_of_last_use() {
    let mut rng = testing::rng("hook_order");
    let order = Rc::new(RefCell::new(Vec::new()));
    let early = leaf(testing::signed(&mut rng, 3), &[3]);
    let late = leaf(testing::signed(&mut rng, 3), &[3]);
    let both = leaf(testing::signed(&mut rng, 3), &[3]);
    for (name, v) in [("early", &early), ("late", &late), ("both", &both)] {
        let order = order.clone();
        v.on_grad_ready(move |_| order.borrow_mut().push(name))
            .unwrap();
    }
    // early and both are used first; late and both again at the end.
    let h = ops::mul(&early, &both).unwrap();
    let h = ops::mul(&h, &late).unwrap();
    let h = ops::add(&h, &both).unwrap();
    ops::sum(&h).unwrap().backward().unwrap();
    // late is complete after the last mul; both only after the first mul, with early.
    assert_eq!(order.borrow().as_slice(), &["late", "early", "both"]);
    ops::sum(&h).unwrap().backward().unwrap();
    assert_eq!(
        order.borrow().len(),
        6,
        "each pass fires each hook exactly once"
    );
}

#[test]
fn leaf_reached_by_no_gradient_does_not_fire() {
    let x = leaf(vec![0.5, -1.5], &[2]);
    let fired = Rc::new(RefCell::new(0));
    let count = fired.clone();
    x.on_grad_ready(move |_| *count.borrow_mut() += 1).unwrap();
    // x feeds an op whose result is discarded; backward runs from an unrelated scalar.
    let y = leaf(vec![2.0, 3.0], &[2]);
    let _unused = ops::scale(&x, 2.0).unwrap();
    ops::sum(&y).unwrap().backward().unwrap();
    assert_eq!(*fired.borrow(), 0);
    assert!(x.grad().is_none());
}

#[test]
fn bound_buffer_accumulates_in_place_at_a_stable_address() {
    let mut rng = testing::rng("bound_buffer");
    let values = testing::signed(&mut rng, 6);
    let w = leaf_f32(&values, &[2, 3]);
    let buffer = Tensor::zeros([2, 3], DType::F32, Device::Cpu);
    let address = buffer.storage().address();
    w.bind_grad_buffer(buffer.clone()).unwrap();
    assert!(w.is_grad_bound());
    let c = testing::signed(&mut rng, 6);
    let c_var = Var::constant(Tensor::from_vec(testing::to_f32(&c), [2, 3]).unwrap());
    // Two paths through w: contributions c and 2c, added in place.
    let loss = || {
        let a = weighted_sum(&w, &c_var);
        let b = ops::scale(&weighted_sum(&w, &c_var), 2.0).unwrap();
        ops::add(&a, &b).unwrap()
    };
    loss().backward().unwrap();
    let grad = w.grad().unwrap();
    assert_eq!(grad.storage().address(), address);
    let want: Vec<f64> = c.iter().map(|v| 3.0 * (*v as f32) as f64).collect();
    testing::assert_close("bound", &grad.to_f64_vec().unwrap(), &want, 1e-6, 0.0);
    // The caller's handle sees the same memory.
    assert_eq!(buffer.to_f64_vec().unwrap(), grad.to_f64_vec().unwrap());
    // zero_grad keeps the address; a second pass starts from zero.
    w.zero_grad().unwrap();
    assert_eq!(w.grad().unwrap().storage().address(), address);
    assert!(buffer.to_f64_vec().unwrap().iter().all(|&v| v == 0.0));
    loss().backward().unwrap();
    assert_eq!(w.grad().unwrap().storage().address(), address);
    testing::assert_close(
        "after zero",
        &buffer.to_f64_vec().unwrap(),
        &want,
        1e-6,
        0.0,
    );
    // Unbinding hands the buffer back and leaves no gradient.
    let returned = w.unbind_grad_buffer().unwrap();
    assert_eq!(returned.storage().address(), address);
    assert!(w.grad().is_none() && !w.is_grad_bound());
}

#[test]
fn bind_grad_buffer_rejections() {
    let w = leaf_f32(&[0.1, 0.2, 0.3, 0.4], &[2, 2]);
    let f32_buffer = || Tensor::zeros([2, 2], DType::F32, Device::Cpu);

    // Non-leaf.
    let y = ops::scale(&w, 2.0).unwrap();
    assert!(matches!(
        y.bind_grad_buffer(f32_buffer()),
        Err(Error::NotLeaf {
            op: "bind_grad_buffer",
            producer: "scale"
        })
    ));
    // Wrong dtype, shape, layout.
    let err = w
        .bind_grad_buffer(Tensor::zeros([2, 2], DType::F64, Device::Cpu))
        .unwrap_err();
    assert!(err.to_string().contains("must be f32"), "{err}");
    let err = w
        .bind_grad_buffer(Tensor::zeros([4], DType::F32, Device::Cpu))
        .unwrap_err();
    assert!(err.to_string().contains("shape [4]"), "{err}");
    // Right shape, wrong layout: a transpose, and every second column of a wider matrix.
    let transposed = Tensor::zeros([2, 2], DType::F32, Device::Cpu)
        .transpose(0, 1)
        .unwrap();
    let every_second = Tensor::zeros([2, 4], DType::F32, Device::Cpu)
        .slice(1, 0, 4, 2)
        .unwrap();
    for buffer in [transposed, every_second] {
        let err = w.bind_grad_buffer(buffer).unwrap_err();
        assert!(err.to_string().contains("not contiguous"), "{err}");
    }
    // An f64 leaf cannot bind.
    let w64 = leaf(vec![1.0, 2.0], &[2]);
    let err = w64
        .bind_grad_buffer(Tensor::zeros([2], DType::F32, Device::Cpu))
        .unwrap_err();
    assert!(err.to_string().contains("only f32 leaves"), "{err}");
    // A leaf with a gradient would lose it.
    ops::sum(&w).unwrap().backward().unwrap();
    assert_eq!(
        w.bind_grad_buffer(f32_buffer()),
        Err(Error::GradientPresent)
    );
    w.zero_grad().unwrap();
    // Rebinding, replacing, unbinding twice.
    w.bind_grad_buffer(f32_buffer()).unwrap();
    assert_eq!(w.bind_grad_buffer(f32_buffer()), Err(Error::AlreadyBound));
    assert_eq!(w.set_grad(f32_buffer()), Err(Error::ReplaceBound));
    w.unbind_grad_buffer().unwrap();
    assert_eq!(w.unbind_grad_buffer().err(), Some(Error::NotBound));
    // Unbound again: set_grad works, with a gradient of the right type only.
    w.set_grad(f32_buffer()).unwrap();
    assert!(w
        .set_grad(Tensor::zeros([3], DType::F32, Device::Cpu))
        .is_err());
}

#[test]
fn backward_rejections() {
    let c = constant(vec![1.0], &[1]);
    assert_eq!(ops::sum(&c).unwrap().backward(), Err(Error::NoGradient));
    let x = leaf(vec![1.0, 2.0], &[2]);
    let y = ops::scale(&x, 2.0).unwrap();
    assert!(matches!(y.backward(), Err(Error::NotScalar { .. })));
    let err = y
        .backward_with(Tensor::zeros([3], DType::F64, Device::Cpu))
        .unwrap_err();
    assert!(matches!(err, Error::Seed { .. }), "{err}");
    assert!(matches!(
        Var::leaf(Tensor::from_vec(vec![1i64], [1]).unwrap()),
        Err(Error::NotDifferentiable { dtype: DType::I64 })
    ));
}
