//! Tests of `data`: the three file kinds, every refusal, the split and both samplings.

use std::collections::BTreeMap;

use kiln_frontend::hf::safetensors_io::write_safetensors;
use kiln_runtime::Tensor;

use super::*;

fn flat_u16(dir: &Path, name: &str, ids: &[u16]) -> PathBuf {
    let path = dir.join(name);
    let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
    std::fs::write(&path, bytes).unwrap();
    path
}

fn counting(n: usize, vocab: usize) -> Vec<u16> {
    (0..n).map(|i| ((i * 7 + i / 5) % vocab) as u16).collect()
}

#[test]
fn reads_flat_u16_u32_and_safetensors_tokens_alike() {
    let dir = tempfile::tempdir().unwrap();
    let ids = counting(1000, 97);
    let u16_path = flat_u16(dir.path(), "a.bin", &ids);
    let u32_path = dir.path().join("b.bin");
    let bytes: Vec<u8> = ids
        .iter()
        .flat_map(|&id| u32::from(id).to_le_bytes())
        .collect();
    std::fs::write(&u32_path, bytes).unwrap();
    let st_path = dir.path().join("c.safetensors");
    let wide: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
    let tensor = Tensor::from_vec(wide, [10, 100]).unwrap();
    write_safetensors(&st_path, &[("tokens".into(), tensor)], None).unwrap();
    let want: Vec<i64> = ids.iter().map(|&id| i64::from(id)).collect();
    for (path, raw, dtype) in [
        (&u16_path, None, TokenDType::U16),
        (&u32_path, Some(TokenDType::U32), TokenDType::U32),
        (&st_path, None, TokenDType::I64),
    ] {
        let data = TokenData::open(path, raw, 97).unwrap();
        assert_eq!(data.dtype(), dtype);
        let got: Vec<i64> = (0..data.len()).map(|i| data.get(i)).collect();
        assert_eq!(got, want, "{}", path.display());
    }
    // Files of the same ids share a fingerprint; other ids do not.
    let a = TokenData::open(&u16_path, None, 97).unwrap().fingerprint();
    let b = TokenData::open(&u32_path, Some(TokenDType::U32), 97)
        .unwrap()
        .fingerprint();
    assert_eq!(a, b);
    let mut other = ids.clone();
    other[500] = (other[500] + 1) % 97;
    let c = flat_u16(dir.path(), "d.bin", &other);
    assert_ne!(TokenData::open(&c, None, 97).unwrap().fingerprint(), a);
}

#[test]
fn refuses_bad_files_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let refused = |path: &Path, raw, vocab| {
        let err = TokenData::open(path, raw, vocab).err().expect("refused");
        let message = err.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        message
    };
    // An id outside the vocabulary, with where it is.
    let mut ids = counting(300, 97);
    ids[123] = 97;
    let path = flat_u16(dir.path(), "vocab.bin", &ids);
    let message = refused(&path, None, 97);
    assert!(message.contains("token 123 is 97"), "{message}");
    // A size that is no whole number of ids.
    let path = dir.path().join("odd.bin");
    std::fs::write(&path, [1u8, 0, 2, 0, 3, 0, 4]).unwrap();
    assert!(refused(&path, None, 97).contains("7 bytes"));
    // Six bytes are no whole number of u32 ids.
    let path = dir.path().join("short.bin");
    std::fs::write(&path, [1u8, 0, 0, 0, 2, 0]).unwrap();
    assert!(refused(&path, Some(TokenDType::U32), 97).contains("u32"));
    // A safetensors file without tokens, or with float tokens.
    let path = dir.path().join("none.safetensors");
    let other = Tensor::from_vec(vec![1i64, 2], [2]).unwrap();
    write_safetensors(&path, &[("ids".into(), other)], None).unwrap();
    assert!(refused(&path, None, 97).contains("no tensor `tokens` (it holds: ids)"));
    let path = dir.path().join("float.safetensors");
    let floats = Tensor::from_vec(vec![1f32, 2.0], [2]).unwrap();
    write_safetensors(&path, &[("tokens".into(), floats)], None).unwrap();
    assert!(refused(&path, None, 97).contains("F32"));
    // A missing file.
    assert!(refused(&dir.path().join("absent.bin"), None, 97).contains("No such file"));
}

#[test]
fn splits_hold_a_window_or_say_how_short_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let data =
        TokenData::open(&flat_u16(dir.path(), "a.bin", &counting(100, 97)), None, 97).unwrap();
    let split = data.split(8, 0.1).unwrap();
    assert_eq!((split.train, split.val), (0..90, 90..100));
    assert_eq!(data.split(8, 0.0).unwrap().val, 100..100);
    let err = data.split(10, 0.1).unwrap_err().to_string();
    assert!(
        err.contains("validation split holds 10") && err.contains("11"),
        "{err}"
    );
    let err = data.split(100, 0.0).unwrap_err().to_string();
    assert!(
        err.contains("training split holds 100") && err.contains("101"),
        "{err}"
    );
    assert!(data
        .split(8, 1.0)
        .unwrap_err()
        .to_string()
        .contains("--val-fraction"));
}

#[test]
fn random_windows_are_a_function_of_seed_and_step_inside_their_range() {
    let dir = tempfile::tempdir().unwrap();
    // Ids of no period, so each window of 17 appears once in the file.
    let mut state = 12345u64;
    let ids: Vec<u16> = (0..5000)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % 97) as u16
        })
        .collect();
    let data = TokenData::open(&flat_u16(dir.path(), "a.bin", &ids), None, 97).unwrap();
    let range = 100..4000;
    let draw = |seed, stream| data.windows(&range, (4, 16), (Sampling::Random, seed), stream);
    let first = draw(3, Stream::Train { batch: 6 });
    assert_eq!(first, draw(3, Stream::Train { batch: 6 }));
    assert_ne!(first, draw(3, Stream::Train { batch: 7 }));
    assert_ne!(first, draw(4, Stream::Train { batch: 6 }));
    assert_ne!(first, draw(3, Stream::Validation { batch: 7 }));
    // Every row is a run of consecutive ids of the file inside the range.
    let mut starts = BTreeMap::new();
    for step in 1..200 {
        for row in draw(3, Stream::Train { batch: step }).chunks(17) {
            let start = (range.start..=range.end - 17)
                .find(|&s| (0..17).all(|k| i64::from(ids[s + k]) == row[k]))
                .expect("a window of the range");
            *starts.entry(start / 1000).or_insert(0) += 1;
        }
    }
    // Starts spread over the whole range, not one end of it.
    assert_eq!(starts.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
}

#[test]
fn sequential_windows_follow_llm_c_and_wrap() {
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<u16> = (0..50).collect();
    let data = TokenData::open(&flat_u16(dir.path(), "a.bin", &ids), None, 97).unwrap();
    let range = 0..50;
    let batch = |step: u64| {
        let stream = Stream::Train { batch: step - 1 };
        data.windows(&range, (2, 5), (Sampling::Sequential, 0), stream)
    };
    let rows =
        |first: i64| -> Vec<i64> { (first..first + 6).chain(first + 5..first + 11).collect() };
    assert_eq!(batch(1), rows(0));
    assert_eq!(batch(2), rows(10));
    // 49 ids after the first hold 4 batches of 10; the fifth starts over.
    assert_eq!(batch(4), rows(30));
    assert_eq!(batch(5), rows(0));
    let split = data.split(5, 0.0).unwrap();
    assert!(Sampling::Sequential.check(&data, &split, (2, 1, 5)).is_ok());
    let err = Sampling::Sequential
        .check(&data, &split, (10, 1, 5))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--batch 10 × --seq 5 + 1 = 51"), "{err}");
    // Data-parallel steps take every rank's rows; validation one rank's.
    let err = Sampling::Sequential
        .check(&data, &split, (5, 2, 5))
        .unwrap_err()
        .to_string();
    assert!(err.contains("training split holds 50 ids, fewer than one sequential batch of 2 ranks × --batch 5 × --seq 5 + 1 = 51"), "{err}");
}
