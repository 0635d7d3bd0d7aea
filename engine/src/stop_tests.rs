//! Tests of the stop criteria: end-of-sequence ids, the length limit, stop strings cut from
//! the text (within one token's text or across several), and refused criteria.

use rand::Rng;

use super::*;
use crate::testing::fresh_rng;

fn checker(eos: &[u32], stops: &[&str], max_new_tokens: usize) -> StopChecker {
    StopChecker::new(StopCriteria {
        eos_token_ids: eos.to_vec(),
        stop_strings: stops.iter().map(|s| s.to_string()).collect(),
        max_new_tokens,
    })
    .expect("valid criteria")
}

/// Feeds `pieces` (token id, its text) and returns the cause, the token count and the text
/// the request returns.
fn run(checker: &mut StopChecker, pieces: &[(u32, &str)]) -> Option<(StopCause, usize, String)> {
    let mut text = String::new();
    for &(token, piece) in pieces {
        text.push_str(piece);
        if let Some(cause) = checker.check(token, Some(&text)) {
            let returned = cause.returned_text(&text).to_string();
            return Some((cause, checker.generated(), returned));
        }
    }
    None
}

#[test]
fn an_eos_token_stops_with_reason_stop() {
    let mut eos = checker(&[2, 7], &[], 100);
    assert_eq!(eos.check(5, None), None);
    assert_eq!(eos.check(9, None), None);
    let cause = eos.check(7, None).expect("7 is an eos id");
    assert_eq!(cause, StopCause::EosToken { token: 7 });
    assert_eq!(cause.finish_reason(), FinishReason::Stop);
    assert_eq!(eos.generated(), 3);
    assert_eq!(
        eos.check(5, None),
        Some(cause.clone()),
        "finished stays finished"
    );
    assert_eq!(eos.generated(), 3);
    assert_eq!(eos.finished(), Some(&cause));
}

#[test]
fn max_new_tokens_stops_with_reason_length_and_eos_outranks_it() {
    let mut rng = fresh_rng("max_new_tokens_stops_with_reason_length");
    let limit = rng.random_range(1..50);
    let mut length = checker(&[0], &[], limit);
    for _ in 1..limit {
        assert_eq!(length.check(rng.random_range(1..1000), None), None);
    }
    let cause = length
        .check(rng.random_range(1..1000), None)
        .expect("at the limit");
    assert_eq!(cause, StopCause::MaxNewTokens);
    assert_eq!(cause.finish_reason(), FinishReason::Length);
    assert_eq!(length.generated(), limit);

    let mut last_is_eos = checker(&[0], &[], 2);
    assert_eq!(last_is_eos.check(4, None), None);
    assert_eq!(
        last_is_eos.check(0, None),
        Some(StopCause::EosToken { token: 0 })
    );
}

#[test]
fn a_stop_string_within_one_tokens_text_is_cut() {
    let mut stops = checker(&[], &["\n\n"], 100);
    let (cause, count, text) = run(
        &mut stops,
        &[(1, "Hello"), (2, " world.\n\nNext"), (3, " line")],
    )
    .unwrap();
    assert_eq!(
        cause,
        StopCause::StopString {
            index: 0,
            text_end: 12
        }
    );
    assert_eq!(cause.finish_reason(), FinishReason::Stop);
    assert_eq!((count, text.as_str()), (2, "Hello world."));
}

#[test]
fn a_stop_string_spanning_two_tokens_text_is_cut() {
    let mut stops = checker(&[], &["User:"], 100);
    let (cause, count, text) = run(
        &mut stops,
        &[(1, "Sure. "), (2, "Us"), (3, "er: hi"), (4, "!")],
    )
    .unwrap();
    assert_eq!(
        cause,
        StopCause::StopString {
            index: 0,
            text_end: 6
        }
    );
    assert_eq!((count, text.as_str()), (3, "Sure. "));
}

#[test]
fn the_earliest_stop_string_wins_and_text_without_stops_runs_on() {
    let mut stops = checker(&[], &["world", "lo w", "zzz"], 100);
    let (cause, _, text) = run(&mut stops, &[(1, "hel"), (2, "lo world")]).unwrap();
    assert_eq!(
        cause,
        StopCause::StopString {
            index: 1,
            text_end: 3
        }
    );
    assert_eq!(text, "hel");

    let mut split_three_ways = checker(&[], &["stop"], 100);
    let (cause, count, text) =
        run(&mut split_three_ways, &[(1, "st"), (2, "o"), (3, "ps")]).unwrap();
    assert_eq!(
        cause,
        StopCause::StopString {
            index: 0,
            text_end: 0
        }
    );
    assert_eq!((count, text.as_str()), (3, ""));
    let mut without_text = checker(&[], &["stop"], 3);
    assert_eq!(without_text.check(1, None), None);
    assert_eq!(without_text.check(2, None), None);
    assert_eq!(without_text.check(3, None), Some(StopCause::MaxNewTokens));
}

#[test]
fn stop_strings_are_found_like_a_search_of_the_whole_text() {
    let mut rng = fresh_rng("stop_strings_are_found_like_a_search");
    let alphabet = ['a', 'b', 'é', '→', '😀', ' '];
    let word = |rng: &mut rand_chacha::ChaCha8Rng, lengths: std::ops::Range<usize>| -> String {
        let len = rng.random_range(lengths);
        (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect()
    };
    for _ in 0..500 {
        let stops: Vec<String> = (0..rng.random_range(1..4))
            .map(|_| word(&mut rng, 2..5))
            .collect();
        let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
        let mut stopper = checker(&[], &stop_refs, 1000);
        let mut text = String::new();
        let mut outcome = None;
        for token in 0..40 {
            text.push_str(&word(&mut rng, 0..4));
            if let Some(cause) = stopper.check(token, Some(&text)) {
                outcome = Some(cause);
                break;
            }
        }
        let expected = stops
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| text.find(stop.as_str()).map(|at| (at, index)))
            .min();
        match (outcome, expected) {
            (Some(StopCause::StopString { index, text_end }), Some((at, first))) => {
                assert_eq!(text_end, at, "{stops:?} in {text:?}");
                assert_eq!(&text[at..at + stops[index].len()], stops[index]);
                assert_eq!(index, first, "{stops:?} in {text:?}");
            }
            (None, None) => {}
            (outcome, expected) => panic!("{outcome:?} vs {expected:?}: {stops:?} in {text:?}"),
        }
    }
}

#[test]
fn zero_max_new_tokens_and_an_empty_stop_string_are_refused() {
    let zero = StopChecker::new(StopCriteria {
        eos_token_ids: vec![2],
        stop_strings: vec![],
        max_new_tokens: 0,
    });
    assert!(matches!(
        zero,
        Err(Error::StopCriteria {
            field: "max_new_tokens",
            ..
        })
    ));
    let empty = StopChecker::new(StopCriteria {
        eos_token_ids: vec![],
        stop_strings: vec!["END".into(), String::new()],
        max_new_tokens: 5,
    });
    match empty {
        Err(
            err @ Error::StopCriteria {
                field: "stop_strings",
                ..
            },
        ) => {
            assert!(err.to_string().contains("stop string 1 is empty"), "{err}");
        }
        other => panic!("expected a StopCriteria error, got {other:?}"),
    }
}

#[test]
fn finish_reasons_serialize_as_the_openai_names() {
    assert_eq!(
        serde_json::to_string(&FinishReason::Length).unwrap(),
        "\"length\""
    );
    assert_eq!(
        serde_json::to_string(&FinishReason::Stop).unwrap(),
        "\"stop\""
    );
    let parsed: FinishReason = serde_json::from_str("\"stop\"").unwrap();
    assert_eq!(parsed, FinishReason::Stop);
}

#[test]
fn criteria_from_a_generation_config_take_its_eos_ids() {
    let config = GenerationConfig {
        eos_token_ids: vec![128001, 128009],
        ..GenerationConfig::default()
    };
    let criteria = StopCriteria::from_generation_config(&config, 64);
    assert_eq!(criteria.eos_token_ids, vec![128001, 128009]);
    assert!(criteria.stop_strings.is_empty());
    assert_eq!(criteria.max_new_tokens, 64);
}
