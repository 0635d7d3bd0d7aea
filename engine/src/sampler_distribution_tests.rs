//! The sampler draws from the distribution HF's processors define: empirical frequencies over
//! 20 000 draws match probabilities computed here, independently, from the definitions.
//!
//! Tolerance: each token's frequency lies within 5 standard deviations of its probability,
//! `5 * sqrt(p (1 - p) / n)` (a false failure about once in a million tokens checked), and a
//! token of probability 0 is never drawn.

use rand::Rng;

use super::*;
use crate::testing::{fresh_rng, random_logits};

const DRAWS: usize = 20_000;

/// The probabilities of HF's pipeline, from the definitions: softmax of `logits / temperature`,
/// restricted to the `top_k` largest, then to the most likely tokens until their mass reaches
/// `top_p`, then to tokens at least `min_p` times as likely as the top one; renormalized.
fn expected_probabilities(logits: &[f32], params: &SamplingParams) -> Vec<f64> {
    let tempered: Vec<f64> = logits
        .iter()
        .map(|&l| f64::from(l) / f64::from(params.temperature))
        .collect();
    let mut by_likelihood: Vec<usize> = (0..logits.len()).collect();
    by_likelihood.sort_by(|&a, &b| tempered[b].partial_cmp(&tempered[a]).unwrap());
    let mut kept = vec![true; logits.len()];
    if params.top_k > 0 {
        for &id in by_likelihood.iter().skip(params.top_k) {
            kept[id] = false;
        }
    }
    let softmax = |kept: &[bool]| -> Vec<f64> {
        let exps: Vec<f64> = (0..logits.len())
            .map(|i| if kept[i] { tempered[i].exp() } else { 0.0 })
            .collect();
        let total: f64 = exps.iter().sum();
        exps.iter().map(|e| e / total).collect()
    };
    if params.top_p < 1.0 {
        let probabilities = softmax(&kept);
        let mut mass_before = 0.0;
        for &id in &by_likelihood {
            if mass_before >= f64::from(params.top_p) {
                kept[id] = false;
            }
            mass_before += probabilities[id];
        }
    }
    if params.min_p > 0.0 {
        let probabilities = softmax(&kept);
        let top = probabilities.iter().copied().fold(0.0, f64::max);
        for (id, keep) in kept.iter_mut().enumerate() {
            if probabilities[id] < f64::from(params.min_p) * top {
                *keep = false;
            }
        }
    }
    softmax(&kept)
}

/// Draws `DRAWS` tokens with `params` and checks their frequencies against `expected`.
fn check_frequencies(logits: &[f32], params: SamplingParams, expected: &[f64]) {
    let mut sampler = Sampler::new(params.clone()).unwrap();
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..DRAWS {
        counts[sampler.sample(logits, &[]).unwrap() as usize] += 1;
    }
    for (id, (&count, &p)) in counts.iter().zip(expected).enumerate() {
        let frequency = count as f64 / DRAWS as f64;
        let tolerance = 5.0 * (p * (1.0 - p) / DRAWS as f64).sqrt();
        if p == 0.0 {
            assert_eq!(
                count, 0,
                "token {id} has probability 0 ({params:?}, {logits:?})"
            );
        } else {
            assert!(
                (frequency - p).abs() <= tolerance,
                "token {id}: frequency {frequency}, probability {p}, tolerance {tolerance} \
                 ({params:?}, {logits:?})"
            );
        }
    }
}

/// Random logits and a seed, then the frequency check for parameters derived from them.
fn check_case(test: &str, make_params: impl Fn(&mut rand_chacha::ChaCha8Rng) -> SamplingParams) {
    let mut rng = fresh_rng(test);
    for _ in 0..3 {
        let len = rng.random_range(6..14);
        let logits = random_logits(&mut rng, len, 2.5);
        let params = SamplingParams {
            seed: rng.random(),
            ..make_params(&mut rng)
        };
        let expected = expected_probabilities(&logits, &params);
        assert!((expected.iter().sum::<f64>() - 1.0).abs() < 1e-12);
        check_frequencies(&logits, params, &expected);
    }
}

#[test]
fn frequencies_match_the_softmax_at_temperature_one() {
    check_case("frequencies_at_temperature_one", |_| {
        SamplingParams::default()
    });
}

#[test]
fn frequencies_match_the_sharpened_softmax_at_temperature_one_half() {
    check_case("frequencies_at_temperature_one_half", |_| SamplingParams {
        temperature: 0.5,
        ..SamplingParams::default()
    });
}

#[test]
fn frequencies_match_the_top_k_restricted_softmax() {
    check_case("frequencies_top_k", |rng| SamplingParams {
        temperature: rng.random_range(0.5..1.5),
        top_k: rng.random_range(2..6),
        ..SamplingParams::default()
    });
}

#[test]
fn frequencies_match_the_top_p_restricted_softmax() {
    check_case("frequencies_top_p", |rng| SamplingParams {
        top_p: rng.random_range(0.4..0.9),
        ..SamplingParams::default()
    });
}

#[test]
fn frequencies_match_the_min_p_restricted_softmax() {
    check_case("frequencies_min_p", |rng| SamplingParams {
        temperature: rng.random_range(0.7..1.3),
        min_p: rng.random_range(0.05..0.4),
        ..SamplingParams::default()
    });
}

#[test]
fn frequencies_match_top_k_top_p_and_min_p_together() {
    check_case("frequencies_combined", |rng| SamplingParams {
        temperature: rng.random_range(0.5..1.5),
        top_k: rng.random_range(3..8),
        top_p: rng.random_range(0.6..0.95),
        min_p: rng.random_range(0.02..0.2),
        ..SamplingParams::default()
    });
}

#[test]
fn frequencies_follow_the_penalized_logits() {
    let mut rng = fresh_rng("frequencies_follow_the_penalized_logits");
    let logits = random_logits(&mut rng, 8, 2.0);
    let context = [1, 4, 4];
    let params = SamplingParams {
        repetition_penalty: 1.8,
        seed: rng.random(),
        ..SamplingParams::default()
    };
    let mut penalized = logits.clone();
    for id in [1, 4] {
        let l = &mut penalized[id];
        *l = if *l < 0.0 { *l * 1.8 } else { *l / 1.8 };
    }
    let expected = expected_probabilities(&penalized, &params);
    let mut sampler = Sampler::new(params).unwrap();
    let mut counts = [0usize; 8];
    for _ in 0..DRAWS {
        counts[sampler.sample(&logits, &context).unwrap() as usize] += 1;
    }
    for (id, (&count, &p)) in counts.iter().zip(&expected).enumerate() {
        let frequency = count as f64 / DRAWS as f64;
        let tolerance = 5.0 * (p * (1.0 - p) / DRAWS as f64).sqrt();
        assert!(
            (frequency - p).abs() <= tolerance,
            "token {id}: {frequency} vs {p}"
        );
    }
}
