//! Scratch memory is the backend's business: its kernels decide how much an op needs. The
//! planner knows no device, so a backend states its needs through [`WorkspaceNeeds`]
//! (kiln-runtime's `Workspaces` for the CPU reference, CUDA, or any of them), and the planner
//! gives each step whose op needs scratch a workspace buffer of that size, living at that
//! step only. The verifier checks the plan against the same needs.

use kiln_ir::{Op, TensorType};

/// The scratch a backend needs per op.
pub trait WorkspaceNeeds {
    /// Bytes of scratch `op` needs on operands of types `operands` (0 for none; saturating,
    /// never overflowing).
    fn workspace_bytes(&self, op: &Op, operands: &[TensorType]) -> u64;
}
