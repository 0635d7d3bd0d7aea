//! The plan's stable hash: FNV-1a (64-bit) over the plan's JSON with `hash` empty, as 16
//! lowercase hex digits.
//!
//! FNV-1a is written out here because its output is fixed by its definition, unlike std's
//! `DefaultHasher`, whose algorithm may change between Rust releases; serde_json writes struct
//! fields in declaration order and the plan holds no maps, so the JSON is stable too.

use crate::{Error, Plan, Result};

const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(FNV_OFFSET_BASIS, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    })
}

/// The hash `plan` should carry: of everything but its `hash` field.
pub fn plan_hash(plan: &Plan) -> Result<String> {
    let unhashed = Plan {
        hash: String::new(),
        ..plan.clone()
    };
    let json = serde_json::to_string(&unhashed).map_err(|e| Error::Serialize(e.to_string()))?;
    Ok(format!("{:016x}", fnv1a64(json.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }
}
