//! Tests of `safetensors_io`: bit-exact round trips of every dtype, deterministic aligned
//! output, interoperability with the `safetensors` crate, and unaligned data. Conversions and
//! refusals have their own files.

use std::fs;
use std::path::{Path, PathBuf};

use half::{bf16, f16};
use kiln_kernels::testing::rng;
use rand::rngs::StdRng;
use rand::Rng;

use super::*;

// --- helpers (shared with the conversion and rejection tests) ---

/// A file of the 8-byte header length, `header`, then `data`.
pub(super) fn raw_file(dir: &Path, header: &str, data: &[u8]) -> PathBuf {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    let path = dir.join("raw.safetensors");
    fs::write(&path, bytes).unwrap();
    path
}

/// The message of the `Safetensors` error opening `path` gives; checks it names the path.
pub(super) fn malformed(path: &Path) -> String {
    match SafetensorsFile::open(path) {
        Err(e @ Error::Safetensors { .. }) => {
            let message = e.to_string();
            assert!(
                message.starts_with(&path.display().to_string()),
                "{message}"
            );
            message
        }
        other => panic!("expected a Safetensors error, got {other:?}"),
    }
}

pub(super) fn assert_contains(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(
            message.contains(part),
            "`{message}` should contain `{part}`"
        );
    }
}

/// Random bit patterns (NaNs and infinities included: the round trip must keep every bit).
fn random_bits<T>(rng: &mut StdRng, len: usize, from_bits: impl Fn(u64) -> T) -> Vec<T> {
    (0..len).map(|_| from_bits(rng.random::<u64>())).collect()
}

/// The bit patterns of a tensor, whatever its dtype.
fn bits_of(tensor: &Tensor) -> Vec<u64> {
    match tensor.dtype() {
        DType::F32 => tensor
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        DType::F64 => tensor
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        DType::BF16 => tensor
            .to_vec::<bf16>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        DType::F16 => tensor
            .to_vec::<f16>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        DType::I32 => tensor
            .to_vec::<i32>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
        DType::I64 => tensor
            .to_vec::<i64>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
    }
}

/// One tensor of each dtype, a scalar, a zero-sized one, a transposed (non-contiguous) one and
/// one longer than a write chunk.
fn sample_tensors(rng: &mut StdRng) -> Vec<(String, Tensor)> {
    let f32s = random_bits(rng, 12, |b| f32::from_bits(b as u32));
    vec![
        ("f32".into(), Tensor::from_vec(f32s, [3, 4]).unwrap()),
        (
            "f64".into(),
            Tensor::from_vec(random_bits(rng, 5, f64::from_bits), [5]).unwrap(),
        ),
        (
            "bf16".into(),
            Tensor::from_vec(random_bits(rng, 6, |b| bf16::from_bits(b as u16)), [2, 3]).unwrap(),
        ),
        (
            "f16".into(),
            Tensor::from_vec(random_bits(rng, 8, |b| f16::from_bits(b as u16)), [2, 2, 2]).unwrap(),
        ),
        (
            "i32".into(),
            Tensor::from_vec(random_bits(rng, 7, |b| b as i32), [7]).unwrap(),
        ),
        (
            "i64".into(),
            Tensor::from_vec(random_bits(rng, 3, |b| b as i64), [1, 3]).unwrap(),
        ),
        (
            "scalar".into(),
            Tensor::from_vec(vec![rng.random::<f32>()], Vec::<usize>::new()).unwrap(),
        ),
        (
            "empty".into(),
            Tensor::from_vec(Vec::<f32>::new(), [0, 3]).unwrap(),
        ),
        (
            "transposed".into(),
            Tensor::from_vec(random_bits(rng, 6, |b| b as i64), [2, 3])
                .unwrap()
                .transpose(0, 1)
                .unwrap(),
        ),
        (
            "long".into(),
            Tensor::from_vec(
                random_bits(rng, 3 << 16, |b| bf16::from_bits(b as u16)),
                [3, 1 << 16],
            )
            .unwrap(),
        ),
    ]
}

fn stored_dtype(dtype: DType) -> safetensors::Dtype {
    use safetensors::Dtype as S;
    match dtype {
        DType::F32 => S::F32,
        DType::F64 => S::F64,
        DType::BF16 => S::BF16,
        DType::F16 => S::F16,
        DType::I32 => S::I32,
        DType::I64 => S::I64,
    }
}

// --- round trips ---

#[test]
fn round_trip_keeps_every_bit_of_every_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("all.safetensors");
    let tensors = sample_tensors(&mut rng("round_trip_keeps_every_bit_of_every_dtype"));
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors(&path, &tensors, Some(metadata.clone())).unwrap();

    let file = SafetensorsFile::open(&path).unwrap();
    let mut names: Vec<String> = tensors.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    assert_eq!(file.names(), names);
    assert_eq!(file.metadata(), &metadata);
    for (name, tensor) in &tensors {
        assert_eq!(
            file.info(name),
            Some((stored_dtype(tensor.dtype()), tensor.dims().to_vec()))
        );
        let read = file.tensor(name, tensor.dtype()).unwrap();
        assert!(read.is_contiguous());
        assert_eq!(read.dims(), tensor.dims(), "{name}");
        assert_eq!(bits_of(&read), bits_of(tensor), "{name}");
    }
}

#[test]
fn written_files_are_deterministic_aligned_and_read_by_the_safetensors_crate() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = sample_tensors(&mut rng("written_files_are_deterministic"));
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    let mut reversed = tensors.clone();
    reversed.reverse();
    write_safetensors(&a, &tensors, None).unwrap();
    write_safetensors(&b, &reversed, None).unwrap();
    let bytes = fs::read(&a).unwrap();
    assert_eq!(bytes, fs::read(&b).unwrap(), "input order must not matter");

    let parsed = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    assert_eq!(header_len % 8, 0, "data section must start 8-aligned");
    for (name, tensor) in &tensors {
        let view = parsed.tensor(name).unwrap();
        assert_eq!(view.shape(), tensor.dims());
        let offset = view.data().as_ptr() as usize - bytes.as_ptr() as usize - 8 - header_len;
        assert_eq!(
            offset % tensor.dtype().size_bytes(),
            0,
            "{name} is misaligned"
        );
    }
}

#[test]
fn reads_files_the_safetensors_crate_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("reads_files_the_safetensors_crate_wrote");
    let values: Vec<f32> = (0..6).map(|_| rng.random_range(-1.0..1.0)).collect();
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view =
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![2, 3], &bytes).unwrap();
    let path = dir.path().join("crate.safetensors");
    fs::write(&path, safetensors::serialize([("w", view)], None).unwrap()).unwrap();
    let read = SafetensorsFile::open(&path)
        .unwrap()
        .tensor("w", DType::F32)
        .unwrap();
    assert_eq!(read.to_vec::<f32>().unwrap(), values);
}

#[test]
fn reads_data_at_an_odd_address() {
    // A 9-byte header puts the data section at byte 17 of the file (and of the map).
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("reads_data_at_an_odd_address");
    let values: Vec<f64> = (0..3).map(|_| rng.random_range(-1e3..1e3)).collect();
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let header = r#"{"x":{"dtype":"F64","shape":[3],"data_offsets":[0,24]}}"#;
    let header = format!("{header:<65}");
    assert_eq!((8 + header.len()) % 2, 1);
    let path = raw_file(dir.path(), &header, &data);
    let read = SafetensorsFile::open(&path)
        .unwrap()
        .tensor("x", DType::F64)
        .unwrap();
    assert_eq!(read.to_vec::<f64>().unwrap(), values);
}

/// A part of one dim read from the file equals that slice of the whole tensor read, for every
/// dim of a 3-D tensor, stored bf16 and read as f32 or bf16; a part past the dim is refused.
#[test]
fn a_tensors_part_is_the_slice_of_the_whole_tensor() {
    let mut rng = rng("a_tensors_part_is_the_slice_of_the_whole_tensor");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("part.safetensors");
    let dims = [3, 4, 5];
    let values: Vec<f32> = (0..60).map(|_| rng.random_range(-2.0..2.0)).collect();
    let stored = Tensor::from_vec(values, dims)
        .unwrap()
        .cast_to(DType::BF16)
        .unwrap();
    write_safetensors(&path, &[("t".to_string(), stored)], None).unwrap();
    let file = SafetensorsFile::open(&path).unwrap();
    for dtype in [DType::F32, DType::BF16] {
        let whole = file.tensor("t", dtype).unwrap();
        for (axis, start, end) in [(0, 1, 3), (1, 2, 4), (2, 0, 5), (2, 3, 3)] {
            let part = file.tensor_part("t", dtype, (axis, start, end)).unwrap();
            let want = whole
                .slice(axis, start, end, 1)
                .unwrap()
                .contiguous()
                .unwrap();
            assert_eq!(part.dims(), want.dims(), "{dtype} {axis} {start}..{end}");
            let bits = |t: &Tensor| -> Vec<u32> {
                let wide = t.cast_to(DType::F32).unwrap().to_vec::<f32>().unwrap();
                wide.iter().map(|x| x.to_bits()).collect()
            };
            assert_eq!(bits(&part), bits(&want), "{dtype} {axis} {start}..{end}");
        }
    }
    for part in [(1, 3, 5), (3, 0, 1), (0, 2, 1)] {
        let Err(err) = file.tensor_part("t", DType::F32, part) else {
            panic!("{part:?} should be refused");
        };
        assert_contains(&err.to_string(), &["tensor `t`", "has no part"]);
    }
}
