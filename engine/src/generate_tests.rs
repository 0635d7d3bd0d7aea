//! The reference generator on the CPU against a plain greedy loop over the eager oracle's full
//! forward (both tiny families, eager and replayed programs), sampled generation by seed, stop
//! causes, and the requests it refuses.

use kiln_frontend::model::{random_weights, ModelConfig, Precision};
use kiln_frontend::Var;
use kiln_kernels::testing;
use kiln_runtime::{Backend, RunMode};
use rand::Rng;

use super::*;
use crate::sampling::SamplingParams;
use crate::stop::StopCriteria;
use crate::testing::oracle_greedy;

fn checker(max_new_tokens: usize, eos: &[u32]) -> StopChecker {
    StopChecker::new(StopCriteria {
        eos_token_ids: eos.to_vec(),
        stop_strings: Vec::new(),
        max_new_tokens,
    })
    .unwrap()
}

fn generator(
    config: &ModelConfig,
    weights: &ModelWeights<Var>,
    mode: RunMode,
) -> ReferenceGenerator {
    ReferenceGenerator::new((config, weights), Backend::Cpu, (mode, Precision::F32), 32).unwrap()
}

#[test]
fn greedy_generation_equals_the_oracles_greedy_loop() {
    let mut rng = testing::rng("greedy_generation_equals_the_oracles_greedy_loop");
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        let weights = random_weights(&config, rng.random()).unwrap();
        for mode in [RunMode::Eager, RunMode::Graph] {
            let mut generator = generator(&config, &weights, mode);
            // Requests of different lengths one after another: the caches are reused.
            for length in [5, 3, 5] {
                let prompt: Vec<u32> = (0..length)
                    .map(|_| rng.random_range(0..config.vocab_size as u32))
                    .collect();
                let want = oracle_greedy(&config, &weights, &prompt, 12);
                let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
                let mut stop = checker(12, &[]);
                let mut streamed = Vec::new();
                let got = generator
                    .generate(&prompt, (&mut sampler, &mut stop), None, |t, _| {
                        streamed.push(t);
                        Ok(())
                    })
                    .unwrap();
                assert_eq!(
                    got.tokens, want,
                    "{:?} {mode:?} prompt {prompt:?}",
                    config.family
                );
                assert_eq!(streamed, want);
                assert_eq!(got.cause, StopCause::MaxNewTokens);
            }
        }
    }
}

#[test]
fn an_end_of_sequence_token_stops_and_a_seed_fixes_the_draws() {
    let config = ModelConfig::tiny();
    let mut rng = testing::rng("an_end_of_sequence_token_stops");
    let weights = random_weights(&config, rng.random()).unwrap();
    let mut generator = generator(&config, &weights, RunMode::Graph);
    let prompt = [3, 14, 15, 9];
    let greedy = oracle_greedy(&config, &weights, &prompt, 6);
    // The fourth greedy token as end-of-sequence: generation stops on it, keeping it.
    let eos = greedy[3];
    let first = greedy.iter().position(|&t| t == eos).unwrap();
    let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let got = (generator.generate(
        &prompt,
        (&mut sampler, &mut checker(6, &[eos])),
        None,
        |_, _| Ok(()),
    ))
    .unwrap();
    assert_eq!(got.tokens, greedy[..=first].to_vec());
    assert_eq!(got.cause, StopCause::EosToken { token: eos });

    let sampled = |seed: u64, generator: &mut ReferenceGenerator| {
        let params = SamplingParams {
            seed,
            ..SamplingParams::default()
        };
        let mut sampler = Sampler::new(params).unwrap();
        let mut stop = checker(16, &[]);
        (generator.generate(&prompt, (&mut sampler, &mut stop), None, |_, _| Ok(())))
            .unwrap()
            .tokens
    };
    let seed = rng.random();
    let a = sampled(seed, &mut generator);
    let b = sampled(seed, &mut generator);
    assert_eq!(a, b, "the same seed draws the same tokens");
    let others: Vec<Vec<u32>> = (1..4)
        .map(|k| sampled(seed.wrapping_add(k), &mut generator))
        .collect();
    assert!(
        others.iter().any(|o| *o != a),
        "other seeds draw something else"
    );
}

#[test]
fn bad_requests_are_refused_with_their_numbers() {
    let config = ModelConfig::tiny();
    let weights = random_weights(&config, 1).unwrap();
    let mut generator = generator(&config, &weights, RunMode::Eager);
    let mut refused = |prompt: &[u32], max_new_tokens: usize| {
        let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let mut stop = checker(max_new_tokens, &[]);
        let err = (generator.generate(prompt, (&mut sampler, &mut stop), None, |_, _| Ok(())))
            .unwrap_err();
        err.to_string()
    };
    assert!(refused(&[], 4).contains("prompt is empty"));
    let vocab = config.vocab_size as u32;
    let err = refused(&[1, vocab], 4);
    assert!(err.contains(&format!("prompt token 1 is {vocab}")), "{err}");
    // 30 prompt tokens and 4 new ones need 33 rows of the 32.
    let err = refused(&[1; 30], 4);
    assert!(err.contains("33 cache rows") && err.contains("32"), "{err}");
}
