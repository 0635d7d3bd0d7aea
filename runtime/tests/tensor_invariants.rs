//! Tensor N0 invariants (DESIGN.md), one test per invariant, rejections as errors.

use kiln_ir::{DType, LayoutError, Shape};
use kiln_kernels::testing;
use kiln_runtime::{Device, Error, Tensor};

fn random_tensor(rng: &mut rand::rngs::StdRng, dims: &[usize]) -> (Tensor, Vec<f64>) {
    let n = dims.iter().product();
    let values = testing::signed(rng, n);
    (Tensor::from_vec(values.clone(), dims).unwrap(), values)
}

#[test]
fn scalar_has_one_element() {
    let t = Tensor::scalar(2.5, DType::F32);
    assert_eq!(t.shape(), &Shape::scalar());
    assert_eq!(t.numel(), 1);
    assert_eq!(t.to_vec::<f32>().unwrap(), [2.5]);
    let r = t.reshape([1, 1]).unwrap();
    assert_eq!(r.to_vec::<f32>().unwrap(), [2.5]);
    assert!(matches!(
        Tensor::from_vec(vec![1.0f32, 2.0], Shape::scalar()),
        Err(Error::DataLength {
            numel: 1,
            len: 2,
            ..
        })
    ));
}

#[test]
fn zero_sized_dims_are_valid() {
    let t = Tensor::zeros([3, 0, 2], DType::F64, Device::Cpu);
    assert_eq!(t.numel(), 0);
    assert!(t.to_vec::<f64>().unwrap().is_empty());
    assert_eq!(t.transpose(0, 2).unwrap().dims(), &[2, 0, 3]);
    assert_eq!(t.reshape([0, 5]).unwrap().dims(), &[0, 5]);
    assert_eq!(t.slice(0, 1, 1, 1).unwrap().dims(), &[0, 0, 2]);
    assert_eq!(t.contiguous().unwrap().numel(), 0);
}

#[test]
fn negative_dims_strides_and_offsets_are_rejected() {
    let t = Tensor::from_vec(vec![0f32; 6], [6]).unwrap();
    let err = t.as_strided(&[2, -3], &[3, 1], 0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape(kiln_ir::Error::NegativeDim { axis: 1, value: -3 })
        ),
        "{err}"
    );
    let err = t.as_strided(&[2, 3], &[3, -1], 0).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Shape(kiln_ir::Error::NegativeStride { axis: 1, value: -1 })
        ),
        "{err}"
    );
    let err = t.as_strided(&[2, 3], &[3, 1], -1).unwrap_err();
    assert_eq!(err, Error::NegativeOffset { offset: -1 });
    assert!(t.as_strided(&[2, 3], &[3], 0).is_err());
}

#[test]
fn offsets_and_strides_count_elements() {
    let mut rng = testing::rng("offsets_and_strides_count_elements");
    let (t, values) = random_tensor(&mut rng, &[4, 5]);
    // Column 2 of every second row: offset 2, stride 10 (elements, not bytes).
    let col = t.as_strided(&[2], &[10], 2).unwrap();
    assert_eq!(col.to_vec::<f64>().unwrap(), [values[2], values[12]]);
}

#[test]
fn views_must_lie_inside_their_storage() {
    let t = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], [2, 3]).unwrap();
    assert!(t.as_strided(&[2, 3], &[3, 1], 0).is_ok());
    let err = t.as_strided(&[2, 3], &[3, 1], 1).unwrap_err();
    let out_of_bounds = |err: &Error| matches!(err, Error::Layout(LayoutError::OutOfBounds { .. }));
    assert!(out_of_bounds(&err), "{err}");
    let err = t.as_strided(&[3, 3], &[3, 1], 0).unwrap_err();
    assert!(out_of_bounds(&err), "{err}");
    // An empty view may sit at the very end, not past it.
    assert!(t.as_strided(&[0], &[1], 6).is_ok());
    assert!(t.as_strided(&[0], &[1], 7).is_err());
}

#[test]
fn reshape_is_zero_copy_and_needs_contiguous_input() {
    let mut rng = testing::rng("reshape_is_zero_copy");
    let (t, values) = random_tensor(&mut rng, &[2, 3, 4]);
    let r = t.reshape([6, 4]).unwrap();
    assert!(r.storage().same(t.storage()));
    assert_eq!(r.to_vec::<f64>().unwrap(), values);
    let err = t.reshape([5, 5]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "reshape: cannot view [2,3,4] (24 elements) as [5,5] (25 elements)"
    );
    let transposed = t.transpose(1, 2).unwrap();
    let err = transposed.reshape([24]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Layout(LayoutError::NotContiguous { op: "reshape", .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("contiguous()"));
}

#[test]
fn transpose_is_zero_copy() {
    let mut rng = testing::rng("transpose_is_zero_copy");
    let (t, values) = random_tensor(&mut rng, &[3, 5]);
    let tt = t.transpose(0, 1).unwrap();
    assert!(tt.storage().same(t.storage()));
    assert_eq!(tt.dims(), &[5, 3]);
    assert_eq!(tt.strides(), &[1, 5]);
    let got = tt.to_vec::<f64>().unwrap();
    for i in 0..5 {
        for j in 0..3 {
            assert_eq!(got[i * 3 + j], values[j * 5 + i]);
        }
    }
    assert!(matches!(
        t.transpose(0, 2),
        Err(Error::Layout(LayoutError::Axis {
            axis: 2,
            rank: 2,
            ..
        }))
    ));
}

#[test]
fn positive_step_slice_is_zero_copy() {
    let mut rng = testing::rng("positive_step_slice_is_zero_copy");
    let (t, values) = random_tensor(&mut rng, &[4, 7]);
    let s = t.slice(1, 1, 7, 2).unwrap(); // columns 1, 3, 5
    assert!(s.storage().same(t.storage()));
    assert_eq!(s.dims(), &[4, 3]);
    let got = s.to_vec::<f64>().unwrap();
    for r in 0..4 {
        for (c, col) in [1, 3, 5].into_iter().enumerate() {
            assert_eq!(got[r * 3 + c], values[r * 7 + col]);
        }
    }
    assert!(matches!(
        t.slice(1, 0, 7, 0),
        Err(Error::Layout(LayoutError::Slice { step: 0, .. }))
    ));
    assert!(matches!(
        t.slice(1, 5, 3, 1),
        Err(Error::Layout(LayoutError::Slice { .. }))
    ));
    assert!(matches!(
        t.slice(1, 0, 8, 1),
        Err(Error::Layout(LayoutError::Slice { size: 7, .. }))
    ));
    assert!(matches!(
        t.slice(2, 0, 1, 1),
        Err(Error::Layout(LayoutError::Axis { .. }))
    ));
}

#[test]
fn contiguous_materializes_views_only() {
    let mut rng = testing::rng("contiguous_materializes_views_only");
    let (t, _) = random_tensor(&mut rng, &[3, 4]);
    let same = t.contiguous().unwrap();
    assert!(same.storage().same(t.storage()));
    let tt = t.transpose(0, 1).unwrap();
    let dense = tt.contiguous().unwrap();
    assert!(!dense.storage().same(t.storage()));
    assert!(dense.is_contiguous());
    assert_eq!(dense.to_vec::<f64>().unwrap(), tt.to_vec::<f64>().unwrap());
    // The copy is independent of the original.
    dense.fill(7.0).unwrap();
    assert_ne!(t.to_vec::<f64>().unwrap()[1], 7.0);
}

#[test]
fn dtype_mismatch_and_aliasing_are_errors() {
    let t = Tensor::from_vec(vec![1i32, 2, 3], [3]).unwrap();
    assert!(matches!(
        t.to_vec::<f32>(),
        Err(Error::DType {
            expected: DType::F32,
            got: DType::I32,
            ..
        })
    ));
    // Writing a storage while reading it (an output aliasing an input) is refused, not a deadlock.
    let err = t.read_with(|_| t.write_with(|_| ()).unwrap_err()).unwrap();
    assert!(matches!(err, Error::Busy { .. }));
}
