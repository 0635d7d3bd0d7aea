//! Tests of `safetensors_io`'s refusals: each malformed file is built by hand (length prefix,
//! JSON header, data bytes) and must give an error naming the file, the tensor(s) and the
//! numbers; failed writes must leave existing files untouched and no temporary file behind.

use std::fs;
use std::path::Path;

use super::tests::{assert_contains, malformed, raw_file};
use super::*;

/// A header entry for tensor `name`.
fn entry(name: &str, dtype: &str, shape: &[usize], begin: usize, end: usize) -> String {
    format!(r#""{name}":{{"dtype":"{dtype}","shape":{shape:?},"data_offsets":[{begin},{end}]}}"#)
}

fn header(entries: &[String]) -> String {
    format!("{{{}}}", entries.join(","))
}

#[test]
fn a_missing_file_or_a_directory_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.safetensors");
    let err = SafetensorsFile::open(&path).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_contains(
        &err.to_string(),
        &[&path.display().to_string(), "cannot open"],
    );
}

#[test]
fn a_file_shorter_than_the_length_prefix_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.safetensors");
    fs::write(&path, [1, 2, 3, 4, 5]).unwrap();
    assert_contains(&malformed(&path), &["5 bytes", "too short"]);
    fs::write(&path, b"").unwrap();
    assert_contains(&malformed(&path), &["0 bytes"]);
}

#[test]
fn a_header_longer_than_the_file_is_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.safetensors");
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{\"x\":");
    fs::write(&path, &bytes).unwrap();
    assert_contains(
        &malformed(&path),
        &["truncated: header says 1000 bytes, file has 5"],
    );
    // A length no file could have.
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    assert_contains(&malformed(&path), &["truncated", &u64::MAX.to_string()]);
}

#[test]
fn a_header_over_the_formats_limit_is_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.safetensors");
    // One byte over the limit, in a (sparse) file that long: only the length is read.
    let len = super::header::MAX_HEADER as u64 + 1;
    let file = fs::File::create(&path).unwrap();
    file.set_len(8 + len).unwrap();
    drop(file);
    let mut prefix = fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::io::Write::write_all(&mut prefix, &len.to_le_bytes()).unwrap();
    drop(prefix);
    assert_contains(
        &malformed(&path),
        &[
            &path.display().to_string(),
            "header says 100000001 bytes, over the 100000000-byte limit",
        ],
    );
}

#[test]
fn a_header_that_is_not_a_json_object_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&[u8], &str); 4] = [
        (b"{not json", "header is not valid JSON"),
        (b"{\"x\": {\"dtype\"", "header is not valid JSON"),
        (b"[1, 2]", "header must be a JSON object"),
        (b"{\"\xff\": 1}", "header is not valid UTF-8"),
    ];
    for (text, expected) in cases {
        let path = dir.path().join("bad.safetensors");
        let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(text);
        fs::write(&path, bytes).unwrap();
        assert_contains(&malformed(&path), &[expected]);
    }
}

#[test]
fn malformed_entries_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"{"w":{"dtype":"F32","data_offsets":[0,4]}}"#,
            "tensor `w`: malformed header entry: missing field `shape`",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
            "tensor `w`: malformed header entry",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}"#,
            "tensor `w`: data_offsets must be two numbers [begin, end], found [0, 4, 8]",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}}"#,
            "tensor `w`: data_offsets [4, 0] end before they begin",
        ),
        (
            r#"{"w":{"dtype":"F128","shape":[1],"data_offsets":[0,4]}}"#,
            "tensor `w`: unknown dtype \"F128\"",
        ),
        (
            r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,4]}}"#,
            "tensor `w`: shape [4294967296, 4294967296, 2] is too large",
        ),
        (
            r#"{"w":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#,
            "not a whole number of bytes",
        ),
        (
            r#"{"__metadata__":{"format":1}}"#,
            "`__metadata__` must map strings to strings",
        ),
    ];
    for (text, expected) in cases {
        let path = raw_file(dir.path(), text, &[0; 4]);
        assert_contains(&malformed(&path), &[expected]);
    }
}

#[test]
fn a_tensor_named_twice_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let text = header(&[entry("w", "F32", &[1], 0, 4), entry("w", "F32", &[1], 4, 8)]);
    let path = raw_file(dir.path(), &text, &[0; 8]);
    assert_contains(&malformed(&path), &["tensor `w` appears twice"]);
}

#[test]
fn offsets_must_match_dtype_times_shape() {
    let dir = tempfile::tempdir().unwrap();
    let text = header(&[entry("w", "F32", &[3], 0, 8)]);
    let path = raw_file(dir.path(), &text, &[0; 8]);
    assert_contains(
        &malformed(&path),
        &["tensor `w`: data_offsets [0, 8] hold 8 bytes, but dtype F32 × shape [3] needs 12"],
    );
}

#[test]
fn data_beyond_the_end_of_the_file_is_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let text = header(&[
        entry("a", "F32", &[2], 0, 8),
        entry("b", "BF16", &[4], 8, 16),
    ]);
    let path = raw_file(dir.path(), &text, &[0; 12]);
    assert_contains(
        &malformed(&path),
        &[
            "tensor `b`: data_offsets [8, 16] outside the data section of 12 bytes",
            "truncated",
        ],
    );
}

#[test]
fn overlapping_tensors_are_both_named() {
    let dir = tempfile::tempdir().unwrap();
    let text = header(&[
        entry("z_first", "F32", &[2], 0, 8),
        entry("a_second", "F32", &[2], 4, 12),
        entry("empty", "F32", &[0], 4, 4),
    ]);
    let path = raw_file(dir.path(), &text, &[0; 12]);
    assert_contains(
        &malformed(&path),
        &[
            "`z_first` (data_offsets [0, 8])",
            "`a_second` (data_offsets [4, 12])",
            "overlap",
        ],
    );
}

#[test]
fn gaps_and_trailing_bytes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gap = header(&[
        entry("a", "F32", &[1], 0, 4),
        entry("b", "F32", &[1], 8, 12),
    ]);
    let path = raw_file(dir.path(), &gap, &[0; 12]);
    assert_contains(
        &malformed(&path),
        &["bytes [4, 8) of the data section belong to no tensor"],
    );

    let trailing = header(&[entry("a", "F32", &[1], 0, 4)]);
    let path = raw_file(dir.path(), &trailing, &[0; 7]);
    assert_contains(
        &malformed(&path),
        &["data section has 7 bytes", "end at byte 4"],
    );
}

#[test]
fn an_empty_tensor_anywhere_and_an_empty_file_are_fine() {
    let dir = tempfile::tempdir().unwrap();
    let text = header(&[
        entry("a", "F32", &[1], 0, 4),
        entry("none", "I64", &[0, 5], 4, 4),
    ]);
    let file = SafetensorsFile::open(&raw_file(dir.path(), &text, &[0; 4])).unwrap();
    assert_eq!(file.tensor("none", DType::I64).unwrap().dims(), &[0, 5]);
    let file = SafetensorsFile::open(&raw_file(dir.path(), "{}", &[])).unwrap();
    assert!(file.names().is_empty());
}

// --- failed writes ---

/// The names in `dir`, sorted.
pub(super) fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

pub(super) fn one_tensor() -> Vec<(String, Tensor)> {
    vec![(
        "w".into(),
        Tensor::from_vec(vec![1.0f32, 2.0], [2]).unwrap(),
    )]
}

#[test]
fn refused_input_leaves_an_existing_file_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("model.safetensors");
    write_safetensors(&target, &one_tensor(), None).unwrap();
    let before = fs::read(&target).unwrap();

    // The second `w` has another dtype: in data order (widest first) `x` sorts between them.
    let mut twice = one_tensor();
    twice.push(("x".into(), Tensor::from_vec(vec![2i64], [1]).unwrap()));
    twice.push(("w".into(), Tensor::from_vec(vec![1i64], [1]).unwrap()));
    let err = write_safetensors(&target, &twice, None).unwrap_err();
    assert!(matches!(err, Error::Safetensors { .. }), "{err:?}");
    assert_contains(&err.to_string(), &["tensor `w` is given twice"]);

    let reserved = vec![("__metadata__".to_string(), one_tensor()[0].1.clone())];
    let err = write_safetensors(&target, &reserved, None).unwrap_err();
    assert_contains(&err.to_string(), &["`__metadata__` is reserved"]);

    let err = write_safetensors(&dir.path().join(".."), &one_tensor(), None).unwrap_err();
    assert!(matches!(err, Error::Io { .. }), "{err:?}");
    assert_contains(&err.to_string(), &["not a file path"]);

    assert_eq!(fs::read(&target).unwrap(), before);
    assert_eq!(listing(dir.path()), ["model.safetensors"]);
}
