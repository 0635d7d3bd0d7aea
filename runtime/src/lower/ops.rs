//! The one op → launches table of the device backends.

use kiln_ir::Op;
use kiln_kernels::gpu::{Addr, Launch};

use super::DeviceTensor;
use crate::error::Result;

/// Choices among validated implementations (DESIGN.md's evidence rule: a candidate becomes the
/// default only with measured evidence).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LowerOptions {
    /// MatMuls of at most 8 rows with transposed weights run the gemv kernel instead of the
    /// vendor GEMM (a candidate: off until it wins a benchmark).
    pub gemv: bool,
}

/// The launches that compute `op`: read `i` (operands by port), overwrite `o` (results by
/// port), scratch in `workspace` (address and bytes; `None` when the plan gives none).
/// A result may share its operand's address (in-place results, `Alias::MayOverwrite`).
pub(crate) fn lower_op(
    op: &Op,
    i: &[DeviceTensor],
    o: &[DeviceTensor],
    workspace: Option<(Addr, u64)>,
    options: LowerOptions,
) -> Result<Vec<Launch>> {
    let _ = (op, i, o, workspace, options);
    todo!("lowering")
}
