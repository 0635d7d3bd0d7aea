//! [`Probe`]: any [`Ops`] with its named values recorded, so the eager oracle can be traced
//! at the same points as a traced program.

use std::cell::RefCell;

use crate::error::Result;
use crate::model::Ops;

use super::TracePatterns;

/// Runs `O`'s ops unchanged; keeps every name given and the values `patterns` select.
pub struct Probe<'o, O: Ops> {
    inner: &'o O,
    patterns: &'o TracePatterns,
    /// Every name in the order it was given.
    names: RefCell<Vec<String>>,
    /// The selected values, in the order they were named.
    values: RefCell<Vec<(String, O::Value)>>,
}

impl<'o, O: Ops> Probe<'o, O> {
    pub fn new(inner: &'o O, patterns: &'o TracePatterns) -> Self {
        Probe {
            inner,
            patterns,
            names: RefCell::new(Vec::new()),
            values: RefCell::new(Vec::new()),
        }
    }

    /// Every name the model code gave, in order.
    pub fn names(&self) -> Vec<String> {
        self.names.borrow().clone()
    }

    /// The values the patterns select, in naming order; an error for a pattern that matched
    /// no name (checked as [`TracePatterns::select`] checks a graph's names).
    pub fn into_values(self) -> Result<Vec<(String, O::Value)>> {
        let names = self.names.into_inner();
        let available: Vec<&str> = names.iter().map(String::as_str).collect();
        self.patterns.select(&available)?;
        Ok(self.values.into_inner())
    }
}

impl<O: Ops> Ops for Probe<'_, O> {
    type Value = O::Value;

    fn dims(&self, x: &O::Value) -> Vec<usize> {
        self.inner.dims(x)
    }
    fn embedding(&self, weight: &O::Value, ids: &O::Value) -> Result<O::Value> {
        self.inner.embedding(weight, ids)
    }
    fn linear(&self, x: &O::Value, weight: &O::Value, bias: Option<&O::Value>) -> Result<O::Value> {
        self.inner.linear(x, weight, bias)
    }
    fn rmsnorm(&self, x: &O::Value, weight: &O::Value, eps: f64) -> Result<O::Value> {
        self.inner.rmsnorm(x, weight, eps)
    }
    fn add_rmsnorm(
        &self,
        x: &O::Value,
        residual: &O::Value,
        weight: &O::Value,
        eps: f64,
    ) -> Result<(O::Value, O::Value)> {
        self.inner.add_rmsnorm(x, residual, weight, eps)
    }
    fn rope(
        &self,
        x: &O::Value,
        positions: &O::Value,
        bias: Option<&O::Value>,
        theta: f64,
    ) -> Result<O::Value> {
        self.inner.rope(x, positions, bias, theta)
    }
    fn heads_first(&self, x: &O::Value) -> Result<O::Value> {
        self.inner.heads_first(x)
    }
    fn attention(
        &self,
        layer: usize,
        q: &O::Value,
        k: &O::Value,
        v: &O::Value,
        scale: f64,
    ) -> Result<O::Value> {
        self.inner.attention(layer, q, k, v, scale)
    }
    fn swiglu(&self, gate: &O::Value, up: &O::Value) -> Result<O::Value> {
        self.inner.swiglu(gate, up)
    }
    fn last_position(&self, x: &O::Value) -> Result<O::Value> {
        self.inner.last_position(x)
    }
    fn reshape(&self, x: &O::Value, dims: &[usize]) -> Result<O::Value> {
        self.inner.reshape(x, dims)
    }
    fn cross_entropy(
        &self,
        logits: &O::Value,
        targets: &O::Value,
        ignore_index: i64,
    ) -> Result<O::Value> {
        self.inner.cross_entropy(logits, targets, ignore_index)
    }
    fn chunked_loss(
        &self,
        hidden: &O::Value,
        head: &O::Value,
        targets: &O::Value,
        ignore_index: i64,
    ) -> Result<Option<O::Value>> {
        self.inner.chunked_loss(hidden, head, targets, ignore_index)
    }
    fn name_value(&self, name: &str, x: &O::Value) -> Result<()> {
        self.inner.name_value(name, x)?;
        self.names.borrow_mut().push(name.to_string());
        if self.patterns.matches(name) {
            self.values.borrow_mut().push((name.to_string(), x.clone()));
        }
        Ok(())
    }
}
