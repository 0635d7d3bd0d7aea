//! One recorded launch of a [`CpuExecutable`](super::CpuExecutable): an op, a copy or a poison
//! fill with every address bound — each operand, result and workspace is a [`Span`] (bytes of
//! one region of the executable's memory) with the layout of its value inside it.
//!
//! Invariants:
//! 1. A launch reads and writes only its spans: it carves its written spans out of the memory
//!    ([`Memory::carve`]) and reads its operands from the bytes between them, so an operand
//!    that overlaps a written span is an error here, never an alias. (Recording already
//!    refuses such launches; this is the second line.)
//! 2. Running a launch does no placement work: no lookup in the plan or the graph, no layout
//!    derivation, no allocation but the kernels' result views.
//! 3. Kernels overwrite their results, so running a launch twice on the same operands gives the
//!    same bits.

use std::ops::Range;

use kiln_ir::Op;
use kiln_kernels::{TensorView, TensorViewMut};

use super::super::memory::{Carved, Memory};
use crate::collective::Communicator;
use crate::error::{Error, Result};
use crate::interpret::ops::run_op;
use crate::placed::bytes::{read_view, write_view};
use crate::placed::ValueLayout;

/// Bytes `range` of region `region` of the executable's memory (region 0 is the arena).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub region: usize,
    pub range: Range<usize>,
}

impl Span {
    /// Whether the two spans share a byte.
    pub fn overlaps(&self, other: &Span) -> bool {
        self.region == other.region
            && self.range.start < other.range.end
            && other.range.start < self.range.end
    }
}

/// One op of a recorded step: what [`run_op`] gets, with its addresses bound.
#[derive(Clone, Debug)]
pub(super) struct KernelLaunch {
    /// The IR node, for errors.
    pub node: usize,
    pub op: Op,
    /// Each operand's span (its buffer, or the scratch copy of an in-place operand) and layout.
    pub operands: Vec<(Span, ValueLayout)>,
    /// Each result's span (its whole buffer) and layout, by port.
    pub results: Vec<(Span, ValueLayout)>,
    pub workspace: Option<Span>,
}

/// One launch of a recording.
#[derive(Clone, Debug)]
pub(super) enum Launch {
    /// Fills the span with the poison byte.
    Poison(Span),
    /// Copies the bytes of `from` into `to`, of the same length.
    CopyBytes { from: Span, to: Span },
    /// Copies the value laid out as `from.1` in `from.0` into the layout `to.1` in `to.0` (the
    /// kernel copy: any strides in, any strides out).
    /// (Boxed: layouts are large, and most launches are small.)
    Copy {
        from: Box<(Span, ValueLayout)>,
        to: Box<(Span, ValueLayout)>,
    },
    /// Runs one op's kernels.
    Kernel(Box<KernelLaunch>),
}

impl Launch {
    /// Runs the launch on `memory`; its collectives reach the ranks of `communicator`.
    pub fn run(&self, memory: &mut Memory, communicator: &dyn Communicator) -> Result<()> {
        match self {
            Launch::Poison(span) => {
                let carved = carve(memory, std::slice::from_ref(span))?;
                for piece in carved.writes {
                    piece.fill(super::super::memory::POISON);
                }
                Ok(())
            }
            Launch::CopyBytes { from, to } => {
                let mut carved = carve(memory, std::slice::from_ref(to))?;
                let source = shared(&carved, from)?;
                let target = &mut carved.writes[0];
                if source.len() != target.len() {
                    return Err(launch_error(format!(
                        "copies {} bytes into {} bytes",
                        source.len(),
                        target.len()
                    )));
                }
                target.copy_from_slice(source);
                Ok(())
            }
            Launch::Copy { from, to } => {
                let mut carved = carve(memory, std::slice::from_ref(&to.0))?;
                let source = read_view(shared(&carved, &from.0)?, &from.1)?;
                let piece = carved.writes.pop().unwrap_or_default();
                let mut target = write_view(piece, &to.1)?;
                kiln_kernels::copy::copy(&source, &mut target)?;
                Ok(())
            }
            Launch::Kernel(kernel) => {
                (kernel.run(memory, communicator)).map_err(|source| Error::Node {
                    node: kernel.node,
                    op: kernel.op.to_string(),
                    source: Box::new(source),
                })
            }
        }
    }
}

impl KernelLaunch {
    fn run(&self, memory: &mut Memory, communicator: &dyn Communicator) -> Result<()> {
        let mut writes: Vec<Span> = self.results.iter().map(|(s, _)| s.clone()).collect();
        writes.extend(self.workspace.clone());
        let carved = carve(memory, &writes)?;
        let operands: Vec<TensorView<'_>> = (self.operands.iter())
            .map(|(span, layout)| read_view(shared(&carved, span)?, layout))
            .collect::<Result<_>>()?;
        let mut pieces = carved.writes.into_iter();
        let mut results: Vec<TensorViewMut<'_>> = Vec::with_capacity(self.results.len());
        for (_, layout) in &self.results {
            let piece = pieces
                .next()
                .ok_or_else(|| launch_error("lost a result".into()))?;
            results.push(write_view(piece, layout)?);
        }
        if self.op == Op::AllReduce {
            return all_reduce(communicator, &operands, &mut results);
        }
        let workspace: &mut [u8] = pieces.next().unwrap_or_default();
        run_op(&self.op, &operands, &mut results, workspace)?;
        Ok(())
    }
}

/// `operands` summed over the ranks of `communicator` into `results`.
fn all_reduce(
    communicator: &dyn Communicator,
    operands: &[TensorView<'_>],
    results: &mut [TensorViewMut<'_>],
) -> Result<()> {
    let tensors = (operands.iter())
        .map(|view| {
            let tensor =
                crate::Tensor::zeros(view.shape().clone(), view.dtype(), crate::Device::Cpu);
            tensor.write_with(|mut out| kiln_kernels::copy::copy(view, &mut out))??;
            Ok(tensor)
        })
        .collect::<Result<Vec<_>>>()?;
    let sums = communicator.all_reduce(&tensors)?;
    for (sum, result) in sums.iter().zip(results.iter_mut()) {
        sum.read_with(|view| kiln_kernels::copy::copy(&view, result))??;
    }
    Ok(())
}

/// `writes` carved out of `memory` as disjoint mutable slices.
fn carve<'m>(memory: &'m mut Memory, writes: &[Span]) -> Result<Carved<'m>> {
    let ranges: Vec<(usize, Range<usize>)> = (writes.iter())
        .map(|s| (s.region, s.range.clone()))
        .collect();
    memory.carve(&ranges).map_err(|(a, b)| {
        launch_error(if a == b {
            format!("writes {:?}, past the end of its region", writes[a])
        } else {
            format!("writes {:?} and {:?}, which overlap", writes[a], writes[b])
        })
    })
}

/// The bytes of `span`, which no write of the launch may overlap.
fn shared<'a>(carved: &Carved<'a>, span: &Span) -> Result<&'a [u8]> {
    carved.shared(span.region, &span.range).ok_or_else(|| {
        launch_error(format!(
            "reads {span:?}, which overlaps bytes the launch writes"
        ))
    })
}

fn launch_error(reason: String) -> Error {
    Error::Graph {
        what: "recorded launch".to_string(),
        reason,
    }
}
