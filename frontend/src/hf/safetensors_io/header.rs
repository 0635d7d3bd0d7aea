//! Parsing and validating a safetensors header: pure checks on bytes, no I/O.
//!
//! Layout of a file: an 8-byte little-endian header length `N`, `N` bytes of JSON
//! `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {string: string}}`, then
//! the data section. Offsets are relative to the data section.
//!
//! After [`parse`] succeeds, every tensor's byte range lies inside the data section, holds
//! exactly `numel × dtype size` bytes, and no two non-empty ranges overlap; the non-empty ranges
//! tile the data section with no gaps and nothing after them (the format forbids both, and the
//! `safetensors` crate rejects such files too). Each check is done here rather than in the
//! crate so every error names the tensor(s) and the numbers.

use std::collections::BTreeMap;
use std::fmt;

use safetensors::Dtype;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;

/// Bytes of the length prefix.
pub(super) const LENGTH_PREFIX: usize = 8;

/// Largest header accepted, the limit of the format's reference implementation: a bogus
/// length in a large file would otherwise have gigabytes validated as JSON.
pub(super) const MAX_HEADER: usize = 100_000_000;

/// Where one tensor lies in the data section, and what it holds.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Entry {
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range `[begin, end)` relative to the data section.
    pub begin: usize,
    pub end: usize,
}

/// A validated header.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Header {
    pub tensors: BTreeMap<String, Entry>,
    pub metadata: BTreeMap<String, String>,
    /// Offset of the data section from the start of the file.
    pub data_start: usize,
}

/// Parses and validates the header of a whole file's bytes. The error is the reason in words;
/// the caller adds the path.
pub(super) fn parse(file: &[u8]) -> Result<Header, String> {
    let Some(prefix) = file.first_chunk::<LENGTH_PREFIX>() else {
        return Err(format!(
            "file has {} bytes, too short for a safetensors file (it must start with an \
             8-byte header length)",
            file.len()
        ));
    };
    let after_prefix = file.len() - LENGTH_PREFIX;
    let header_len = u64::from_le_bytes(*prefix);
    let header_len = match usize::try_from(header_len) {
        Ok(n) if n <= after_prefix => n,
        _ => {
            return Err(format!(
                "truncated: header says {header_len} bytes, file has {after_prefix} after the \
                 8-byte length"
            ))
        }
    };
    if header_len > MAX_HEADER {
        return Err(format!(
            "header says {header_len} bytes, over the {MAX_HEADER}-byte limit of the \
             safetensors format"
        ));
    }
    let data_start = LENGTH_PREFIX + header_len;
    let text = std::str::from_utf8(&file[LENGTH_PREFIX..data_start])
        .map_err(|e| format!("header is not valid UTF-8: {e}"))?;
    let entries = parse_object(text)?;
    let data_len = file.len() - data_start;

    let mut tensors = BTreeMap::new();
    let mut metadata = None;
    for (name, value) in entries {
        if name == "__metadata__" {
            if metadata.is_some() {
                return Err("`__metadata__` appears twice in the header".into());
            }
            metadata = Some(
                serde_json::from_value::<BTreeMap<String, String>>(value)
                    .map_err(|e| format!("`__metadata__` must map strings to strings: {e}"))?,
            );
            continue;
        }
        let entry = parse_entry(&name, value, data_len)?;
        if tensors.insert(name.clone(), entry).is_some() {
            return Err(format!("tensor `{name}` appears twice in the header"));
        }
    }
    check_tiling(&tensors, data_len)?;
    Ok(Header {
        tensors,
        metadata: metadata.unwrap_or_default(),
        data_start,
    })
}

/// A JSON object's entries in file order, duplicates kept (a map type would silently keep only
/// the last of two equal keys). Also used for the shard index's `weight_map`.
pub(crate) struct OrderedEntries<V>(pub Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for OrderedEntries<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct EntriesVisitor<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for EntriesVisitor<V> {
            type Value = OrderedEntries<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, V>()? {
                    entries.push(entry);
                }
                Ok(OrderedEntries(entries))
            }
        }
        deserializer.deserialize_map(EntriesVisitor(std::marker::PhantomData))
    }
}

/// The header's top-level object, telling "not JSON at all" apart from "JSON of the wrong form".
fn parse_object(text: &str) -> Result<Vec<(String, Value)>, String> {
    match serde_json::from_str::<OrderedEntries<Value>>(text) {
        Ok(OrderedEntries(entries)) => Ok(entries),
        Err(e) if e.is_data() => Err(format!(
            "header must be a JSON object mapping tensor names to {{dtype, shape, \
             data_offsets}}: {e}"
        )),
        Err(e) => Err(format!("header is not valid JSON: {e}")),
    }
}

/// One tensor's entry as written in the header, before checking it.
#[derive(serde::Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: Vec<usize>,
}

/// Checks one entry on its own: known dtype, byte size matching dtype × shape, inside the data
/// section.
fn parse_entry(name: &str, value: Value, data_len: usize) -> Result<Entry, String> {
    let raw: RawEntry = serde_json::from_value(value)
        .map_err(|e| format!("tensor `{name}`: malformed header entry: {e}"))?;
    let dtype = serde_json::from_value::<Dtype>(Value::String(raw.dtype.clone()))
        .map_err(|_| format!("tensor `{name}`: unknown dtype \"{}\"", raw.dtype))?;
    let [begin, end] = raw.data_offsets[..] else {
        return Err(format!(
            "tensor `{name}`: data_offsets must be two numbers [begin, end], found {:?}",
            raw.data_offsets
        ));
    };
    if end < begin {
        return Err(format!(
            "tensor `{name}`: data_offsets [{begin}, {end}] end before they begin"
        ));
    }
    let shape = &raw.shape;
    let bits = shape
        .iter()
        .try_fold(dtype.bitsize(), |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("tensor `{name}`: shape {shape:?} is too large to address"))?;
    if bits % 8 != 0 {
        return Err(format!(
            "tensor `{name}`: dtype {dtype} × shape {shape:?} is not a whole number of bytes"
        ));
    }
    let needed = bits / 8;
    if end - begin != needed {
        return Err(format!(
            "tensor `{name}`: data_offsets [{begin}, {end}] hold {} bytes, but dtype {dtype} × \
             shape {shape:?} needs {needed}",
            end - begin
        ));
    }
    if end > data_len {
        return Err(format!(
            "tensor `{name}`: data_offsets [{begin}, {end}] outside the data section of \
             {data_len} bytes (is the file truncated?)"
        ));
    }
    Ok(Entry {
        dtype,
        shape: raw.shape,
        begin,
        end,
    })
}

/// The non-empty byte ranges must neither overlap nor leave gaps, and must end where the file
/// ends. Sorting by offset makes each check a comparison with the range before.
fn check_tiling(tensors: &BTreeMap<String, Entry>, data_len: usize) -> Result<(), String> {
    let mut ranges: Vec<(usize, usize, &str)> = tensors
        .iter()
        .filter(|(_, e)| e.end > e.begin)
        .map(|(name, e)| (e.begin, e.end, name.as_str()))
        .collect();
    ranges.sort();
    let mut covered = 0;
    let mut last: Option<(usize, usize, &str)> = None;
    for (begin, end, name) in ranges {
        if let Some((last_begin, last_end, last_name)) = last {
            if begin < last_end {
                return Err(format!(
                    "tensors `{last_name}` (data_offsets [{last_begin}, {last_end}]) and \
                     `{name}` (data_offsets [{begin}, {end}]) overlap"
                ));
            }
        }
        if begin > covered {
            return Err(format!(
                "bytes [{covered}, {begin}) of the data section belong to no tensor (the \
                 format forbids gaps)"
            ));
        }
        covered = end;
        last = Some((begin, end, name));
    }
    if covered != data_len {
        return Err(format!(
            "the data section has {data_len} bytes but the tensors end at byte {covered} \
             ({} bytes belong to no tensor)",
            data_len - covered
        ));
    }
    Ok(())
}
