//! Choosing each next token of one request from the model's logits, in the order of Hugging
//! Face `generate`'s logits processors: repetition penalty, temperature, top-k, top-p, min-p,
//! then one draw from the renormalized distribution.
//!
//! Determinism: a [`Sampler`] owns a ChaCha8 generator seeded from its request's seed and takes
//! exactly one `f64` from it per sampled (non-greedy) token, so a request's tokens depend only
//! on its seed, its logits and its context, never on what other requests of a batch do.
//! Probabilities are computed in `f64` and summed in a fixed order.
//!
//! Where kiln differs from HF, on purpose:
//! - top-k keeps exactly `k` tokens, ties at the cut going to the lowest id (HF keeps every
//!   token tied with the k-th), so `top_k = 1` is always greedy; top-p ranks ties the same way.
//! - Logits of +inf: the +inf tokens share the whole probability equally (the limit of the
//!   softmax as their logits grow together) and the finite ones get none; HF's softmax would
//!   give NaN. Tokens at −inf have probability 0 and are never drawn; if every logit is −inf
//!   the step is an error.
//! - A context token outside the vocabulary is an error (HF's `gather` fails on it too).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};
use crate::sampling::SamplingParams;

/// One token still in the running, with its (penalized, tempered) logit, and after
/// [`weigh`] its unnormalized probability.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: u32,
    logit: f64,
    weight: f64,
}

/// The sampler of one request: its parameters, its own random generator and scratch space.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    scores: Vec<f32>,
    candidates: Vec<Candidate>,
}

impl Sampler {
    /// A sampler for `params`, refused if a parameter is out of range.
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Ok(Self {
            params,
            rng,
            scores: Vec::new(),
            candidates: Vec::new(),
        })
    }

    /// Frees the scratch sized by the vocabulary (a finished request keeps its sampler only
    /// for its parameters).
    pub fn release(&mut self) {
        self.scores = Vec::new();
        self.candidates = Vec::new();
    }

    /// The parameters this sampler was made with.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for `logits` (one per vocabulary entry) after `context` (the prompt and
    /// the tokens generated so far, which the repetition penalty looks at).
    pub fn sample(&mut self, logits: &[f32], context: &[u32]) -> Result<u32> {
        check_logits(logits)?;
        self.scores.clear();
        self.scores.extend_from_slice(logits);
        apply_repetition_penalty(&mut self.scores, context, self.params.repetition_penalty)?;
        if self.params.is_greedy() {
            return argmax(&self.scores);
        }
        self.collect_candidates()?;
        self.keep_top_k();
        self.keep_top_p();
        self.keep_min_p();
        let total = weigh(&mut self.candidates);
        let target = self.rng.random::<f64>() * total;
        Ok(draw(&self.candidates, target))
    }

    /// Fills the candidates with every token of nonzero probability and its tempered logit.
    fn collect_candidates(&mut self) -> Result<()> {
        self.candidates.clear();
        let temperature = f64::from(self.params.temperature);
        let any_positive_infinity = self.scores.contains(&f32::INFINITY);
        for (id, &score) in (0u32..).zip(&self.scores) {
            let logit = if any_positive_infinity {
                if score != f32::INFINITY {
                    continue;
                }
                0.0
            } else {
                if score == f32::NEG_INFINITY {
                    continue;
                }
                f64::from(score) / temperature
            };
            self.candidates.push(Candidate {
                id,
                logit,
                weight: 0.0,
            });
        }
        if self.candidates.is_empty() {
            return Err(Error::NoCandidate {
                vocab_size: self.scores.len(),
            });
        }
        Ok(())
    }

    fn keep_top_k(&mut self) {
        let k = self.params.top_k;
        if k == 0 || k >= self.candidates.len() {
            return;
        }
        self.candidates.select_nth_unstable_by(k - 1, rank);
        self.candidates.truncate(k);
    }

    /// Keeps the most likely candidates up to and including the first whose cumulative
    /// probability reaches `top_p`.
    fn keep_top_p(&mut self) {
        let top_p = f64::from(self.params.top_p);
        if top_p >= 1.0 {
            return;
        }
        self.candidates.sort_unstable_by(rank);
        let total = weigh(&mut self.candidates);
        let mut cumulative = 0.0;
        let mut kept = self.candidates.len();
        for (index, candidate) in self.candidates.iter().enumerate() {
            cumulative += candidate.weight / total;
            if cumulative >= top_p {
                kept = index + 1;
                break;
            }
        }
        self.candidates.truncate(kept);
    }

    /// Drops candidates whose probability is below `min_p` times the top probability; the most
    /// likely candidate always stays (its weight is exactly 1).
    fn keep_min_p(&mut self) {
        let min_p = f64::from(self.params.min_p);
        if min_p <= 0.0 {
            return;
        }
        weigh(&mut self.candidates);
        self.candidates.retain(|c| c.weight >= min_p);
    }
}

/// Applies the HF / CTRL repetition penalty to `scores` in place: each distinct token of
/// `context` has its logit divided by `penalty` if positive and multiplied by it otherwise
/// (`transformers.RepetitionPenaltyLogitsProcessor`). A penalty of 1 changes nothing.
pub fn apply_repetition_penalty(scores: &mut [f32], context: &[u32], penalty: f32) -> Result<()> {
    let vocab_size = scores.len();
    if penalty == 1.0 {
        return check_context(context, vocab_size);
    }
    let mut penalized = vec![false; vocab_size];
    for (position, &token) in context.iter().enumerate() {
        let Some(seen) = penalized.get_mut(token as usize) else {
            return Err(Error::ContextToken {
                token,
                position,
                vocab_size,
            });
        };
        if *seen {
            continue;
        }
        *seen = true;
        let score = &mut scores[token as usize];
        *score = if *score < 0.0 {
            *score * penalty
        } else {
            *score / penalty
        };
    }
    Ok(())
}

/// Refuses a context token outside a vocabulary of `vocab_size`.
fn check_context(context: &[u32], vocab_size: usize) -> Result<()> {
    match context.iter().position(|&t| t as usize >= vocab_size) {
        Some(position) => Err(Error::ContextToken {
            token: context[position],
            position,
            vocab_size,
        }),
        None => Ok(()),
    }
}

/// Refuses empty logits and logits holding NaN, naming the first NaN's position.
fn check_logits(logits: &[f32]) -> Result<()> {
    if logits.is_empty() {
        return Err(Error::EmptyVocabulary);
    }
    if let Some(position) = logits.iter().position(|l| l.is_nan()) {
        return Err(Error::NanLogit {
            position,
            vocab_size: logits.len(),
        });
    }
    Ok(())
}

/// The id of the largest score, ties to the lowest id; refused if every score is −inf.
fn argmax(scores: &[f32]) -> Result<u32> {
    let mut best: Option<(u32, f32)> = None;
    for (id, &score) in (0u32..).zip(scores) {
        if score > best.map_or(f32::NEG_INFINITY, |(_, s)| s) {
            best = Some((id, score));
        }
    }
    best.map(|(id, _)| id).ok_or(Error::NoCandidate {
        vocab_size: scores.len(),
    })
}

/// Most likely first; equal logits by lowest id, so the order is total and reproducible.
fn rank(a: &Candidate, b: &Candidate) -> std::cmp::Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Sets each candidate's weight to `exp(logit - max logit)` and returns their sum (at least 1,
/// from the most likely candidate).
fn weigh(candidates: &mut [Candidate]) -> f64 {
    let max = candidates
        .iter()
        .map(|c| c.logit)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    for candidate in candidates.iter_mut() {
        candidate.weight = (candidate.logit - max).exp();
        total += candidate.weight;
    }
    total
}

/// The candidate whose cumulative-weight interval holds `target` (in `[0, total)`); rounding at
/// the top end falls to the last candidate of positive weight.
fn draw(candidates: &[Candidate], target: f64) -> u32 {
    let mut cumulative = 0.0;
    let mut last_possible = candidates.first().map_or(0, |c| c.id);
    for candidate in candidates {
        if candidate.weight > 0.0 {
            cumulative += candidate.weight;
            last_possible = candidate.id;
            if target < cumulative {
                return candidate.id;
            }
        }
    }
    last_possible
}

#[cfg(test)]
#[path = "sampler_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "sampler_distribution_tests.rs"]
mod distribution_tests;
