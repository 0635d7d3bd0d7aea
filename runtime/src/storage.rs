//! Storage: one allocation on a device, shared by every tensor that views it.
//!
//! Invariants:
//! 1. The allocation never moves or changes length while any handle lives, so
//!    [`Storage::address`] is stable (bound gradient buffers and, later, captured graphs rely
//!    on it).
//! 2. Borrows are checked at run time: many readers or one writer. A conflicting borrow is an
//!    [`Error::Busy`], never a deadlock.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

use kiln_ir::DType;
use kiln_kernels::{Buffer, Data, DataMut, Element};

use crate::device::Device;
use crate::error::{Error, Result};

#[derive(Debug)]
struct Inner {
    device: Device,
    dtype: DType,
    len: usize,
    address: usize,
    buffer: RwLock<Buffer>,
}

/// A shared handle to one allocation. Cloning shares; the memory is freed with the last handle.
#[derive(Clone, Debug)]
pub struct Storage(Arc<Inner>);

/// Shared access to a storage's elements.
pub struct StorageRead<'a>(RwLockReadGuard<'a, Buffer>);
/// Exclusive access to a storage's elements.
pub struct StorageWrite<'a>(RwLockWriteGuard<'a, Buffer>);

impl StorageRead<'_> {
    pub fn data(&self) -> Data<'_> {
        self.0.data()
    }
}

impl StorageWrite<'_> {
    pub fn data_mut(&mut self) -> DataMut<'_> {
        self.0.data_mut()
    }
}

impl Storage {
    /// Takes ownership of a host buffer (no copy).
    pub fn from_buffer(buffer: Buffer) -> Self {
        Storage(Arc::new(Inner {
            device: Device::Cpu,
            dtype: buffer.dtype(),
            len: buffer.len(),
            address: buffer.address(),
            buffer: RwLock::new(buffer),
        }))
    }

    /// Takes ownership of typed host elements (no copy).
    pub fn from_vec<T: Element>(values: Vec<T>) -> Self {
        Self::from_buffer(Buffer::from_vec(values))
    }

    /// `len` zero elements of `dtype` on `device`.
    pub fn zeros(device: Device, dtype: DType, len: usize) -> Self {
        match device {
            Device::Cpu => Self::from_buffer(Buffer::zeros(dtype, len)),
        }
    }

    pub fn device(&self) -> Device {
        self.0.device
    }
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.0.len
    }
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }
    /// Address of the first element; stable for the storage's life (invariant 1).
    pub fn address(&self) -> usize {
        self.0.address
    }
    /// Whether two handles share one allocation.
    pub fn same(&self, other: &Storage) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Shared access, or [`Error::Busy`] while a writer holds it.
    pub fn read(&self) -> Result<StorageRead<'_>> {
        match self.0.buffer.try_read() {
            Ok(guard) => Ok(StorageRead(guard)),
            Err(TryLockError::WouldBlock) => Err(Error::Busy {
                held: "for writing",
            }),
            // A panic elsewhere left the lock poisoned; the elements are still plain numbers.
            Err(TryLockError::Poisoned(p)) => Ok(StorageRead(p.into_inner())),
        }
    }

    /// Exclusive access, or [`Error::Busy`] while anyone else holds it.
    pub fn write(&self) -> Result<StorageWrite<'_>> {
        match self.0.buffer.try_write() {
            Ok(guard) => Ok(StorageWrite(guard)),
            Err(TryLockError::WouldBlock) => Err(Error::Busy { held: "elsewhere" }),
            Err(TryLockError::Poisoned(p)) => Ok(StorageWrite(p.into_inner())),
        }
    }
}
