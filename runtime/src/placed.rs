//! A plan placed over its graph, as both backends read it: which buffer holds each value and
//! whether the schedule runs every op ([`map_values`], [`check_schedule`], errors by
//! [`plan_error`]), what each step reads ([`StepOperands`]), where a value's elements sit in
//! its buffer ([`ValueLayout`]) and how a buffer's bytes are seen as the typed elements kernels
//! take ([`bytes`]).
//!
//! Nothing here runs anything or owns memory: the CPU executor (`planned/`) and the device
//! lowering and CUDA backend (`program.rs`, `lower/`, `cuda/`) build on it, so both read a plan
//! the same way and neither reaches into the other.

pub(crate) mod bytes;
mod layout;
mod operands;
mod plan;

pub(crate) use layout::ValueLayout;
pub(crate) use operands::{Layouts, StepOperands};
pub(crate) use plan::{check_schedule, describe, map_values, plan_error, Value};
