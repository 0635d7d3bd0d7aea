//! Device memory and streams the caller owns (a PyTorch tensor through DLPack, a C ABI
//! descriptor): a program bound to a device copies into its input slots from such memory and
//! out of its outputs into it on the device, and orders its work after and before the
//! caller's stream with events. Data copies stay on the device; an index input (token ids,
//! positions, slots) is the exception: it is read back to the host, where its values are
//! checked as a host input's are, which waits for the stream.
//!
//! Ownership (the rule of DESIGN.md): a [`DeviceSpan`] is described by its owner for one call;
//! kiln touches it only in work the caller orders its own stream after ([`DeviceIo::signal`])
//! and keeps no reference to it. A [`DeviceBuffer`] is memory kiln allocated and owns, freed
//! when its last share is dropped. Nothing infers ownership from an address.

use std::sync::Arc;

use crate::error::Result;
use crate::gpu::Memory;

/// `bytes` bytes of device memory from address `ptr`, owned by the caller. kiln checks with
/// the driver that the whole range lies inside one allocation of its device before using it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceSpan {
    pub ptr: u64,
    pub bytes: usize,
}

/// Device memory kiln owns (a program's output handed to the caller), freed when the last
/// clone is dropped.
#[derive(Clone)]
pub struct DeviceBuffer(pub(crate) Arc<dyn Memory>);

impl DeviceBuffer {
    /// Address of its first byte.
    pub fn ptr(&self) -> u64 {
        self.0.ptr()
    }

    pub fn bytes(&self) -> usize {
        self.0.bytes()
    }

    /// Its bytes, copied to the host. The copy is ordered after nothing: the work writing the
    /// buffer must have been synchronized (as [`DeviceIo::synchronize`] does).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        self.0.to_host()
    }

    /// The whole buffer as a span (for [`DeviceIo::get_to_device`]).
    pub fn span(&self) -> DeviceSpan {
        DeviceSpan {
            ptr: self.0.ptr(),
            bytes: self.0.bytes(),
        }
    }
}

/// What a program bound to a device offers beyond host copies. Streams are `CUstream` handles
/// as numbers, DLPack's convention: 1 and 2 are the legacy and per-thread default streams.
/// Copies run on kiln's main stream, ordered after the runs issued before them and before the
/// runs issued after them; a copy of an index input (token ids, positions) goes through the
/// host, where its values are checked as a host input's are.
pub trait DeviceIo {
    /// The ordinal of the device the program runs on.
    fn ordinal(&self) -> usize;
    /// kiln's main stream, the one its runs and copies are issued on.
    fn stream_handle(&self) -> u64;
    /// Orders kiln's work issued from now on after the work issued so far on `stream`.
    fn wait_for(&self, stream: u64) -> Result<()>;
    /// Orders the work issued from now on on `stream` after kiln's work issued so far.
    fn signal(&self, stream: u64) -> Result<()>;
    /// Waits for kiln's work issued so far, reporting faults as a host copy would.
    fn synchronize(&self) -> Result<()>;
    /// Copies `src`, the dense row-major bytes of input (or state) `name`'s type, into its
    /// slot.
    fn set_from_device(&mut self, name: &str, src: DeviceSpan) -> Result<()>;
    /// Copies output (or written state) `name`, dense row-major, into `dst`.
    fn get_to_device(&self, name: &str, dst: DeviceSpan) -> Result<()>;
    /// A fresh device buffer of `bytes` bytes kiln owns.
    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer>;
}
