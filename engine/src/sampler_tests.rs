//! Tests of the sampler's choices: greedy, the cut-offs that reduce to greedy, seeds and
//! independence between requests, the repetition penalty, and refused logits.

use rand::Rng;

use super::*;
use crate::testing::{fresh_rng, random_logits};

fn sampler(params: SamplingParams) -> Sampler {
    Sampler::new(params).expect("valid parameters")
}

/// The first id of the largest logit, computed plainly.
fn first_max(logits: &[f32]) -> u32 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    logits.iter().position(|&l| l == max).expect("non-empty") as u32
}

#[test]
fn greedy_is_the_argmax_with_ties_to_the_lowest_id() {
    let mut rng = fresh_rng("greedy_is_the_argmax");
    let mut greedy = sampler(SamplingParams::greedy());
    for _ in 0..500 {
        let len = rng.random_range(1..64);
        let mut logits = random_logits(&mut rng, len, 8.0);
        if len > 1 && rng.random_bool(0.5) {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let tied = rng.random_range(0..len);
            logits[tied] = max;
        }
        let expected = first_max(&logits);
        assert_eq!(greedy.sample(&logits, &[]).unwrap(), expected, "{logits:?}");
    }
    assert_eq!(greedy.sample(&[1.0, 5.0, 3.0, 5.0, 5.0], &[]).unwrap(), 1);
    assert_eq!(greedy.sample(&[f32::NEG_INFINITY, -3.0], &[]).unwrap(), 1);
}

#[test]
fn greedy_applies_the_repetition_penalty_first() {
    let mut greedy = sampler(SamplingParams {
        repetition_penalty: 2.0,
        ..SamplingParams::greedy()
    });
    assert_eq!(greedy.sample(&[3.0, 2.0, 1.0], &[0]).unwrap(), 1);
    assert_eq!(greedy.sample(&[3.0, 2.0, 1.0], &[1]).unwrap(), 0);
}

#[test]
fn top_k_one_and_a_tiny_top_p_choose_what_greedy_chooses_and_min_p_one_a_top_token() {
    let mut rng = fresh_rng("top_k_one_and_a_tiny_top_p");
    for trial in 0..300 {
        let len = rng.random_range(1..100);
        let mut logits = random_logits(&mut rng, len, 6.0);
        if len > 1 && trial % 3 == 0 {
            logits[rng.random_range(0..len)] = logits[rng.random_range(0..len)];
        }
        let context: Vec<u32> = (0..rng.random_range(0..10))
            .map(|_| rng.random_range(0..len as u32))
            .collect();
        let shared = SamplingParams {
            temperature: rng.random_range(0.1..3.0),
            repetition_penalty: rng.random_range(0.5..2.0),
            seed: rng.random(),
            ..SamplingParams::default()
        };
        let expected = sampler(SamplingParams {
            temperature: 0.0,
            ..shared.clone()
        })
        .sample(&logits, &context)
        .unwrap();
        for params in [
            SamplingParams {
                top_k: 1,
                ..shared.clone()
            },
            SamplingParams {
                top_p: 1e-9,
                ..shared.clone()
            },
        ] {
            let mut sampler = sampler(params.clone());
            for _ in 0..5 {
                assert_eq!(
                    sampler.sample(&logits, &context).unwrap(),
                    expected,
                    "{params:?}"
                );
            }
        }
        let mut penalized = logits.clone();
        apply_repetition_penalty(&mut penalized, &context, shared.repetition_penalty).unwrap();
        let max = penalized.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut min_p_one = sampler(SamplingParams {
            min_p: 1.0,
            ..shared.clone()
        });
        for _ in 0..5 {
            let token = min_p_one.sample(&logits, &context).unwrap();
            assert_eq!(
                penalized[token as usize], max,
                "min_p = 1 keeps only the top tokens"
            );
        }
    }
}

/// `count` tokens drawn by a fresh sampler with `seed` from fixed random logits.
fn draws(seed: u64, logits: &[f32], count: usize) -> Vec<u32> {
    let mut sampler = sampler(SamplingParams {
        seed,
        ..SamplingParams::default()
    });
    (0..count)
        .map(|_| sampler.sample(logits, &[]).unwrap())
        .collect()
}

#[test]
fn the_same_seed_gives_the_same_tokens_and_different_seeds_differ() {
    let mut rng = fresh_rng("the_same_seed_gives_the_same_tokens");
    let logits = random_logits(&mut rng, 50, 2.0);
    let seed: u64 = rng.random();
    let first = draws(seed, &logits, 200);
    assert_eq!(first, draws(seed, &logits, 200));
    assert!(
        first.iter().any(|&t| t != first[0]),
        "the draws vary: {first:?}"
    );
    let other = draws(seed.wrapping_add(1), &logits, 200);
    assert_ne!(first, other);
}

#[test]
fn a_requests_draws_do_not_depend_on_other_requests() {
    let mut rng = fresh_rng("a_requests_draws_do_not_depend");
    let steps: Vec<Vec<f32>> = (0..100).map(|_| random_logits(&mut rng, 40, 3.0)).collect();
    let params = SamplingParams {
        temperature: 0.8,
        top_k: 30,
        top_p: 0.95,
        repetition_penalty: 1.3,
        seed: rng.random(),
        ..SamplingParams::default()
    };
    let run = |neighbour: Option<&mut Sampler>| {
        let mut alone = sampler(params.clone());
        let mut neighbour = neighbour;
        let mut context = vec![3, 7];
        for logits in &steps {
            if let Some(other) = neighbour.as_deref_mut() {
                let other_logits: Vec<f32> = logits.iter().map(|l| -l).collect();
                other.sample(&other_logits, &context).unwrap();
            }
            let token = alone.sample(logits, &context).unwrap();
            context.push(token);
        }
        context
    };
    let alone = run(None);
    let mut same_seed_neighbour = sampler(params.clone());
    let mut other_neighbour = sampler(SamplingParams {
        seed: params.seed ^ 0x5eed,
        ..SamplingParams::default()
    });
    assert_eq!(alone, run(Some(&mut same_seed_neighbour)));
    assert_eq!(alone, run(Some(&mut other_neighbour)));
}

#[test]
fn the_repetition_penalty_divides_positive_and_multiplies_negative_logits_once() {
    let mut scores = [2.0, -1.0, 0.5, 3.0, -2.0, 0.0];
    apply_repetition_penalty(&mut scores, &[0, 1, 1, 4, 0, 5], 2.0).unwrap();
    assert_eq!(scores, [1.0, -2.0, 0.5, 3.0, -4.0, 0.0]);

    let mut rewarded = [2.0, -1.0, 0.5];
    apply_repetition_penalty(&mut rewarded, &[0, 1], 0.5).unwrap();
    assert_eq!(rewarded, [4.0, -0.5, 0.5]);

    let mut untouched = [2.0, -1.0];
    apply_repetition_penalty(&mut untouched, &[0, 1], 1.0).unwrap();
    assert_eq!(untouched, [2.0, -1.0]);
}

#[test]
fn the_repetition_penalty_lowers_a_seen_tokens_probability() {
    let mut rng = fresh_rng("the_repetition_penalty_lowers");
    for _ in 0..100 {
        let logits = random_logits(&mut rng, 20, 4.0);
        let seen = rng.random_range(0..20u32);
        let mut penalized = logits.clone();
        apply_repetition_penalty(&mut penalized, &[seen], 1.5).unwrap();
        let probability = |scores: &[f32], id: u32| {
            let total: f64 = scores.iter().map(|&s| f64::from(s).exp()).sum();
            f64::from(scores[id as usize]).exp() / total
        };
        assert!(probability(&penalized, seen) < probability(&logits, seen));
    }
}

#[test]
fn positive_infinities_share_the_mass_and_negative_ones_are_never_drawn() {
    let inf = f32::INFINITY;
    let mut sampler = sampler(SamplingParams {
        seed: 11,
        ..SamplingParams::default()
    });
    let mut counts = [0usize; 4];
    for _ in 0..4000 {
        counts[sampler.sample(&[0.0, inf, 9.0, inf], &[]).unwrap() as usize] += 1;
    }
    assert_eq!((counts[0], counts[2]), (0, 0), "{counts:?}");
    assert!(
        counts[1].abs_diff(2000) < 200 && counts[3].abs_diff(2000) < 200,
        "{counts:?}"
    );

    let minus = f32::NEG_INFINITY;
    for _ in 0..2000 {
        let token = sampler.sample(&[minus, 1.0, minus, 1.0], &[]).unwrap();
        assert!(token == 1 || token == 3, "{token}");
    }
    assert_eq!(first_max(&[0.0, inf, inf]), 1);
    assert_eq!(
        Sampler::new(SamplingParams::greedy())
            .unwrap()
            .sample(&[0.0, inf, inf], &[])
            .unwrap(),
        1
    );
}

#[test]
fn nan_empty_all_negative_infinite_logits_and_foreign_context_are_refused() {
    let mut rng = fresh_rng("nan_empty_logits_are_refused");
    for params in [SamplingParams::default(), SamplingParams::greedy()] {
        let mut sampler = sampler(params);
        let mut logits = random_logits(&mut rng, 30, 5.0);
        let position = rng.random_range(0..30);
        logits[position] = f32::NAN;
        match sampler.sample(&logits, &[]) {
            Err(err @ Error::NanLogit { .. }) => {
                assert!(
                    matches!(err, Error::NanLogit { position: p, vocab_size: 30 } if p == position)
                );
                assert!(err.to_string().contains(&format!("position {position}")));
            }
            other => panic!("expected NanLogit, got {other:?}"),
        }
        assert!(matches!(
            sampler.sample(&[], &[]),
            Err(Error::EmptyVocabulary)
        ));
        assert!(matches!(
            sampler.sample(&[f32::NEG_INFINITY; 3], &[]),
            Err(Error::NoCandidate { vocab_size: 3 })
        ));
        assert!(matches!(
            sampler.sample(&[0.0, 1.0], &[1, 2]),
            Err(Error::ContextToken {
                token: 2,
                position: 1,
                vocab_size: 2
            })
        ));
    }
}

#[test]
fn invalid_parameters_are_refused_at_construction() {
    let refused = Sampler::new(SamplingParams {
        top_p: 0.0,
        ..SamplingParams::default()
    });
    assert!(matches!(
        refused,
        Err(Error::SamplingParameter {
            parameter: "top_p",
            ..
        })
    ));
}
