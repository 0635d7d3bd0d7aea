//! Program options: the one default for the cache, and what `validate` refuses before a graph
//! is built.

use super::*;
use crate::error::Error;
use crate::model::Precision;

fn options(batch: usize, seq: usize, max_seq: Option<usize>) -> ProgramOptions {
    ProgramOptions {
        batch,
        seq,
        max_seq,
        ..ProgramOptions::default()
    }
}

#[track_caller]
fn refused(kind: ProgramKind, options: &ProgramOptions, message: &str) {
    let config = ModelConfig::tiny();
    let error = options.validate(kind, &config).unwrap_err();
    assert!(matches!(error, Error::ProgramOption { .. }), "{error:?}");
    assert_eq!(error.to_string(), message);
    // `build` refuses the same options, before it adds anything.
    assert_eq!(build(kind, &config, options).unwrap_err(), error);
}

#[test]
fn the_cache_defaults_to_the_prompt_or_the_decode_rows() {
    let (tiny, qwen) = (
        ModelConfig::tiny(),
        crate::hf::presets::preset("qwen2.5-0.5b").unwrap().0,
    );
    let default = options(1, 100, None);
    assert_eq!(default.cache_rows(ProgramKind::Prefill, &tiny), Some(100));
    assert_eq!(default.cache_rows(ProgramKind::Decode, &tiny), Some(128));
    assert_eq!(default.cache_rows(ProgramKind::Decode, &qwen), Some(1024));
    assert_eq!(default.cache_rows(ProgramKind::Train, &tiny), None);
    assert_eq!(default.cache_rows(ProgramKind::Eval, &tiny), None);
    let given = options(1, 100, Some(120));
    assert_eq!(given.cache_rows(ProgramKind::Prefill, &tiny), Some(120));
    assert_eq!(given.cache_rows(ProgramKind::Decode, &tiny), Some(120));
    // A prefill of 100 tokens without --max-seq gets a cache of 100 rows.
    let graph = build(ProgramKind::Prefill, &tiny, &default).unwrap();
    let cache = graph.input_named("cache.k.0").unwrap();
    assert_eq!(graph.value_type(cache).unwrap().dims(), &[1, 2, 100, 16]);
}

#[test]
fn options_a_program_does_not_use_are_not_checked() {
    let tiny = ModelConfig::tiny();
    // Decode takes one token per row: the default --seq 16 does not have to fit --max-seq 8.
    build(ProgramKind::Decode, &tiny, &options(1, 16, Some(8))).unwrap();
    // Train and eval have no cache.
    build(ProgramKind::Train, &tiny, &options(1, 16, Some(8))).unwrap();
    build(ProgramKind::Eval, &tiny, &options(1, 16, Some(0))).unwrap();
}

#[test]
fn refuses_counts_below_one() {
    refused(
        ProgramKind::Train,
        &options(0, 4, None),
        "--batch 0: must be at least 1",
    );
    refused(
        ProgramKind::Prefill,
        &options(1, 0, None),
        "--seq 0: must be at least 1",
    );
    refused(
        ProgramKind::Decode,
        &options(1, 4, Some(0)),
        "--max-seq 0: must be at least 1",
    );
}

#[test]
fn refuses_a_prompt_longer_than_its_cache_and_says_which_flag_to_pass() {
    refused(
        ProgramKind::Prefill,
        &options(1, 100, Some(64)),
        "--seq 100: does not fit a cache of --max-seq 64 rows; pass --max-seq 100 or more, or \
         leave --max-seq out (prefill's cache then holds --seq rows)",
    );
}

#[test]
fn every_program_refuses_positions_beyond_the_model() {
    let beyond = "beyond the model's 128 positions (max_position_embeddings)";
    for kind in [ProgramKind::Prefill, ProgramKind::Train, ProgramKind::Eval] {
        refused(
            kind,
            &options(1, 129, None),
            &format!("--seq 129: {beyond}"),
        );
    }
    for kind in [ProgramKind::Prefill, ProgramKind::Decode] {
        refused(
            kind,
            &options(1, 4, Some(129)),
            &format!("--max-seq 129: {beyond}"),
        );
    }
    let tiny = ModelConfig::tiny();
    build(ProgramKind::Train, &tiny, &options(1, 128, None)).unwrap();
    build(ProgramKind::Decode, &tiny, &options(1, 1, Some(128))).unwrap();
}

#[test]
fn refuses_sizes_no_tensor_can_have_naming_the_flags() {
    refused(
        ProgramKind::Train,
        &options(usize::MAX, 16, None),
        "--batch 18446744073709551615: with --seq 16, the program's token ids cannot be built: \
         i64[18446744073709551615,16] is too large: more than 18446744073709551615 elements \
         (usize::MAX)",
    );
    refused(
        ProgramKind::Decode,
        &options(1 << 50, 16, Some(128)),
        "--batch 1125899906842624: with --max-seq 128, the program's KV cache of a layer cannot be \
         built: f32[1125899906842624,2,128,16] is too large: 18446744073709551616 bytes, more \
         than one allocation can hold (9223372036854775807 = isize::MAX)",
    );
    refused(
        ProgramKind::Prefill,
        &options(1 << 48, 128, None),
        "--batch 281474976710656: with --seq 128 and --max-seq 128, the program's widest \
         activation cannot be built: f32[281474976710656,128,112] is too large: \
         16140901064495857664 bytes, more than one allocation can hold (9223372036854775807 = \
         isize::MAX)",
    );
}

#[test]
fn a_decode_position_must_fit_the_cache() {
    let tiny = ModelConfig::tiny();
    options(1, 1, None).check_position(&tiny, 127).unwrap();
    let message = |options: ProgramOptions, position| {
        options
            .check_position(&tiny, position)
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        message(options(1, 1, None), 128),
        "--context 128: beyond the model's 128 positions (max_position_embeddings)"
    );
    assert_eq!(
        message(options(1, 1, Some(64)), 64),
        "--context 64: does not fit a cache of 64 rows; pass --max-seq 65 or more"
    );
    let qwen = crate::hf::presets::preset("qwen2.5-0.5b").unwrap().0;
    let error = options(1, 1, None).check_position(&qwen, 2000).unwrap_err();
    assert_eq!(
        error.to_string(),
        "--context 2000: does not fit a cache of 1024 rows (the decode default); pass --max-seq \
         2001 or more"
    );
}

#[test]
fn eval_refuses_tokens_beyond_the_model_in_every_engine() {
    use crate::eval::{evaluate, evaluate_interpreted};
    let tiny = ModelConfig::tiny();
    let weights = crate::model::random_weights(&tiny, 0).unwrap();
    let tokens = kiln_runtime::Tensor::from_vec(vec![1i64; 129], [1, 129]).unwrap();
    let want = "tokens: T = 129 tokens per row: beyond the model's 128 positions \
                (max_position_embeddings)";
    let oracle = evaluate(&tiny, &weights, &tokens, false, Precision::F32);
    let interpreted = evaluate_interpreted(&tiny, &weights, &tokens, false, Precision::F32);
    for result in [oracle, interpreted] {
        let error = result.err().expect("refused");
        assert_eq!(error.to_string(), want);
    }
}
