//! `/metrics`: the server's Prometheus metrics (OpenMetrics text, which Prometheus scrapes),
//! named after vLLM's: latency histograms, the running and waiting requests, token totals,
//! and requests refused and finished by reason.

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

type Labels = Vec<(&'static str, &'static str)>;

/// Every metric, shared by the HTTP side and the engine thread.
pub struct Metrics {
    registry: Registry,
    time_to_first_token: Histogram,
    inter_token_latency: Histogram,
    request_latency: Histogram,
    running: Gauge,
    waiting: Gauge,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    refused: Family<Labels, Counter>,
    finished: Family<Labels, Counter>,
}

/// Latency buckets, seconds: 0.5 ms to 2 minutes, finest where decode steps fall.
const BUCKETS: [f64; 21] = [
    0.0005, 0.001, 0.0015, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

fn histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kiln");
        let metrics = Metrics {
            time_to_first_token: histogram(),
            inter_token_latency: histogram(),
            request_latency: histogram(),
            running: Gauge::default(),
            waiting: Gauge::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            refused: Family::default(),
            finished: Family::default(),
            registry: Registry::default(),
        };
        let seconds = [
            (
                "time_to_first_token",
                "Submission to first generated token",
                &metrics.time_to_first_token,
            ),
            (
                "inter_token_latency",
                "Between consecutive tokens of one request",
                &metrics.inter_token_latency,
            ),
            (
                "e2e_request_latency",
                "Submission to the request's last event",
                &metrics.request_latency,
            ),
        ];
        for (name, help, histogram) in seconds {
            registry.register_with_unit(name, help, Unit::Seconds, histogram.clone());
        }
        registry.register(
            "requests_running",
            "Requests holding a KV slot",
            metrics.running.clone(),
        );
        registry.register(
            "requests_waiting",
            "Requests queued for a slot",
            metrics.waiting.clone(),
        );
        registry.register(
            "prompt_tokens",
            "Prompt tokens of admitted requests",
            metrics.prompt_tokens.clone(),
        );
        registry.register(
            "generation_tokens",
            "Tokens generated",
            metrics.generation_tokens.clone(),
        );
        registry.register(
            "requests_refused",
            "Requests refused, by reason",
            metrics.refused.clone(),
        );
        registry.register(
            "requests_finished",
            "Requests finished, by finish reason",
            metrics.finished.clone(),
        );
        Metrics {
            registry,
            ..metrics
        }
    }

    /// The OpenMetrics text of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }

    pub fn first_token(&self, after: Duration) {
        self.time_to_first_token.observe(after.as_secs_f64());
    }

    pub fn next_token(&self, after: Duration) {
        self.inter_token_latency.observe(after.as_secs_f64());
    }

    pub fn generated(&self) {
        self.generation_tokens.inc();
    }

    pub fn admitted(&self, prompt_tokens: usize) {
        self.prompt_tokens.inc_by(prompt_tokens as u64);
    }

    pub fn finished(&self, reason: &'static str, after: Duration) {
        self.request_latency.observe(after.as_secs_f64());
        self.finished
            .get_or_create(&vec![("finish_reason", reason)])
            .inc();
    }

    pub fn refused(&self, reason: &'static str) {
        self.refused.get_or_create(&vec![("reason", reason)]).inc();
    }

    pub fn load(&self, running: usize, waiting: usize) {
        self.running.set(running as i64);
        self.waiting.set(waiting as i64);
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
