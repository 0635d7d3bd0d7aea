//! Tests of `safetensors_io`'s file conversions: float widening is exact and narrowing rounds
//! once to nearest even (as `kiln_kernels::Element::from_f64`, whose rounding is tested beside
//! it), integers narrow only when they fit, float ↔ integer and unread dtypes are refused, and
//! converted writes round like reads.

use half::{bf16, f16};
use kiln_kernels::testing::rng;
use kiln_kernels::{Buffer, Element};
use rand::Rng;

use super::tests::{assert_contains, raw_file};
use super::*;

#[test]
fn floats_widen_exactly_and_narrow_to_nearest_even() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("floats_widen_exactly_and_narrow_to_nearest_even");
    let f64s: Vec<f64> = (0..64).map(|_| rng.random_range(-4.0..4.0)).collect();
    let f32s: Vec<f32> = f64s.iter().map(|&x| x as f32).collect();
    let bf16s: Vec<bf16> = f32s.iter().map(|&x| bf16::from_f32(x)).collect();
    let path = dir.path().join("floats.safetensors");
    let tensor = |values| Tensor::from_buffer(values, [64]).unwrap();
    write_safetensors(
        &path,
        &[
            ("f64".into(), tensor(Buffer::F64(f64s.clone()))),
            ("f32".into(), tensor(Buffer::F32(f32s.clone()))),
            ("bf16".into(), tensor(Buffer::BF16(bf16s.clone()))),
        ],
        None,
    )
    .unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    let read = |name, dtype| file.tensor(name, dtype).unwrap().to_f64_vec().unwrap();
    let widen = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    assert_eq!(read("f32", DType::F64), widen(&f32s));
    assert_eq!(
        read("f64", DType::F32),
        widen(&f32s),
        "f64 → f32 rounds like `as`"
    );
    assert_eq!(
        read("bf16", DType::F32),
        bf16s.iter().map(|x| x.to_f64()).collect::<Vec<_>>()
    );
    assert_eq!(read("f32", DType::BF16), read("bf16", DType::F64));
    let f16_of = |x: f32| f16::from_f32(x).to_f64();
    assert_eq!(
        read("f32", DType::F16),
        f32s.iter().map(|&x| f16_of(x)).collect::<Vec<_>>()
    );
    assert_eq!(
        read("bf16", DType::F16),
        bf16s.iter().map(|x| f16_of(x.to_f32())).collect::<Vec<_>>()
    );
}

/// Values just above a bf16 tie (1 + 2^-8) and an f16 tie (1 + 2^-11), by less than f64's upper
/// 32 mantissa bits hold (f64) or by one f32 ulp (f32): narrowing, read or written, rounds them
/// up, not to 1.
#[test]
fn narrowing_rounds_just_above_a_tie_up() {
    let dir = tempfile::tempdir().unwrap();
    let f64s = vec![
        1.0 + 2f64.powi(-8) + 2f64.powi(-40),
        1.0 + 2f64.powi(-11) + 2f64.powi(-40),
    ];
    let f32s = vec![
        1.0f32 + 2f32.powi(-8) + 2f32.powi(-23),
        1.0 + 2f32.powi(-11) + 2f32.powi(-23),
    ];
    let tensors = [
        ("f64".to_string(), Tensor::from_vec(f64s, [2]).unwrap()),
        ("f32".to_string(), Tensor::from_vec(f32s, [2]).unwrap()),
    ];
    let (up_bf16, up_f16) = (1.0 + 2f64.powi(-7), 1.0 + 2f64.powi(-10));

    let path = dir.path().join("above_tie.safetensors");
    write_safetensors(&path, &tensors, None).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    let read = |file: &SafetensorsFile, name, dtype| {
        file.tensor(name, dtype).unwrap().to_f64_vec().unwrap()
    };
    for name in ["f64", "f32"] {
        assert_eq!(read(&file, name, DType::BF16)[0], up_bf16, "{name} → bf16");
        assert_eq!(read(&file, name, DType::F16)[1], up_f16, "{name} → f16");
    }

    for (dtype, index, up) in [(DType::BF16, 0, up_bf16), (DType::F16, 1, up_f16)] {
        let path = dir.path().join(format!("above_tie_{dtype}.safetensors"));
        write_safetensors_as(&path, &tensors, dtype, None).unwrap();
        let file = SafetensorsFile::open(&path).unwrap();
        for name in ["f64", "f32"] {
            assert_eq!(
                read(&file, name, DType::F64)[index],
                up,
                "{name} written as {dtype}"
            );
        }
    }
}

#[test]
fn integers_widen_and_narrow_only_when_they_fit() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("integers_widen_and_narrow_only_when_they_fit");
    let small: Vec<i64> = (0..9)
        .map(|_| rng.random_range(-1_000_000..1_000_000))
        .collect();
    let i32s: Vec<i32> = (0..5).map(|_| rng.random()).collect();
    let mut big = small.clone();
    big[4] = i32::MAX as i64 + 1 + rng.random_range(0..1000);
    let path = dir.path().join("ints.safetensors");
    write_safetensors(
        &path,
        &[
            (
                "small".into(),
                Tensor::from_vec(small.clone(), [9]).unwrap(),
            ),
            ("big".into(), Tensor::from_vec(big.clone(), [9]).unwrap()),
            ("i32".into(), Tensor::from_vec(i32s.clone(), [5]).unwrap()),
        ],
        None,
    )
    .unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    let narrowed = file
        .tensor("small", DType::I32)
        .unwrap()
        .to_vec::<i32>()
        .unwrap();
    assert_eq!(
        narrowed.iter().map(|&x| x as i64).collect::<Vec<_>>(),
        small
    );
    let widened = file
        .tensor("i32", DType::I64)
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    assert_eq!(widened, i32s.iter().map(|&x| x as i64).collect::<Vec<_>>());

    let err = file.tensor("big", DType::I32).unwrap_err();
    assert!(matches!(err, Error::TensorDType { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &["`big`", &format!("element 4 = {}", big[4]), "i32"],
    );
}

#[test]
fn float_integer_and_unsupported_conversions_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mixed.safetensors");
    write_safetensors(
        &path,
        &[
            ("ids".into(), Tensor::from_vec(vec![1i64, 2], [2]).unwrap()),
            (
                "w".into(),
                Tensor::from_vec(vec![0.5f32, 1.5], [2]).unwrap(),
            ),
        ],
        None,
    )
    .unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    for (name, dtype, parts) in [
        ("ids", DType::F32, ["`ids`", "I64", "a float dtype"]),
        ("w", DType::I64, ["`w`", "F32", "an integer dtype"]),
    ] {
        let err = file.tensor(name, dtype).unwrap_err();
        assert!(matches!(err, Error::TensorDType { .. }), "{err:?}");
        assert_contains(&err.to_string(), &parts);
    }
    let err = file.tensor("nope", DType::F32).unwrap_err();
    assert!(matches!(err, Error::Safetensors { .. }), "{err:?}");
    assert_contains(&err.to_string(), &["no tensor named `nope`"]);

    // A valid file in a dtype kiln does not read.
    let header = r#"{"q":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    let path = raw_file(dir.path(), header, &[1, 2]);
    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(file.info("q"), Some((safetensors::Dtype::U8, vec![2])));
    let err = file.tensor("q", DType::I32).unwrap_err();
    assert!(matches!(err, Error::TensorDType { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &["`q`", "U8", "F32, F64, BF16, F16, I32, I64"],
    );
}

#[test]
fn converted_writes_round_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("converted_writes_round_once");
    let f64s: Vec<f64> = (0..50).map(|_| rng.random_range(-2.0..2.0)).collect();
    let f32s: Vec<f32> = f64s.iter().map(|&x| x as f32).collect();
    let path = dir.path().join("bf16.safetensors");
    let tensors = [
        (
            "a".to_string(),
            Tensor::from_vec(f64s.clone(), [5, 10]).unwrap(),
        ),
        (
            "b".to_string(),
            Tensor::from_vec(f32s.clone(), [50])
                .unwrap()
                .reshape([10, 5])
                .unwrap()
                .transpose(0, 1)
                .unwrap(),
        ),
    ];
    write_safetensors_as(&path, &tensors, DType::BF16, None).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    assert_eq!(
        file.info("a"),
        Some((safetensors::Dtype::BF16, vec![5, 10]))
    );
    let a = file
        .tensor("a", DType::BF16)
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
    let want: Vec<bf16> = f64s
        .iter()
        .map(|&x| <bf16 as Element>::from_f64(x))
        .collect();
    assert_eq!(a, want);
    let b = file
        .tensor("b", DType::BF16)
        .unwrap()
        .to_vec::<bf16>()
        .unwrap();
    let b_want: Vec<bf16> = tensors[1]
        .1
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    assert_eq!(b, b_want);

    let ids = [(
        "ids".to_string(),
        Tensor::from_vec(vec![1i32], [1]).unwrap(),
    )];
    let err = write_safetensors_as(&dir.path().join("x"), &ids, DType::F32, None).unwrap_err();
    assert!(matches!(err, Error::TensorDType { .. }), "{err:?}");
    assert_contains(&err.to_string(), &["`ids`", "i32"]);
}
