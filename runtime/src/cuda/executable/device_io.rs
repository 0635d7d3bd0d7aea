//! [`DeviceIo`] for a CUDA executable: device-to-device copies into its input slots and out of
//! its outputs on stream 0 (ordered there after the runs before them and before the runs
//! after them: every run forks from and joins into stream 0), and events between stream 0 and
//! a caller's stream. A caller's range is checked with the driver before it is touched.

use cudarc::driver::sys::{self, CUevent_flags, CUpointer_attribute};

use super::super::{error, DeviceAlloc};
use super::CudaExecutable;
use crate::device_io::{DeviceBuffer, DeviceIo, DeviceSpan};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

impl CudaExecutable {
    /// Fails unless `span` lies inside one device allocation of this executable's device.
    fn check_span(&self, span: DeviceSpan, what: &str) -> Result<()> {
        let refuse = |reason: String| Error::DeviceMemory {
            what: what.to_string(),
            reason,
        };
        let ctx = self.device.context();
        ctx.bind_to_thread().map_err(|e| error("bind context", e))?;
        let attribute = |attribute: CUpointer_attribute, out: *mut std::ffi::c_void| {
            // SAFETY: `out` points at a value of the size the attribute writes (a device
            // pointer, a size or an int); the driver checks the address.
            unsafe { sys::cuPointerGetAttribute(out, attribute, span.ptr) }.result()
        };
        let (mut start, mut size, mut ordinal) = (0u64, 0usize, -1i32);
        let known = attribute(
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            (&mut start as *mut u64).cast(),
        )
        .and_then(|()| {
            attribute(
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                (&mut size as *mut usize).cast(),
            )
        })
        .and_then(|()| {
            attribute(
                CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                (&mut ordinal as *mut i32).cast(),
            )
        });
        if let Err(e) = known {
            return Err(refuse(format!(
                "address {:#x} is not CUDA device memory the driver knows ({e:?})",
                span.ptr
            )));
        }
        if ordinal != ctx.ordinal() as i32 {
            return Err(refuse(format!(
                "is memory of device {ordinal}; the program runs on device {}",
                ctx.ordinal()
            )));
        }
        let end = (span.ptr).checked_add(span.bytes as u64);
        if end.is_none_or(|end| end > start + size as u64) {
            return Err(refuse(format!(
                "{} bytes from {:#x} run past its allocation ({size} bytes from {start:#x})",
                span.bytes, span.ptr
            )));
        }
        // A virtual-memory reservation (PyTorch's expandable segments) reports its whole
        // range, mapped or not: both ends must be mapped memory of this device.
        let last = span.ptr + (span.bytes as u64).saturating_sub(1);
        for address in [span.ptr, last] {
            let (mut mapped, mut on) = (0i32, -1i32);
            // SAFETY: each out-parameter is an int, as the two attributes write.
            let known = unsafe {
                sys::cuPointerGetAttribute(
                    (&mut mapped as *mut i32).cast(),
                    CUpointer_attribute::CU_POINTER_ATTRIBUTE_MAPPED,
                    address,
                )
                .result()
                .and_then(|()| {
                    sys::cuPointerGetAttribute(
                        (&mut on as *mut i32).cast(),
                        CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                        address,
                    )
                    .result()
                })
            };
            if known.is_err() || mapped == 0 || on != ordinal {
                return Err(refuse(format!(
                    "address {address:#x} of {} bytes from {:#x} is not mapped memory of \
                     device {ordinal}",
                    span.bytes, span.ptr
                )));
            }
        }
        Ok(())
    }

    /// Fails unless `span` holds exactly `bytes` bytes.
    fn check_bytes(span: DeviceSpan, bytes: usize, what: &str) -> Result<()> {
        match span.bytes == bytes {
            true => Ok(()),
            false => Err(Error::DeviceMemory {
                what: what.to_string(),
                reason: format!("{} bytes given; its type takes {bytes}", span.bytes),
            }),
        }
    }

    /// A fresh event recorded on `stream` (a raw handle: the caller's, or one of kiln's; a
    /// caller's handle must be a live stream of this context, the contract of [`DeviceIo`]).
    fn record_on(&self, stream: sys::CUstream) -> Result<cudarc::driver::CudaEvent> {
        let flags = Some(CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let event =
            (self.device.context().new_event(flags)).map_err(|e| error("create event", e))?;
        // SAFETY: a live event; the stream is live by the caller's contract.
        unsafe { cudarc::driver::result::event::record(event.cu_event(), stream) }
            .map_err(|e| error("record event on the stream", e))?;
        Ok(event)
    }

    /// Makes `stream` wait for `event`.
    fn stream_waits(stream: sys::CUstream, event: &cudarc::driver::CudaEvent) -> Result<()> {
        let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: a live event; the stream is live by the caller's contract.
        unsafe { cudarc::driver::result::stream::wait_event(stream, event.cu_event(), flags) }
            .map_err(|e| error("wait for an event", e))
    }
}

impl DeviceIo for CudaExecutable {
    fn ordinal(&self) -> usize {
        self.device.context().ordinal()
    }

    fn stream_handle(&self) -> u64 {
        self.streams[0].cu_stream() as u64
    }

    fn wait_for(&self, stream: u64) -> Result<()> {
        let event = self.record_on(stream as sys::CUstream)?;
        Self::stream_waits(self.streams[0].cu_stream(), &event)
    }

    fn signal(&self, stream: u64) -> Result<()> {
        let event = self.record_on(self.streams[0].cu_stream())?;
        Self::stream_waits(stream as sys::CUstream, &event)
    }

    fn synchronize(&self) -> Result<()> {
        CudaExecutable::synchronize(self)
    }

    fn set_from_device(&mut self, name: &str, src: DeviceSpan) -> Result<()> {
        let what = format!("input `{name}`");
        // A derived copy is never set; a param with copies is set from the host, which casts
        // them.
        self.derived.refuse_direct(name, "set")?;
        if self.derived.copies(name).next().is_some() {
            return Err(Error::Graph {
                what: format!("set `{name}` from device memory"),
                reason: "it has derived copies (bf16 weights of a train program); set it from \
                         host memory"
                    .into(),
            });
        }
        let (slot, ty) = self.input(name)?;
        let ty = ty.clone();
        Self::check_bytes(src, ty.size_bytes(), &what)?;
        self.check_span(src, &what)?;
        if self.index_rules.covers(name) {
            // Index values are checked on the host, as a host input's are.
            let mut words = crate::placed::bytes::aligned_zeros(src.bytes);
            let bytes = crate::placed::bytes::prefix_mut(&mut words, src.bytes);
            {
                let _issuing = super::issuing(&self.issue)?;
                // SAFETY: the range was checked above and the host slice holds `src.bytes`
                // bytes; the stream is synchronized before the slice is read.
                unsafe {
                    cudarc::driver::result::memcpy_dtoh_async(
                        bytes,
                        src.ptr,
                        self.streams[0].cu_stream(),
                    )
                }
                .map_err(|e| error(format!("copy {what} to the host"), e))?;
                (self.streams[0].synchronize()).map_err(|e| error("synchronize", e))?;
            }
            let layout = kiln_ir::Layout::contiguous(ty.shape.clone());
            let host = Tensor::from_host_bytes(ty.dtype, &layout, bytes)?;
            return self.set(name, &host);
        }
        let _issuing = super::issuing(&self.issue)?;
        let dst = self.slots[slot as usize].ptr;
        // SAFETY: the slot holds exactly the input's bytes and `src` was checked to hold them.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst,
                src.ptr,
                src.bytes,
                self.streams[0].cu_stream(),
            )
        }
        .map_err(|e| error(format!("copy {what} on the device"), e))
    }

    fn get_to_device(&self, name: &str, dst: DeviceSpan) -> Result<()> {
        let what = format!("output `{name}`");
        let (addr, layout) = self.output_place(name)?;
        let bytes = layout.ty().size_bytes();
        Self::check_bytes(dst, bytes, &what)?;
        self.check_span(dst, &what)?;
        if !(layout.is_contiguous() && layout.offset() == 0) {
            // A strided view (rare: the official programs' outputs are dense) goes through the
            // host, which lays it out row-major.
            let host = self.get(name)?.contiguous()?;
            let guard = host.storage().read()?;
            let data = crate::placed::bytes::of_data(guard.data());
            let size = host.dtype().size_bytes();
            let data = &data[host.offset() * size..][..bytes];
            let _issuing = super::issuing(&self.issue)?;
            return (self.device.upload(dst.ptr, data, &self.streams[0]))
                .map_err(|e| error(format!("copy {what} to the caller's memory"), e));
        }
        let _issuing = super::issuing(&self.issue)?;
        // SAFETY: the output's bytes lie inside its slot (lowering checked) and `dst` was
        // checked to hold them.
        unsafe {
            cudarc::driver::result::memcpy_dtod_async(
                dst.ptr,
                self.address(addr),
                bytes,
                self.streams[0].cu_stream(),
            )
        }
        .map_err(|e| error(format!("copy {what} on the device"), e))
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let alloc = DeviceAlloc::unfilled(self.device.context(), bytes)?;
        Ok(DeviceBuffer(std::sync::Arc::new(alloc)))
    }
}

#[cfg(test)]
mod tests;
