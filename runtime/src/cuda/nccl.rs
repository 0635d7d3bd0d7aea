//! NCCL on a CUDA device (the `nccl` feature; cudarc loads `libnccl` at run time, so the
//! build needs no NCCL): the communicator of one rank, one device, made from one unique id
//! that every rank was given byte for byte (`kiln launch` delivers it), and the
//! [`Communicator`] the host side of a run uses (a step's mean loss, a stop every rank agrees
//! on). The executables' `all_reduce` launches go through [`Nccl::all_reduce`] on the plan's
//! communication stream, and are captured into the device graph with the rest of the step.

use std::sync::{Arc, Mutex};

use cudarc::nccl::{result, sys};

use super::CudaDevice;
use crate::collective::Communicator;
use crate::error::{Error, Result};
use crate::gpu::Driver;
use crate::tensor::Tensor;

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

fn nccl_error(what: &str, e: impl std::fmt::Debug) -> Error {
    crate::gpu::error("cuda", format!("NCCL: {what}"), e)
}

/// Fails, saying so, where `libnccl` cannot be loaded (cudarc would panic on first use).
fn check_library() -> Result<()> {
    // SAFETY: only tries to dlopen the library.
    match unsafe { sys::is_culib_present() } {
        true => Ok(()),
        false => Err(Error::Device {
            backend: "cuda",
            what: "NCCL".to_string(),
            reason: "libnccl.so cannot be loaded: install NCCL and put its lib directory on \
                     LD_LIBRARY_PATH (where it holds only libnccl.so.2, as the nvidia-nccl-cu13 \
                     wheel does, link that as libnccl.so there)"
                .to_string(),
        }),
    }
}

/// A fresh unique id, for rank 0 to hand to every rank.
pub fn unique_id() -> Result<[u8; ID_BYTES]> {
    check_library()?;
    let id = result::get_uniqueid().map_err(|e| nccl_error("get a unique id", e))?;
    Ok(id.internal.map(|c| c as u8))
}

/// The communicator of one rank.
pub(crate) struct Nccl {
    /// Held while NCCL calls are issued: a communicator is not to be used by two threads at
    /// once.
    comm: Mutex<Comm>,
    rank: usize,
    size: usize,
}

/// The handle, and the context it was made in (kept alive, and made current to destroy it).
struct Comm(sys::ncclComm_t, Arc<cudarc::driver::CudaContext>);

// SAFETY: the handle is used under `Nccl::comm`'s lock only; NCCL allows a communicator to
// move between threads.
unsafe impl Send for Comm {}

impl Drop for Comm {
    fn drop(&mut self) {
        // Its device's context, alive while this holds it, current for the destroy.
        let _ = self.1.bind_to_thread();
        // SAFETY: made by ncclCommInitRank, destroyed once. A failure here has no one to go to.
        let _ = unsafe { result::comm_destroy(self.0) };
    }
}

impl Nccl {
    /// Rank `rank` of `size` on `device` (its context current), from the id every rank got.
    pub(crate) fn new(
        device: &CudaDevice,
        id: &[u8; ID_BYTES],
        rank: usize,
        size: usize,
    ) -> Result<Self> {
        check_library()?;
        if size == 0 || rank >= size {
            return Err(Error::Collective {
                rank,
                reason: format!("rank {rank} is not one of a world of {size}"),
            });
        }
        device.bind()?;
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as ::core::ffi::c_char),
        };
        let mut comm = std::ptr::null_mut();
        let (ranks, this) = (i32::try_from(size), i32::try_from(rank));
        let (Ok(ranks), Ok(this)) = (ranks, this) else {
            return Err(nccl_error(
                "init",
                format!("rank {rank} of {size} is out of range"),
            ));
        };
        // SAFETY: `comm` receives the new communicator; every rank passes the same id.
        unsafe { result::comm_init_rank(&mut comm, ranks, id, this) }
            .map_err(|e| nccl_error(&format!("join as rank {rank} of {size}"), e))?;
        Ok(Nccl {
            comm: Mutex::new(Comm(comm, device.ctx.clone())),
            rank,
            size,
        })
    }

    pub(crate) fn rank_and_size(&self) -> (usize, usize) {
        (self.rank, self.size)
    }

    /// Each `(src, dst, count)` f32 buffer summed over the ranks into `dst`, as one group,
    /// on `stream`.
    pub(crate) fn all_reduce(
        &self,
        buffers: &[(u64, u64, usize)],
        stream: &cudarc::driver::CudaStream,
    ) -> Result<()> {
        let comm = self
            .comm
            .lock()
            .map_err(|_| nccl_error("all_reduce", "a thread panicked"))?;
        let handle = stream.cu_stream() as sys::cudaStream_t;
        result::group_start().map_err(|e| nccl_error("group start", e))?;
        let mut failed = None;
        for &(src, dst, count) in buffers {
            // SAFETY: both ranges are `count` f32 inside slots the executable owns (checked
            // when the program was lowered); the stream is the executable's.
            let issued = unsafe {
                result::all_reduce(
                    src as *const _,
                    dst as *mut _,
                    count,
                    sys::ncclDataType_t::ncclFloat32,
                    sys::ncclRedOp_t::ncclSum,
                    comm.0,
                    handle,
                )
            };
            if let Err(e) = issued {
                failed.get_or_insert(e);
            }
        }
        // The group is closed whatever happened inside it.
        let ended = result::group_end();
        match (failed, ended) {
            (Some(e), _) => Err(nccl_error("all_reduce", e)),
            (None, Err(e)) => Err(nccl_error("group end", e)),
            (None, Ok(_)) => Ok(()),
        }
    }
}

/// The host side of a rank's collectives, on its device's communicator
/// ([`CudaDevice::join_nccl`]): tensors go up, are summed over the ranks, and come back, through
/// a scratch buffer and a stream of its own (kept: a tensor-parallel server sums a checksum
/// every step).
pub struct NcclCommunicator {
    device: Arc<CudaDevice>,
    scratch: Mutex<Scratch>,
}

struct Scratch {
    stream: Arc<cudarc::driver::CudaStream>,
    /// Device bytes at `ptr`, `capacity` of them (0: none yet).
    ptr: u64,
    capacity: usize,
}

impl NcclCommunicator {
    /// `device`'s communicator; an error where the device has joined none.
    pub fn new(device: Arc<CudaDevice>) -> Result<Self> {
        device.communicator()?;
        let stream = device.new_stream()?;
        Ok(NcclCommunicator {
            device,
            scratch: Mutex::new(Scratch {
                stream,
                ptr: 0,
                capacity: 0,
            }),
        })
    }
}

impl Drop for NcclCommunicator {
    fn drop(&mut self) {
        if let Ok(scratch) = self.scratch.get_mut() {
            if scratch.capacity > 0 {
                self.device.free(scratch.ptr);
            }
        }
    }
}

impl Communicator for NcclCommunicator {
    fn rank(&self) -> usize {
        self.device.communicator().map_or(0, |(rank, _)| rank)
    }

    fn world_size(&self) -> usize {
        self.device.communicator().map_or(1, |(_, size)| size)
    }

    fn all_reduce(&self, tensors: &[Tensor]) -> Result<Vec<Tensor>> {
        let device = &self.device;
        let mut scratch =
            (self.scratch.lock()).map_err(|_| nccl_error("all_reduce", "a thread panicked"))?;
        let mut sums = Vec::with_capacity(tensors.len());
        for tensor in tensors {
            let values = crate::collective::f32_values(tensor)?;
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            if bytes.len() > scratch.capacity {
                if scratch.capacity > 0 {
                    device.free(scratch.ptr);
                    scratch.capacity = 0;
                }
                scratch.ptr = device.malloc(bytes.len())?;
                scratch.capacity = bytes.len();
            }
            if bytes.is_empty() {
                // Every rank brings the same shapes: none sums anything here.
                sums.push(tensor.clone());
                continue;
            }
            let (ptr, stream) = (scratch.ptr, &scratch.stream);
            device.upload(ptr, &bytes, stream)?;
            device.all_reduce(&[(ptr, ptr, values.len())], stream)?;
            let mut back = vec![0u8; bytes.len()];
            device.download(&mut back, ptr, Some(stream))?;
            let floats = back
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            sums.push(Tensor::from_vec(floats.collect(), tensor.shape().clone())?);
        }
        device.check_released()?;
        Ok(sums)
    }
}
