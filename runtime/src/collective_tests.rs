use std::thread;
use std::time::Duration;

use rand::{Rng, SeedableRng};

use super::*;

fn random(rng: &mut rand_chacha::ChaCha8Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-2.0f32..2.0)).collect()
}

/// Runs `body(rank)` on every rank of a world of `size` in its own thread.
fn on_every_rank<T: Send>(
    ranks: Vec<Rank>,
    body: impl Fn(&Rank) -> Result<T> + Sync,
) -> Vec<Result<T>> {
    thread::scope(|s| {
        let handles: Vec<_> = (ranks.iter()).map(|rank| s.spawn(|| body(rank))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn every_rank_gets_the_sum_in_rank_order_for_many_calls() {
    let size = 3;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    // Per rank, per call, two tensors of 5 and 2x3 values.
    let inputs: Vec<Vec<[Vec<f32>; 2]>> = (0..size)
        .map(|_| {
            (0..4)
                .map(|_| [random(&mut rng, 5), random(&mut rng, 6)])
                .collect()
        })
        .collect();
    let results = on_every_rank(World::ranks(size).unwrap(), |rank| {
        let mut sums = Vec::new();
        for call in &inputs[rank.rank()] {
            let a = Tensor::from_vec(call[0].clone(), [5])?;
            let b = Tensor::from_vec(call[1].clone(), [2, 3])?;
            let out = rank.all_reduce(&[a, b])?;
            assert_eq!(out[1].dims(), &[2, 3]);
            sums.push([out[0].to_vec::<f32>()?, out[1].to_vec::<f32>()?]);
        }
        Ok(sums)
    });
    for (call, _) in inputs[0].iter().enumerate() {
        for t in 0..2 {
            let mut want = inputs[0][call][t].clone();
            for rank in &inputs[1..] {
                for (w, x) in want.iter_mut().zip(&rank[call][t]) {
                    *w += x;
                }
            }
            for result in &results {
                let got = &result.as_ref().unwrap()[call][t];
                // Bit for bit: the same order of additions on every rank.
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                );
            }
        }
    }
}

#[test]
fn a_world_of_one_and_solo_are_the_identity() {
    let x = Tensor::from_vec(vec![1.5f32, -0.25, 3.0], [3]).unwrap();
    let ranks = World::ranks(1).unwrap();
    assert_eq!(
        ranks[0].all_reduce(std::slice::from_ref(&x)).unwrap()[0]
            .to_vec::<f32>()
            .unwrap(),
        [1.5, -0.25, 3.0]
    );
    assert_eq!(
        Solo.all_reduce(&[x]).unwrap()[0].to_vec::<f32>().unwrap(),
        [1.5, -0.25, 3.0]
    );
    assert!(World::ranks(0).is_err());
}

#[test]
fn a_failed_rank_releases_the_others_with_its_reason() {
    let results = on_every_rank(World::ranks(3).unwrap(), |rank| {
        if rank.rank() == 1 {
            rank.abort("its input file was truncated");
            return Err(Error::Collective {
                rank: 1,
                reason: "failed".into(),
            });
        }
        rank.all_reduce(&[Tensor::from_vec(vec![1.0f32], [1])?])
    });
    for rank in [0, 2] {
        let err = results[rank].as_ref().unwrap_err().to_string();
        assert!(
            err.contains("rank 1 failed: its input file was truncated"),
            "{err}"
        );
    }
}

#[test]
fn a_missing_rank_is_named_after_the_deadline() {
    let ranks = World::ranks_with_deadline(2, Duration::from_millis(50)).unwrap();
    let x = Tensor::from_vec(vec![1.0f32], [1]).unwrap();
    let err = ranks[0].all_reduce(&[x]).unwrap_err().to_string();
    assert!(err.contains("ranks not there yet: 1"), "{err}");
}

#[test]
fn ranks_bringing_different_sizes_are_refused_and_non_f32_too() {
    let results = on_every_rank(World::ranks(2).unwrap(), |rank| {
        let n = 2 + rank.rank();
        rank.all_reduce(&[Tensor::from_vec(vec![1.0f32; n], [n])?])
    });
    let err = results[0].as_ref().unwrap_err().to_string();
    assert!(err.contains("[3] elements"), "{err}");
    let ints = Tensor::from_vec(vec![1i64, 2], [2]).unwrap();
    assert!(Solo
        .all_reduce(&[ints])
        .unwrap_err()
        .to_string()
        .contains("f32"));
}

#[test]
fn rank_zeros_bytes_reach_every_rank_exactly() {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
    let message: Vec<u8> = (0..1000).map(|_| rng.random()).collect();
    for sent in [message.clone(), Vec::new(), vec![255; 3]] {
        let got = on_every_rank(World::ranks(3).unwrap(), |rank| {
            // What the other ranks pass is not read.
            let mine = if rank.rank() == 0 {
                sent.clone()
            } else {
                vec![7; 5]
            };
            rank.broadcast(&mine)
        });
        for bytes in got {
            assert_eq!(bytes.unwrap(), sent);
        }
    }
    assert_eq!(Solo.broadcast(&message).unwrap(), message);
}
