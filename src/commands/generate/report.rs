//! The `--json OUT` report of `kiln generate`: one entry per prompt, in prompt order, and a
//! summary with P50/P95 latencies (linear interpolation between order statistics, as numpy's
//! default `percentile`). Latencies count from the submission of every request at the start
//! of the run: the serial reference serves them one after another, so a later request waits.

use kiln_engine::scheduler::metrics::quantile;
use serde::Serialize;

/// One request's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct RequestRecord {
    pub index: usize,
    pub tokens: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub finish_reason: kiln_engine::stop::FinishReason,
    pub first_token_ms: f64,
    pub total_ms: f64,
}

/// P50 and P95 of one latency, milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub requests: usize,
    pub generated_tokens: usize,
    pub wall_ms: f64,
    pub tokens_per_second: f64,
    pub first_token_ms: Percentiles,
    pub total_ms: Percentiles,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub requests: Vec<RequestRecord>,
    pub summary: Summary,
}

impl Report {
    pub fn new(requests: Vec<RequestRecord>, wall_ms: f64) -> Report {
        let generated_tokens = requests.iter().map(|r| r.tokens.len()).sum();
        // The engine's quantiles (linear interpolation); 0 when there is no request.
        let percentile = |values: &[f64], q| quantile(values, q).unwrap_or(0.0);
        let percentiles = |values: Vec<f64>| Percentiles {
            p50: percentile(&values, 0.50),
            p95: percentile(&values, 0.95),
        };
        let summary = Summary {
            requests: requests.len(),
            generated_tokens,
            wall_ms,
            tokens_per_second: generated_tokens as f64 / (wall_ms / 1e3),
            first_token_ms: percentiles(requests.iter().map(|r| r.first_token_ms).collect()),
            total_ms: percentiles(requests.iter().map(|r| r.total_ms).collect()),
        };
        Report { requests, summary }
    }
}
