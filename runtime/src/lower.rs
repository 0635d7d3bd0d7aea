//! Lowering IR ops to device launches ([`kiln_kernels::gpu::Launch`]): which kernels run, with
//! which symbolic addresses, for one op whose operands and results are placed.
//!
//! Backend independent: nothing here touches a device, so CI (no GPU) lowers every op of every
//! program and checks the launches against their slots.

mod ops;
pub(crate) mod prefetch;

use kiln_kernels::gpu::Addr;

use crate::placed::ValueLayout;

pub(crate) use ops::linear::rope_kv_workspace_bytes as linear_rope_kv_workspace_bytes;
pub(crate) use ops::linear::workspace_bytes as linear_workspace_bytes;
pub(crate) use ops::lower_op;
pub use ops::LowerOptions;

/// A placed value: its buffer starts at `base`; `layout` says where its elements sit from
/// there (dtype, element strides and offset, as a CPU `Tensor` over its storage). Derefs to the
/// layout.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DeviceTensor {
    pub base: Addr,
    pub layout: ValueLayout,
}

impl std::ops::Deref for DeviceTensor {
    type Target = ValueLayout;

    fn deref(&self) -> &ValueLayout {
        &self.layout
    }
}

impl DeviceTensor {
    /// The address of the first element.
    pub fn addr(&self) -> Addr {
        self.base
            .add((self.offset() * self.dtype.size_bytes()) as u64)
    }
}
