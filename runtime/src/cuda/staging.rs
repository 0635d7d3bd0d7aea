//! Host-to-device copies of large inputs (weights) through pinned staging: the bytes are
//! copied into one of two page-locked buffers while the device reads the other, so a
//! gigabyte moves at the speed of a host memcpy rather than of the driver's pageable path
//! (which stages through its own small buffers, synchronously).

use std::sync::Arc;

use cudarc::driver::{result, sys, CudaContext, CudaStream};

use super::{error, ReleaseErrors};
use crate::error::Result;

/// Bytes of each staging buffer.
const CHUNK: usize = 32 << 20;
/// Copies smaller than this go straight through the driver.
pub(super) const STAGED_FROM: usize = 4 << 20;

/// Two pinned buffers and the events that say when the device has read each.
pub(super) struct Staging {
    ctx: Arc<CudaContext>,
    buffers: [*mut u8; 2],
    events: [sys::CUevent; 2],
    release_errors: Arc<ReleaseErrors>,
}

// SAFETY: the buffers are plain page-locked host memory and the events driver handles; the
// device keeps one `Staging` behind a mutex, so one thread uses it at a time.
unsafe impl Send for Staging {}

impl Staging {
    pub fn new(ctx: &Arc<CudaContext>, release_errors: &Arc<ReleaseErrors>) -> Result<Self> {
        ctx.bind_to_thread()
            .map_err(|e| error("bind the context", e))?;
        let mut buffers = [std::ptr::null_mut(); 2];
        let mut events = [std::ptr::null_mut(); 2];
        let mut staging = |i: usize| -> Result<()> {
            // SAFETY: a fresh allocation of CHUNK bytes, freed in `drop`.
            let host = unsafe { result::malloc_host(CHUNK, 0) }
                .map_err(|e| error("allocate pinned staging", e))?;
            buffers[i] = host.cast();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
            events[i] = result::event::create(flags).map_err(|e| error("create an event", e))?;
            Ok(())
        };
        let made = staging(0).and_then(|()| staging(1));
        let staging = Staging {
            ctx: ctx.clone(),
            buffers,
            events,
            release_errors: release_errors.clone(),
        };
        made.map(|()| staging)
    }

    /// Copies `host` to `dst` on `stream` and waits for it.
    pub fn upload(
        &mut self,
        dst: sys::CUdeviceptr,
        host: &[u8],
        stream: &CudaStream,
    ) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| error("bind the context", e))?;
        let copied = self.copy_chunks(dst, host, stream);
        // Waited for even after a failed chunk, so no copy out of a buffer is left in flight.
        let synced = stream.synchronize().map_err(|e| error("synchronize", e));
        copied.and(synced)
    }

    fn copy_chunks(
        &mut self,
        dst: sys::CUdeviceptr,
        host: &[u8],
        stream: &CudaStream,
    ) -> Result<()> {
        for (index, chunk) in host.chunks(CHUNK).enumerate() {
            let which = index % 2;
            // SAFETY: the event was recorded after the last copy out of this buffer (or never,
            // which returns at once); the buffer holds CHUNK bytes, the chunk at most that; the
            // destination range lies inside the caller's slot.
            unsafe {
                result::event::synchronize(self.events[which])
                    .map_err(|e| error("wait for a staging buffer", e))?;
                let buffer = std::slice::from_raw_parts_mut(self.buffers[which], chunk.len());
                parallel_copy(buffer, chunk);
                let at = dst + (index * CHUNK) as u64;
                result::memcpy_htod_async(at, buffer, stream.cu_stream())
                    .map_err(|e| error("copy to the device", e))?;
                result::event::record(self.events[which], stream.cu_stream())
                    .map_err(|e| error("record a staging event", e))?;
            }
        }
        Ok(())
    }
}

/// Bytes each thread copies into a staging buffer: one thread moves ~5 GB/s, so a 32 MiB
/// chunk takes eight.
const COPY_PIECE: usize = 4 << 20;

/// `dst.copy_from_slice(src)` over several threads for large copies.
fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    if src.len() <= COPY_PIECE {
        dst.copy_from_slice(src);
        return;
    }
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(COPY_PIECE).zip(src.chunks(COPY_PIECE)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for (&buffer, &event) in self.buffers.iter().zip(&self.events) {
            // SAFETY: made by `new`, released once; no copy is in flight (`upload` waits).
            unsafe {
                if !event.is_null() {
                    if let Err(e) = result::event::destroy(event) {
                        self.release_errors
                            .record("destroy a staging event".into(), e);
                    }
                }
                if !buffer.is_null() {
                    if let Err(e) = result::free_host(buffer.cast()) {
                        self.release_errors.record("free pinned staging".into(), e);
                    }
                }
            }
        }
    }
}
