//! Programs over a KV pool (the serving engine's): a prefill of padded prompts of different
//! lengths into chosen slots, then decodes of the surviving rows by slot id, on the reference
//! interpreter against the eager full forward; slots no program names keep their bits.

use std::collections::BTreeMap;

use kiln_frontend::model::{forward, random_weights, Eager, ModelConfig};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::InputKind;
use kiln_kernels::testing;
use kiln_runtime::{interpret, Tensor};

const SLOTS: usize = 4;
const MAX_SEQ: usize = 12;

/// The first largest entry of each row of `vocab` logits.
fn argmax_rows(logits: &[f64], vocab: usize) -> Vec<i64> {
    (logits.chunks(vocab))
        .map(|row| (0..vocab).fold(0, |best, j| if row[j] > row[best] { j } else { best }) as i64)
        .collect()
}

fn options(batch: usize, seq: usize) -> ProgramOptions {
    ProgramOptions {
        batch,
        seq,
        max_seq: Some(MAX_SEQ),
        pool: Some(SLOTS),
        ..Default::default()
    }
}

fn tensor(values: Vec<i64>, dims: &[usize]) -> Tensor {
    Tensor::from_vec(values, dims).unwrap()
}

fn ints(values: &[i64]) -> Tensor {
    tensor(values.to_vec(), &[values.len()])
}

#[test]
fn pooled_prefill_and_decode_follow_the_full_forward_and_leave_other_slots_alone() {
    let mut rng = testing::rng("pooled_prefill_and_decode");
    for config in [ModelConfig::tiny(), ModelConfig::tiny_llama()] {
        let weights = random_weights(&config, rand::Rng::random(&mut rng)).unwrap();
        let vocab = config.vocab_size;
        // Two sequences: slot 2 (prompt 3) and slot 0 (prompt 5), 8 tokens each in all.
        let sequences = [(2usize, 3usize), (0, 5)];
        let total = 8;
        let ids: Vec<Vec<i64>> = (0..2)
            .map(|_| testing::indices(&mut rng, total, vocab))
            .collect();
        let full: Vec<Vec<f64>> = ids
            .iter()
            .map(|ids| {
                let positions: Vec<i64> = (0..total as i64).collect();
                let row = |v: &[i64]| Var::constant(tensor(v.to_vec(), &[1, total]));
                let logits = forward(&Eager::F32, &config, &weights, &row(ids), &row(&positions));
                logits.unwrap().value().to_f64_vec().unwrap()
            })
            .collect();
        let full_at = |s: usize, t: usize| full[s][t * vocab..(t + 1) * vocab].to_vec();

        // Params, and a pool of random (never zero) caches.
        let mut values: BTreeMap<String, Tensor> = (weights.named().into_iter())
            .map(|(name, var)| (name, var.value().clone()))
            .collect();
        let decode1 = build(ProgramKind::Decode, &config, &options(1, 1)).unwrap();
        for (_, name, kind, ty) in decode1.inputs() {
            if kind == InputKind::State {
                let noise: Vec<f32> = (testing::signed(&mut rng, ty.shape.numel()).iter())
                    .map(|&x| x as f32)
                    .collect();
                values.insert(
                    name.to_string(),
                    Tensor::from_vec(noise, ty.dims()).unwrap(),
                );
            }
        }
        let untouched: Vec<(String, Vec<f64>)> = (values.iter())
            .filter(|(name, _)| name.starts_with("cache."))
            .map(|(name, t)| (name.clone(), t.to_f64_vec().unwrap()))
            .collect();

        // One prefill of both prompts into their slots, the shorter padded with random tokens
        // (their keys land past its prompt, where decode overwrites them before reading).
        let length = 5;
        let prefill = build(ProgramKind::Prefill, &config, &options(2, length)).unwrap();
        let mut tokens = Vec::new();
        for (s, &(_, prompt)) in sequences.iter().enumerate() {
            tokens.extend_from_slice(&ids[s][..prompt]);
            tokens.extend(testing::indices(&mut rng, length - prompt, vocab));
        }
        let positions: Vec<i64> = (0..2 * length as i64).map(|i| i % length as i64).collect();
        let last: Vec<i64> = (sequences.iter().enumerate())
            .map(|(s, &(_, prompt))| (s * length + prompt - 1) as i64)
            .collect();
        values.insert("tokens".into(), tensor(tokens, &[2, length]));
        values.insert("positions".into(), tensor(positions, &[2, length]));
        values.insert("cache_positions".into(), ints(&[0, 0]));
        values.insert("cache_rows".into(), ints(&[2, 0]));
        values.insert("logit_rows".into(), ints(&last));
        let logits = interpret(&prefill, &mut values).unwrap()["logits"]
            .to_f64_vec()
            .unwrap();
        for (s, &(slot, prompt)) in sequences.iter().enumerate() {
            let got = &logits[s * vocab..(s + 1) * vocab];
            let error = testing::rel_l2(got, &full_at(s, prompt - 1));
            assert!(
                error < 1e-5,
                "{:?} prefill of slot {slot}: {error:e}",
                config.family
            );
        }

        // Both rows decode (slot ids out of order) until the longer prompt's sequence is
        // done, then the other alone: different positions, a batch that shrinks.
        let decode2 = build(ProgramKind::Decode, &config, &options(2, 1)).unwrap();
        let mut next = [sequences[0].1, sequences[1].1];
        while next[0] < total {
            let rows: Vec<usize> = (0..2).filter(|&s| next[s] < total).collect();
            let program = if rows.len() == 2 { &decode2 } else { &decode1 };
            let step_ids: Vec<i64> = rows.iter().map(|&s| ids[s][next[s]]).collect();
            let positions: Vec<i64> = rows.iter().map(|&s| next[s] as i64).collect();
            let slots: Vec<i64> = rows.iter().map(|&s| sequences[s].0 as i64).collect();
            values.insert("tokens".into(), tensor(step_ids, &[rows.len(), 1]));
            values.insert("positions".into(), ints(&positions));
            values.insert("cache_rows".into(), ints(&slots));
            let out = interpret(program, &mut values).unwrap();
            let logits = out["logits"].to_f64_vec().unwrap();
            assert_eq!(
                out["next_tokens"].to_vec::<i64>().unwrap(),
                argmax_rows(&logits, vocab)
            );
            for (row, &s) in rows.iter().enumerate() {
                let got = &logits[row * vocab..(row + 1) * vocab];
                let error = testing::rel_l2(got, &full_at(s, next[s]));
                let (family, slot) = (config.family, sequences[s].0);
                assert!(
                    error < 1e-5,
                    "{family:?} decode of slot {slot} at {}: {error:e}",
                    next[s]
                );
                next[s] += 1;
            }
        }
        assert_eq!(next, [total, total]);

        // Slots 1 and 3 were never named: every bit as it was. The named slots keep their
        // noise past the last position written.
        let (heads, dim) = (config.num_key_value_heads, config.head_dim);
        for (name, before) in &untouched {
            let after = values[name].to_f64_vec().unwrap();
            let at = |slot: usize, h: usize, p: usize| ((slot * heads + h) * MAX_SEQ + p) * dim;
            for slot in 0..SLOTS {
                let named = sequences.iter().any(|&(s, _)| s == slot);
                let written = if named { total } else { 0 };
                for h in 0..heads {
                    let range = at(slot, h, written)..at(slot, h, MAX_SEQ);
                    assert_eq!(
                        after[range.clone()],
                        before[range],
                        "{name} slot {slot} head {h}"
                    );
                }
            }
        }
    }
}
