//! The sampling parameters of one request, with the meaning and defaults of Hugging Face
//! `generate` (`transformers.GenerationConfig`).
//!
//! Each parameter switches off at its neutral value, so the defaults sample from the model's
//! own distribution: temperature 1.0, `top_k` 0 (off; HF's default of 50 reaches a request
//! only through a model's `generation_config.json`, see
//! [`GenerationConfig`](crate::generation_config::GenerationConfig)), `top_p` 1.0, `min_p` 0.0
//! and `repetition_penalty` 1.0. A temperature of 0 means greedy decoding (HF's
//! `do_sample=False`): the most likely token after the repetition penalty, which HF applies in
//! greedy search too. The seed makes the request's draws reproducible; [`Sampler`] draws from
//! a generator of its own, so other requests in a batch never change them.
//!
//! [`Sampler`]: crate::sampler::Sampler

use crate::error::{Error, Result};

/// How one request chooses each next token from the logits.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// Divides the logits before the softmax: below 1 sharpens, above 1 flattens; 0 is greedy.
    pub temperature: f32,
    /// Keeps only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keeps the smallest set of most likely tokens whose probability reaches `top_p`; 1 keeps
    /// all.
    pub top_p: f32,
    /// Drops tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Penalizes every token already in the context (HF / CTRL): a positive logit is divided by
    /// it, a negative one multiplied; 1 leaves the logits as they are.
    pub repetition_penalty: f32,
    /// Seeds the request's own random generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding: always the most likely token, ties to the lowest id.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether these parameters choose the argmax instead of drawing.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// Refuses a parameter outside the range it is defined on, naming the parameter, its value
    /// and the valid range.
    pub fn validate(&self) -> Result<()> {
        let out_of_range = |parameter, value, valid| {
            Err(Error::SamplingParameter {
                parameter,
                value,
                valid,
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return out_of_range(
                "temperature",
                self.temperature,
                "finite and >= 0 (0 is greedy)",
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return out_of_range("top_p", self.top_p, "in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return out_of_range("min_p", self.min_p, "in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return out_of_range(
                "repetition_penalty",
                self.repetition_penalty,
                "finite and > 0",
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameter named by a validation error, with its message.
    fn refused(params: SamplingParams) -> (&'static str, String) {
        match params.validate() {
            Err(err @ Error::SamplingParameter { parameter, .. }) => (parameter, err.to_string()),
            other => panic!("expected a SamplingParameter error, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_hugging_face_neutral_values_and_valid() {
        let params = SamplingParams::default();
        assert_eq!(params.temperature, 1.0);
        assert_eq!(params.top_k, 0);
        assert_eq!(params.top_p, 1.0);
        assert_eq!(params.min_p, 0.0);
        assert_eq!(params.repetition_penalty, 1.0);
        assert!(!params.is_greedy());
        assert!(params.validate().is_ok());
        assert!(SamplingParams::greedy().is_greedy());
        assert!(SamplingParams::greedy().validate().is_ok());
    }

    #[test]
    fn boundary_values_inside_the_ranges_are_accepted() {
        let params = SamplingParams {
            temperature: 0.0,
            top_k: 1,
            top_p: f32::MIN_POSITIVE,
            min_p: 1.0,
            repetition_penalty: f32::MIN_POSITIVE,
            seed: u64::MAX,
        };
        assert!(params.validate().is_ok());
    }

    #[test]
    fn out_of_range_values_are_refused_naming_parameter_value_and_range() {
        let base = SamplingParams::default();
        let cases = [
            (
                SamplingParams {
                    temperature: -0.5,
                    ..base.clone()
                },
                "temperature",
                "-0.5",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..base.clone()
                },
                "temperature",
                "NaN",
            ),
            (
                SamplingParams {
                    temperature: f32::INFINITY,
                    ..base.clone()
                },
                "temperature",
                "inf",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..base.clone()
                },
                "top_p",
                "(0, 1]",
            ),
            (
                SamplingParams {
                    top_p: 1.5,
                    ..base.clone()
                },
                "top_p",
                "1.5",
            ),
            (
                SamplingParams {
                    top_p: f32::NAN,
                    ..base.clone()
                },
                "top_p",
                "NaN",
            ),
            (
                SamplingParams {
                    min_p: -0.1,
                    ..base.clone()
                },
                "min_p",
                "[0, 1]",
            ),
            (
                SamplingParams {
                    min_p: 1.01,
                    ..base.clone()
                },
                "min_p",
                "1.01",
            ),
            (
                SamplingParams {
                    min_p: f32::NAN,
                    ..base.clone()
                },
                "min_p",
                "NaN",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..base.clone()
                },
                "repetition_penalty",
                "> 0",
            ),
            (
                SamplingParams {
                    repetition_penalty: -1.0,
                    ..base.clone()
                },
                "repetition_penalty",
                "-1",
            ),
            (
                SamplingParams {
                    repetition_penalty: f32::INFINITY,
                    ..base.clone()
                },
                "repetition_penalty",
                "inf",
            ),
        ];
        for (params, parameter, in_message) in cases {
            let (named, message) = refused(params);
            assert_eq!(named, parameter, "{message}");
            assert!(
                message.contains(parameter),
                "`{message}` should name {parameter}"
            );
            assert!(
                message.contains(in_message),
                "`{message}` should contain `{in_message}`"
            );
        }
    }
}
