//! Resolving a planned program into [`Launch`]es: every step's operand and result layouts
//! (the same derivation as `planned/step.rs`) bound to spans of the executable's memory.
//!
//! A run is three parts, each resolved by one method of [`Recorder`]:
//! 1. [`Recorder::prologue`]: with poison, the arena and the output buffers are poisoned; the
//!    working copy of every input the plan writes in place receives its slot's contents.
//! 2. [`Recorder::step`], once per schedule step in order: a view op records nothing (its
//!    layout is derived); a kernel op records the copies of its in-place operands into the
//!    scratch region, then its kernel; with poison, the arena bytes that die after the step.
//! 3. [`Recorder::epilogue`]: every output is copied into its output slot, then every write
//!    into its input slot. A write whose value sits in an input slot is first staged in the
//!    scratch region, so no write-back reads a slot that another one already replaced.
//!
//! Every check of `planned/step.rs` is made here, once, with the same errors: a recording
//! holds no launch that reads bytes it writes.

use kiln_ir::{Graph, ValueId};
use kiln_planner::{BufferClass, Plan};
use petgraph::stable_graph::NodeIndex;

use super::super::placement::{Home, Placement};
use super::launch::{KernelLaunch, Launch, Span};
use super::slots::{InputSlot, OutputSlot};
use crate::error::{Error, Result};
use crate::interpret::check_write;
use crate::placed::ValueLayout;
use crate::placed::{describe, plan_error, StepOperands, Value};

/// What the steps resolved so far computed: the layout of every available value.
type Layouts = std::collections::BTreeMap<Value, ValueLayout>;

/// Resolves one run of the program, part by part.
pub(super) struct Recorder<'e> {
    pub graph: &'e Graph,
    pub plan: &'e Plan,
    pub placement: &'e Placement,
    pub inputs: &'e [InputSlot],
    pub outputs: &'e [OutputSlot],
    /// The region that holds in-place operands' copies and staged writes.
    pub scratch: usize,
    pub poison: bool,
    layouts: Layouts,
}

/// The span of a buffer's home.
pub(super) fn span_of(placement: &Placement, buffer: usize) -> Option<Span> {
    match placement.homes.get(buffer)? {
        Home::Region { region, range } => Some(Span {
            region: *region,
            range: range.clone(),
        }),
        Home::Bound(_) => None,
    }
}

/// `bytes` rounded up to whole 8-byte words, so every scratch piece is aligned for any dtype.
pub(super) fn aligned(bytes: usize) -> usize {
    bytes.div_ceil(8) * 8
}

impl<'e> Recorder<'e> {
    pub fn new(
        graph: &'e Graph,
        plan: &'e Plan,
        placement: &'e Placement,
        (inputs, outputs): (&'e [InputSlot], &'e [OutputSlot]),
        scratch: usize,
        poison: bool,
    ) -> Self {
        let layouts = placement.inputs.iter().cloned().collect();
        Recorder {
            graph,
            plan,
            placement,
            inputs,
            outputs,
            scratch,
            poison,
            layouts,
        }
    }

    /// The buffer of `value` as a span; every buffer has a region once the executable exists.
    fn span(&self, value: &Value) -> Result<(usize, Span)> {
        let buffer = *self.placement.buffer_of.get(value).ok_or_else(|| {
            let what = format!("value {}.{}", value.0, value.1);
            plan_error(self.plan, what, "has no buffer".to_string())
        })?;
        let span = span_of(self.placement, buffer).ok_or_else(|| {
            let reason = "has no memory in the executable".to_string();
            plan_error(self.plan, describe(&self.plan.buffers[buffer]), reason)
        })?;
        Ok((buffer, span))
    }

    /// Part 1: poison, then the working copies of in-place updated inputs.
    pub fn prologue(&self) -> Vec<Launch> {
        let mut launches = Vec::new();
        if self.poison {
            let arena = self.placement.region_bytes[0];
            launches.push(Launch::Poison(Span {
                region: 0,
                range: 0..arena,
            }));
            for buffer in &self.plan.buffers {
                if buffer.class == BufferClass::Output {
                    launches.extend(span_of(self.placement, buffer.id).map(Launch::Poison));
                }
            }
        }
        for input in self.inputs {
            if let Some(working) = &input.working {
                launches.push(Launch::CopyBytes {
                    from: input.slot.clone(),
                    to: working.clone(),
                });
            }
        }
        launches
    }

    /// Part 2: step `index` of the schedule.
    pub fn step(&mut self, index: usize) -> Result<Vec<Launch>> {
        let (graph, plan) = (self.graph, self.plan);
        let StepOperands {
            node: node_index,
            op,
            operands,
            types,
        } = StepOperands::read(graph, plan, &self.layouts, index)?;
        let what = || format!("step {index} (node %{node_index} {op})");
        let results: Vec<Value> = (0..types.len()).map(|port| (node_index, port)).collect();
        let failed = |source: Error| Error::Node {
            node: node_index,
            op: op.to_string(),
            source: Box::new(source),
        };

        if let Some((value, layout)) = operands.first() {
            let (buffer, span) = self.span(value)?;
            let capacity = span.range.len() / layout.dtype.size_bytes();
            if let Some(view) = layout.view(op, capacity) {
                if self.placement.buffer_of.get(&results[0]) != Some(&buffer) {
                    let reason =
                        "is a view, but the plan puts it in another buffer than its operand";
                    return Err(plan_error(plan, what(), reason.to_string()));
                }
                self.layouts.insert(results[0], view.map_err(failed)?);
                return Ok(self.dying(index));
            }
        }

        // Where the step writes: each result's buffer, then the workspace.
        let mut written: Vec<(usize, Span)> = Vec::new();
        for (port, value) in results.iter().enumerate() {
            let (buffer, span) = self.span(value)?;
            if written.iter().any(|(b, _)| *b == buffer) {
                let reason = format!("puts two of its results in buffer {buffer}");
                return Err(plan_error(plan, what(), reason));
            }
            if self.inputs.iter().any(|input| input.slot.overlaps(&span)) {
                // Slots change only by `set` and write-back; in-place inputs get working copies.
                let reason = format!("writes result {port} into the slot of an input");
                return Err(plan_error(plan, what(), reason));
            }
            written.push((buffer, span));
        }
        let workspace = match self.placement.workspace.get(&index) {
            Some(&buffer) => Some(self.span_of_buffer(buffer)?),
            None => None,
        };
        let writes: Vec<(usize, Span)> = (written.iter().cloned())
            .chain(
                workspace
                    .clone()
                    .map(|s| (self.placement.workspace[&index], s)),
            )
            .collect();
        self.check_disjoint(&writes, &what)?;

        // In-place operands are read from a copy in the scratch region, taken before the kernel.
        let mut launches = Vec::new();
        let mut staged: Vec<(usize, Span)> = Vec::new();
        let mut next = 0;
        let mut bound_operands = Vec::with_capacity(operands.len());
        for (port, (value, layout)) in operands.iter().enumerate() {
            let (buffer, span) = self.span(value)?;
            let span = if written.iter().any(|(b, _)| *b == buffer) {
                if let Some((_, copy)) = staged.iter().find(|(b, _)| *b == buffer) {
                    copy.clone()
                } else {
                    let copy = Span {
                        region: self.scratch,
                        range: next..next + span.range.len(),
                    };
                    next += aligned(span.range.len());
                    launches.push(Launch::CopyBytes {
                        from: span,
                        to: copy.clone(),
                    });
                    staged.push((buffer, copy.clone()));
                    copy
                }
            } else if let Some((other, _)) = writes.iter().find(|(_, w)| w.overlaps(&span)) {
                let reason = format!(
                    "reads operand {port} from {}, whose bytes overlap {}, which this step writes",
                    describe(&plan.buffers[buffer]),
                    describe(&plan.buffers[*other]),
                );
                return Err(plan_error(plan, what(), reason));
            } else {
                span
            };
            bound_operands.push((span, layout.clone()));
        }
        if next > self.placement.region_bytes[self.scratch] {
            let reason = format!("copies {next} bytes of in-place operands; scratch is smaller");
            return Err(plan_error(plan, what(), reason));
        }
        let result_layouts: Vec<ValueLayout> = types.iter().map(ValueLayout::contiguous).collect();
        launches.push(Launch::Kernel(Box::new(KernelLaunch {
            node: node_index,
            op: op.clone(),
            operands: bound_operands,
            results: (written.into_iter().map(|(_, s)| s))
                .zip(result_layouts.iter().cloned())
                .collect(),
            workspace,
        })));
        self.layouts.extend(results.into_iter().zip(result_layouts));
        launches.extend(self.dying(index));
        Ok(launches)
    }

    fn span_of_buffer(&self, buffer: usize) -> Result<Span> {
        span_of(self.placement, buffer).ok_or_else(|| {
            let reason = "has no memory in the executable".to_string();
            plan_error(self.plan, describe(&self.plan.buffers[buffer]), reason)
        })
    }

    /// Refuses a step whose written spans overlap, or lie past their region's end.
    fn check_disjoint(&self, writes: &[(usize, Span)], what: &dyn Fn() -> String) -> Result<()> {
        for (i, (a, span)) in writes.iter().enumerate() {
            let describe_a = describe(&self.plan.buffers[*a]);
            if span.range.end > self.placement.region_bytes[span.region] {
                let reason = format!("writes {describe_a} past the end of its memory");
                return Err(plan_error(self.plan, what(), reason));
            }
            if let Some((b, _)) = writes[..i].iter().find(|(_, other)| other.overlaps(span)) {
                let reason = format!(
                    "writes {} and {describe_a}, whose bytes overlap",
                    describe(&self.plan.buffers[*b])
                );
                return Err(plan_error(self.plan, what(), reason));
            }
        }
        Ok(())
    }

    /// With poison, the arena bytes whose buffers die after step `index`.
    fn dying(&self, index: usize) -> Vec<Launch> {
        if !self.poison {
            return Vec::new();
        }
        let ranges = self.placement.dying.get(&index).into_iter().flatten();
        ranges
            .map(|range| {
                Launch::Poison(Span {
                    region: 0,
                    range: range.clone(),
                })
            })
            .collect()
    }

    /// The value `value` as the last step left it: its span and layout.
    fn final_value(&self, value: Value, name: &str) -> Result<(Span, ValueLayout)> {
        let Some(layout) = self.layouts.get(&value) else {
            let reason = format!("value {}.{} is never computed", value.0, value.1);
            return Err(plan_error(self.plan, format!("`{name}`"), reason));
        };
        let (_, span) = self.span(&value)?;
        Ok((span, layout.clone()))
    }

    /// Part 3: outputs into their slots, then writes into their inputs' slots.
    pub fn epilogue(&self) -> Result<Vec<Launch>> {
        let mut launches = Vec::new();
        for output in self.outputs {
            let (span, layout) = self.final_value(output.value, &output.name)?;
            if layout.ty() != output.ty {
                let reason = format!("is {}, its slot {}", layout.ty(), output.ty);
                let what = format!("output `{}`", output.name);
                return Err(plan_error(self.plan, what, reason));
            }
            launches.push(Launch::Copy {
                from: Box::new((span, layout)),
                to: Box::new((output.slot.clone(), ValueLayout::contiguous(&output.ty))),
            });
        }
        // Writes whose value sits in an input slot go through the scratch region first.
        let mut staged = Vec::new();
        let mut direct = Vec::new();
        let mut next = 0;
        for (name, value) in self.graph.writes() {
            let value = (value.node.index(), value.port);
            let (span, layout) = self.final_value(value, name)?;
            let id = ValueId {
                node: NodeIndex::new(value.0),
                port: value.1,
            };
            check_write(self.graph, name, id, &layout.ty())?;
            let input = (self.inputs.iter().find(|i| i.name == *name)).ok_or_else(|| {
                let reason = "the graph has no input of that name".to_string();
                plan_error(self.plan, format!("write `{name}`"), reason)
            })?;
            let slot = (input.slot.clone(), ValueLayout::contiguous(&input.ty));
            if self.inputs.iter().any(|i| i.slot.overlaps(&span)) {
                let bytes = slot.0.range.len();
                let stage = Span {
                    region: self.scratch,
                    range: next..next + bytes,
                };
                next += aligned(bytes);
                staged.push(Launch::Copy {
                    from: Box::new((span, layout)),
                    to: Box::new((stage.clone(), slot.1)),
                });
                direct.push(Launch::CopyBytes {
                    from: stage,
                    to: slot.0,
                });
            } else {
                direct.push(Launch::Copy {
                    from: Box::new((span, layout)),
                    to: Box::new(slot),
                });
            }
        }
        if next > self.placement.region_bytes[self.scratch] {
            let reason = format!("stages {next} bytes of writes; scratch is smaller");
            return Err(plan_error(self.plan, "write-back", reason));
        }
        launches.extend(staged);
        launches.extend(direct);
        Ok(launches)
    }
}
