//! Sizes a config may not have: beyond what kiln builds or an index type can count.

use serde_json::json;

use super::*;

#[test]
fn refuses_more_layers_than_kiln_builds() {
    let deep = with(QWEN2_5_0_5B, &[("num_hidden_layers", json!(4294967296u64))]);
    assert_refused(
        &deep,
        "Config",
        &["num_hidden_layers", "4294967296", "1024 layers"],
    );
    let deepest = with(QWEN2_5_0_5B, &[("num_hidden_layers", json!(1024))]);
    assert_eq!(parse(&deepest).unwrap().0.num_hidden_layers, 1024);
}

#[test]
fn refuses_positions_an_i64_cannot_index() {
    let far = with(
        QWEN2_5_0_5B,
        &[("max_position_embeddings", json!(1u64 << 63))],
    );
    assert_refused(
        &far,
        "Config",
        &[
            "max_position_embeddings",
            "9223372036854775808",
            "9223372036854775807",
        ],
    );
}

#[test]
fn refuses_parameters_whose_f32_bytes_overflow() {
    // 896 · 2^52 embedding rows: the count fits in 64 bits, four bytes each do not.
    let wide = with(QWEN2_5_0_5B, &[("vocab_size", json!(1u64 << 52))]);
    assert_refused(&wide, "Config", &["(sizes)", "isize::MAX"]);
}

#[test]
fn refuses_layer_types_of_another_length() {
    for entries in [25, 23, 0] {
        let types = vec![json!("full_attention"); entries];
        let json = with(QWEN2_5_0_5B, &[("layer_types", json!(types))]);
        let count = format!("{entries} entries for num_hidden_layers 24");
        assert_refused(&json, "Config", &["layer_types", &count]);
    }
    let types = vec![json!("full_attention"); 24];
    let json = with(QWEN2_5_0_5B, &[("layer_types", json!(types))]);
    assert_eq!(parse(&json).unwrap(), parse(QWEN2_5_0_5B).unwrap());
}
