//! Workloads through a scheduler and their report: requests submitted at logical arrival
//! steps, run until every one finishes, with each request's latencies kept raw and P50/P95
//! derived by linear interpolation.

use std::time::Instant;

use serde::Serialize;

use super::{Outcome, Request, RequestId, Scheduler};
use crate::error::{Error, Result};

/// One request of a workload and the step at which it arrives.
#[derive(Clone, Debug, PartialEq)]
pub struct Arrival {
    pub step: usize,
    pub request: Request,
}

/// The `q` quantile (0 to 1) of `values` by linear interpolation between the closest ranks
/// (NumPy's default); `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
    sorted.sort_by(f64::total_cmp);
    let last = sorted.len().checked_sub(1)?;
    let rank = q.clamp(0.0, 1.0) * last as f64;
    let (below, above) = (rank.floor() as usize, rank.ceil() as usize);
    let weight = rank - below as f64;
    Some(sorted[below] + (sorted[above] - sorted[below]) * weight)
}

/// P50 and P95 of some latencies, seconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p95: f64,
}

impl Percentiles {
    pub fn of(values: &[f64]) -> Option<Self> {
        Some(Percentiles {
            p50: quantile(values, 0.5)?,
            p95: quantile(values, 0.95)?,
        })
    }
}

/// What a workload did: every request's outcome in submission order, the steps and the wall
/// time it took.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadReport {
    pub outcomes: Vec<Outcome>,
    pub steps: usize,
    pub seconds: f64,
}

impl WorkloadReport {
    /// Generated tokens over the whole workload.
    pub fn tokens(&self) -> usize {
        self.outcomes.iter().map(|o| o.tokens.len()).sum()
    }

    /// Generated tokens per second of wall time.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens() as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }

    /// Submission → first token, seconds, per request that got one.
    pub fn first_token(&self) -> Vec<f64> {
        self.outcomes
            .iter()
            .filter_map(|o| o.first_token_s)
            .collect()
    }

    /// Submission → finish, seconds, per finished request.
    pub fn total(&self) -> Vec<f64> {
        self.outcomes.iter().filter_map(|o| o.total_s).collect()
    }

    /// Mean seconds between a request's tokens after its first, per request of two or more.
    pub fn inter_token(&self) -> Vec<f64> {
        (self.outcomes.iter())
            .filter_map(|o| {
                let gaps = o.tokens.len().checked_sub(1).filter(|&g| g > 0)?;
                Some((o.total_s? - o.first_token_s?) / gaps as f64)
            })
            .collect()
    }
}

/// Runs `arrivals` through `scheduler`: each request is submitted at the start of its arrival
/// step, then steps run until every request has finished. A step that makes no progress while
/// requests wait is an error, never a hang.
pub fn run_workload(
    scheduler: &mut dyn Scheduler,
    arrivals: &[Arrival],
    mut on_step: impl FnMut(usize),
) -> Result<WorkloadReport> {
    let mut order: Vec<usize> = (0..arrivals.len()).collect();
    order.sort_by_key(|&i| arrivals[i].step);
    let mut ids: Vec<Option<RequestId>> = vec![None; arrivals.len()];
    let (start, mut step, mut next) = (Instant::now(), 0, 0);
    while next < order.len() || !scheduler.is_idle() {
        // Nothing runs until the next arrival: go straight to it.
        if scheduler.is_idle() {
            step = step.max(arrivals[order[next]].step);
        }
        while next < order.len() && arrivals[order[next]].step <= step {
            let index = order[next];
            ids[index] = Some(scheduler.submit(arrivals[index].request.clone())?);
            next += 1;
        }
        let events = scheduler.step()?;
        if events.is_empty() && !scheduler.is_idle() {
            return Err(Error::Generate {
                reason: format!("step {step} made no progress with requests waiting"),
            });
        }
        step += 1;
        on_step(step);
    }
    let outcomes = (ids.iter())
        .map(|id| id.and_then(|id| scheduler.outcome(id)))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| Error::Generate {
            reason: "a submitted request has no outcome".to_string(),
        })?;
    Ok(WorkloadReport {
        outcomes,
        steps: step,
        seconds: start.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_ranks_as_numpy_does() {
        let values = [4.0, 1.0, 3.0, 2.0];
        // numpy.percentile([1, 2, 3, 4], [50, 95]) = [2.5, 3.85].
        assert_eq!(quantile(&values, 0.5), Some(2.5));
        assert!((quantile(&values, 0.95).unwrap() - 3.85).abs() < 1e-12);
        assert_eq!(quantile(&values, 0.0), Some(1.0));
        assert_eq!(quantile(&values, 1.0), Some(4.0));
        assert_eq!(quantile(&[7.0], 0.95), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
        let p = Percentiles::of(&[f64::NAN, 1.0, 3.0]).unwrap();
        assert_eq!((p.p50, p.p95), (2.0, 2.9));
    }
}
