//! Serial generation: one request at a time, each with its own B=1 KV cache, on compiled
//! programs — the prefill of its prompt's length and one decode step, each compiled (and, in
//! graph mode, captured) once and replayed for every request and token. This is the reference
//! the batching schedulers are checked against; its own reference is a plain greedy loop over
//! the eager oracle's full forward (the tests).
//!
//! A request: its prompt's ids run through prefill, which fills the cache rows `0..T` and gives
//! the last position's logits; the cache moves to the decode program; then each step samples a
//! token from the logits (the request's own [`Sampler`]), asks the [`StopChecker`] whether to
//! finish, and otherwise decodes the token at the next position. Cache rows past a request's
//! position are never read (attention sees rows `0..=position`), so a cache is not cleared
//! between requests.

use std::collections::BTreeMap;

use kiln_frontend::model::{ModelConfig, ModelWeights, Precision};
use kiln_frontend::programs::{build, ProgramKind, ProgramOptions};
use kiln_frontend::Var;
use kiln_ir::InputKind;
use kiln_runtime::{Backend, Executable, RunMode, Tensor};

use crate::error::{Error, Result};
use crate::sampler::Sampler;
use crate::stop::{StopCause, StopChecker};
use crate::tokenizer::Tokenizer;

/// One compiled program with its weights set.
struct Compiled {
    exe: Box<dyn Executable>,
    caches: Vec<String>,
}

/// What one request produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Generated {
    /// The generated ids (the end-of-sequence token that stopped it included).
    pub tokens: Vec<u32>,
    pub cause: StopCause,
}

/// What every program of a generator is compiled from.
struct Setup {
    config: ModelConfig,
    weights: Vec<(String, Tensor)>,
    backend: Backend,
    precision: Precision,
    max_seq: usize,
}

/// The serial reference generator (see the module doc).
pub struct ReferenceGenerator {
    setup: Setup,
    mode: RunMode,
    decode: Compiled,
    prefills: BTreeMap<usize, Compiled>,
}

impl ReferenceGenerator {
    /// A generator for `config` with `weights` on `backend`, caches of `max_seq` rows (a
    /// request's prompt and generated tokens together fit in them), programs run per `mode`.
    pub fn new(
        (config, weights): (&ModelConfig, &ModelWeights<Var>),
        backend: Backend,
        (mode, precision): (RunMode, Precision),
        max_seq: usize,
    ) -> Result<Self> {
        let weights: Vec<(String, Tensor)> = (weights.named().into_iter())
            .map(|(name, var)| (name, var.value().clone()))
            .collect();
        let setup = Setup {
            config: config.clone(),
            weights,
            backend,
            precision,
            max_seq,
        };
        Ok(ReferenceGenerator {
            decode: setup.compile(ProgramKind::Decode, 1)?,
            setup,
            mode,
            prefills: BTreeMap::new(),
        })
    }

    /// Rows of every request's KV cache: its prompt and generated tokens together.
    pub fn max_seq(&self) -> usize {
        self.setup.max_seq
    }

    /// Generates for `prompt` until `stop` says so, drawing each token with `sampler`; each
    /// token is passed to `on_token` as it comes, with the text it completes when a
    /// `tokenizer` is given (see [`Tokenizer::stream`]). Bad requests are refused before
    /// anything runs.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        (sampler, stop): (&mut Sampler, &mut StopChecker),
        tokenizer: Option<&Tokenizer>,
        mut on_token: impl FnMut(u32, Option<&str>) -> Result<()>,
    ) -> Result<Generated> {
        self.check(prompt, stop.criteria().max_new_tokens)?;
        let mut logits = self.prefill_prompt(prompt)?;
        let mut context: Vec<u32> = prompt.to_vec();
        let mut tokens = Vec::new();
        let mut stream = tokenizer.map(|t| t.stream(true));
        let mut text = String::new();
        loop {
            let token = sampler.sample(&logits, &context)?;
            tokens.push(token);
            context.push(token);
            let piece = match stream.as_mut() {
                Some(stream) => stream.step(token)?,
                None => None,
            };
            if let Some(piece) = &piece {
                text.push_str(piece);
            }
            on_token(token, piece.as_deref())?;
            if let Some(cause) = stop.check(token, tokenizer.map(|_| text.as_str())) {
                return Ok(Generated { tokens, cause });
            }
            logits = self.decode_token(token, context.len() - 1)?;
        }
    }

    /// Runs `prompt` (checked by the caller) through its prefill program, which starts the
    /// cache, and moves the cache to the decode program; returns the last position's logits.
    pub(crate) fn prefill_prompt(&mut self, prompt: &[u32]) -> Result<Vec<f32>> {
        let length = prompt.len();
        if !self.prefills.contains_key(&length) {
            let compiled = self.setup.compile(ProgramKind::Prefill, length)?;
            self.prefills.insert(length, compiled);
        }
        let prefill = self
            .prefills
            .get_mut(&length)
            .ok_or_else(|| Error::Generate {
                reason: format!("no prefill program for {length} tokens"),
            })?;
        let ids: Vec<i64> = prompt.iter().map(|&id| i64::from(id)).collect();
        let positions: Vec<i64> = (0..length as i64).collect();
        prefill
            .exe
            .set("tokens", &Tensor::from_vec(ids, [1, length])?)?;
        prefill
            .exe
            .set("positions", &Tensor::from_vec(positions, [1, length])?)?;
        // The prompt's rows start the cache.
        prefill
            .exe
            .set("cache_positions", &Tensor::from_vec(vec![0i64], [1])?)?;
        prefill.exe.run(self.mode)?;
        let logits = prefill.exe.get("logits")?;
        for name in &prefill.caches {
            self.decode.exe.set(name, &prefill.exe.get(name)?)?;
        }
        Ok(logits.to_vec::<f32>()?)
    }

    /// Feeds `token` at `position` through the decode program; returns the logits.
    pub(crate) fn decode_token(&mut self, token: u32, position: usize) -> Result<Vec<f32>> {
        let exe = &mut self.decode.exe;
        exe.set("tokens", &Tensor::from_vec(vec![i64::from(token)], [1, 1])?)?;
        exe.set("positions", &Tensor::from_vec(vec![position as i64], [1])?)?;
        exe.run(self.mode)?;
        Ok(exe.get("logits")?.to_vec::<f32>()?)
    }

    /// Refuses an empty prompt, an id outside the vocabulary and a request that does not fit
    /// the cache, naming the numbers.
    pub(crate) fn check(&self, prompt: &[u32], max_new_tokens: usize) -> Result<()> {
        let refuse = |reason: String| Err(Error::Request { reason });
        let vocab = self.setup.config.vocab_size;
        if prompt.is_empty() {
            return refuse("the prompt is empty: it needs at least one token".to_string());
        }
        if let Some(at) = prompt.iter().position(|&id| id as usize >= vocab) {
            let id = prompt[at];
            return refuse(format!(
                "prompt token {at} is {id}, outside the vocabulary of {vocab}"
            ));
        }
        // The last generated token is never decoded, so the cache holds one row less.
        let rows = prompt
            .len()
            .saturating_add(max_new_tokens)
            .saturating_sub(1);
        if rows > self.setup.max_seq {
            return refuse(format!(
                "{} prompt tokens and up to {max_new_tokens} new ones need {rows} cache rows, \
                 more than the {} the generator was made with",
                prompt.len(),
                self.setup.max_seq
            ));
        }
        Ok(())
    }
}

impl Setup {
    /// `kind` for B=1 and `seq` tokens, compiled, with the weights and (empty) caches set.
    fn compile(&self, kind: ProgramKind, seq: usize) -> Result<Compiled> {
        let options = ProgramOptions {
            batch: 1,
            seq,
            max_seq: Some(self.max_seq),
            precision: self.precision,
            ..ProgramOptions::default()
        };
        let graph = build(kind, &self.config, &options)?;
        let plan = kiln_planner::plan(
            &graph,
            &kiln_planner::PlanOptions::default(),
            &self.backend.workspaces(),
        )?;
        let mut exe = self.backend.compile(&graph, &plan)?;
        for (name, tensor) in &self.weights {
            exe.set(name, tensor)?;
        }
        let mut caches = Vec::new();
        for (_, name, input_kind, ty) in graph.inputs() {
            if input_kind == InputKind::State {
                let empty = Tensor::zeros(ty.shape.clone(), ty.dtype, kiln_runtime::Device::Cpu);
                exe.set(name, &empty)?;
                caches.push(name.to_string());
            }
        }
        Ok(Compiled { exe, caches })
    }
}

#[cfg(test)]
#[path = "generate_tests.rs"]
mod tests;
