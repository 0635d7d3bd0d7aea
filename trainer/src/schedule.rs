//! Learning-rate schedules, as Hugging Face transformers' `get_*_schedule_with_warmup` define
//! them: a multiplier of the base rate by optimizer step, warmup rising linearly from 0.
//!
//! transformers steps its scheduler after each optimizer step, so optimizer step `k` (counted
//! from 1) runs at `lambda(k − 1)`: with warmup, the first step's rate is 0, as there.

use serde::{Deserialize, Serialize};

/// The shape of the rate after warmup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decay {
    /// Half a cosine from the base rate to 0 at the last step.
    Cosine,
    /// A straight line from the base rate to 0 at the last step.
    Linear,
    /// The base rate.
    Constant,
}

impl Decay {
    pub fn name(self) -> &'static str {
        match self {
            Decay::Cosine => "cosine",
            Decay::Linear => "linear",
            Decay::Constant => "constant",
        }
    }
}

/// A schedule over `steps` optimizer steps.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub lr: f64,
    pub warmup: u64,
    pub steps: u64,
    pub decay: Decay,
}

impl Schedule {
    /// The rate of optimizer step `step` (from 1).
    pub fn lr_at(&self, step: u64) -> f64 {
        self.lr * self.lambda(step.saturating_sub(1))
    }

    /// transformers' `lr_lambda(current_step)`.
    fn lambda(&self, current: u64) -> f64 {
        let (current, warmup, total) = (current as f64, self.warmup as f64, self.steps as f64);
        if current < warmup {
            return current / warmup.max(1.0);
        }
        let remaining = (total - warmup).max(1.0);
        match self.decay {
            Decay::Constant => 1.0,
            Decay::Linear => ((total - current) / remaining).max(0.0),
            Decay::Cosine => {
                let progress = (current - warmup) / remaining;
                (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(decay: Decay) -> Schedule {
        Schedule {
            lr: 1e-3,
            warmup: 4,
            steps: 20,
            decay,
        }
    }

    /// Values of transformers 4.x/5.x `get_{cosine,linear,constant}_schedule_with_warmup` for
    /// warmup 4 over 20 steps, at scheduler counts 0, 2, 4, 12 and 19 (written out from the
    /// formulas they document).
    #[test]
    fn rates_follow_transformers_schedules() {
        let at = |decay, count: u64| schedule(decay).lr_at(count + 1) / 1e-3;
        for decay in [Decay::Cosine, Decay::Linear, Decay::Constant] {
            assert_eq!(at(decay, 0), 0.0, "{decay:?}: warmup starts at 0");
            assert_eq!(at(decay, 2), 0.5, "{decay:?}");
            assert_eq!(at(decay, 4), 1.0, "{decay:?}: warmup ends at the base rate");
        }
        assert!((at(Decay::Cosine, 12) - 0.5).abs() < 1e-15);
        assert!((at(Decay::Linear, 12) - 0.5).abs() < 1e-15);
        assert_eq!(at(Decay::Constant, 19), 1.0);
        let cosine_last = 0.5 * (1.0 + (std::f64::consts::PI * 15.0 / 16.0).cos());
        assert!((at(Decay::Cosine, 19) - cosine_last).abs() < 1e-15);
        assert!((at(Decay::Linear, 19) - 1.0 / 16.0).abs() < 1e-15);
    }

    #[test]
    fn no_warmup_starts_at_the_base_rate_and_never_goes_negative() {
        let s = Schedule {
            warmup: 0,
            ..schedule(Decay::Linear)
        };
        assert_eq!(s.lr_at(1), 1e-3);
        assert_eq!(s.lr_at(25), 0.0);
        let c = Schedule {
            warmup: 0,
            ..schedule(Decay::Cosine)
        };
        assert!(c.lr_at(40) >= 0.0);
    }
}
