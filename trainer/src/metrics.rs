//! A run's `metrics.jsonl` (one JSON object per line: a step's `step`, `loss`, `lr`,
//! `grad_norm`, `seconds`, `tokens`; a validation's `step` and `val_loss`) and its loss curves
//! drawn as `loss.svg`.
//!
//! On a resume from step `k` the file keeps its lines up to step `k` and goes on from there,
//! so it always tells one continuous run. Both files are the run's own outputs: they are
//! replaced by a rename, never half written.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::run::StepRecord;

pub const METRICS_FILE: &str = "metrics.jsonl";
pub const CURVES_FILE: &str = "loss.svg";

/// One line of the metrics file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Record {
    Step {
        step: u64,
        loss: f64,
        lr: f64,
        #[serde(skip_serializing_if = "Option::is_none", default)]
        grad_norm: Option<f64>,
        seconds: f64,
        tokens: usize,
    },
    Validation {
        step: u64,
        val_loss: f64,
    },
}

impl Record {
    pub fn step(r: &StepRecord) -> Record {
        Record::Step {
            step: r.step,
            loss: r.loss,
            lr: r.lr,
            grad_norm: r.grad_norm,
            seconds: r.seconds,
            tokens: r.tokens,
        }
    }

    pub fn validation(step: u64, val_loss: f64) -> Record {
        Record::Validation { step, val_loss }
    }

    fn at(&self) -> u64 {
        match self {
            Record::Step { step, .. } | Record::Validation { step, .. } => *step,
        }
    }
}

/// The open metrics file of a run directory and every record in it.
pub struct Metrics {
    dir: PathBuf,
    file: File,
    records: Vec<Record>,
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::RunDir {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename.
fn replace(path: &Path, bytes: &[u8]) -> Result<()> {
    let temp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut file = File::create(&temp).map_err(|e| io(&temp, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| io(&temp, e))?;
    fs::rename(&temp, path).map_err(|e| io(path, e))
}

impl Metrics {
    /// Opens `dir`'s metrics file, keeping its records up to step `upto`.
    pub fn open(dir: &Path, upto: u64) -> Result<Metrics> {
        let path = dir.join(METRICS_FILE);
        let mut records = Vec::new();
        if path.exists() {
            let text = fs::read_to_string(&path).map_err(|e| io(&path, e))?;
            for (n, line) in text.lines().enumerate() {
                // A line cut short by a killed process is the last one; it is dropped.
                match serde_json::from_str::<Record>(line) {
                    Ok(record) if record.at() <= upto => records.push(record),
                    Ok(_) => {}
                    Err(_) if n + 1 == text.lines().count() => {}
                    Err(e) => return Err(io(&path, format!("line {}: {e}", n + 1))),
                }
            }
        }
        let kept: String = records.iter().map(json_line).collect();
        replace(&path, kept.as_bytes())?;
        let file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|e| io(&path, e))?;
        Ok(Metrics {
            dir: dir.to_path_buf(),
            file,
            records,
        })
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    pub fn append(&mut self, record: &Record) -> Result<()> {
        let path = self.dir.join(METRICS_FILE);
        self.file
            .write_all(json_line(record).as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(|e| io(&path, e))?;
        self.records.push(record.clone());
        Ok(())
    }

    /// Draws the records as `loss.svg`.
    pub fn write_curves(&self) -> Result<()> {
        replace(
            &self.dir.join(CURVES_FILE),
            curves_svg(&self.records).as_bytes(),
        )
    }
}

fn json_line(record: &Record) -> String {
    let mut line = serde_json::to_string(record).expect("records serialize");
    line.push('\n');
    line
}

/// The training loss by step (a line) and the validation losses (a line with dots), on
/// shared axes with ticks, labels and a legend.
pub fn curves_svg(records: &[Record]) -> String {
    let train: Vec<(f64, f64)> = (records.iter())
        .filter_map(|r| match r {
            Record::Step { step, loss, .. } => Some((*step as f64, *loss)),
            Record::Validation { .. } => None,
        })
        .filter(|(_, loss)| loss.is_finite())
        .collect();
    let val: Vec<(f64, f64)> = (records.iter())
        .filter_map(|r| match r {
            Record::Validation { step, val_loss } => Some((*step as f64, *val_loss)),
            Record::Step { .. } => None,
        })
        .filter(|(_, loss)| loss.is_finite())
        .collect();
    let (width, height, left, right, top, bottom) = (760.0, 420.0, 70.0, 20.0, 40.0, 50.0);
    let all = || train.iter().chain(&val);
    let (x_min, x_max) = bounds(all().map(|p| p.0));
    let (y_min, y_max) = bounds(all().map(|p| p.1));
    let x = |v: f64| left + (v - x_min) / (x_max - x_min) * (width - left - right);
    let y = |v: f64| height - bottom - (v - y_min) / (y_max - y_min) * (height - top - bottom);
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"{left}\" y=\"24\" font-size=\"15\">Loss by step</text>\n"
    );
    let (plot_bottom, plot_right) = (height - bottom, width - right);
    svg += &format!(
        "<line x1=\"{left}\" y1=\"{plot_bottom}\" x2=\"{plot_right}\" y2=\"{plot_bottom}\" stroke=\"black\"/>\n\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{plot_bottom}\" stroke=\"black\"/>\n"
    );
    for k in 0..=4 {
        let xv = x_min + (x_max - x_min) * f64::from(k) / 4.0;
        let yv = y_min + (y_max - y_min) * f64::from(k) / 4.0;
        svg += &format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
             <line x1=\"{left}\" y1=\"{:.1}\" x2=\"{plot_right}\" y2=\"{:.1}\" stroke=\"#ddd\"/>\n\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{yv:.3}</text>\n",
            x(xv),
            plot_bottom + 18.0,
            xv.round(),
            y(yv),
            y(yv),
            left - 6.0,
            y(yv) + 4.0,
        );
    }
    svg += &format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">step</text>\n",
        (left + plot_right) / 2.0,
        height - 12.0
    );
    let polyline = |points: &[(f64, f64)], color: &str| {
        let coords: Vec<String> = (points.iter())
            .map(|&(a, b)| format!("{:.1},{:.1}", x(a), y(b)))
            .collect();
        format!(
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            coords.join(" ")
        )
    };
    svg += &polyline(&train, "#1f77b4");
    svg += &polyline(&val, "#d62728");
    for &(a, b) in &val {
        svg += &format!(
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"#d62728\"/>\n",
            x(a),
            y(b)
        );
    }
    let legend_x = plot_right - 150.0;
    svg += &format!(
        "<rect x=\"{legend_x}\" y=\"{top}\" width=\"12\" height=\"3\" fill=\"#1f77b4\"/>\
         <text x=\"{}\" y=\"{}\">training loss</text>\n\
         <rect x=\"{legend_x}\" y=\"{}\" width=\"12\" height=\"3\" fill=\"#d62728\"/>\
         <text x=\"{}\" y=\"{}\">validation loss</text>\n</svg>\n",
        legend_x + 18.0,
        top + 5.0,
        top + 18.0,
        legend_x + 18.0,
        top + 23.0,
    );
    svg
}

/// The range of `values`, widened when it is a single point (or empty).
fn bounds(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if !lo.is_finite() {
        (0.0, 1.0)
    } else if hi - lo < 1e-12 {
        (lo - 0.5, hi + 0.5)
    } else {
        (lo, hi)
    }
}
