//! [`DeviceIo`] for a GPU executable: device-to-device copies into its input slots and out of
//! its outputs on stream 0 (ordered there after the runs before them and before the runs
//! after them: every run forks from and joins into stream 0), and events between stream 0 and
//! a caller's stream. A caller's range is checked with the driver before it is touched.

use std::sync::Arc;

use super::super::{error, DeviceAlloc, Driver};
use super::{issuing, GpuExecutable};
use crate::device_io::{DeviceBuffer, DeviceIo, DeviceSpan};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

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

impl<D: Driver> DeviceIo for GpuExecutable<D> {
    fn ordinal(&self) -> usize {
        self.device.ordinal()
    }

    fn stream_handle(&self) -> u64 {
        self.device.stream_handle(&self.streams[0])
    }

    fn wait_for(&self, stream: u64) -> Result<()> {
        let event = self.device.record_on_handle(stream)?;
        self.device.wait(&self.streams[0], &event)
    }

    fn signal(&self, stream: u64) -> Result<()> {
        let main = self.device.stream_handle(&self.streams[0]);
        let event = self.device.record_on_handle(main)?;
        self.device.handle_waits(stream, &event)
    }

    fn synchronize(&self) -> Result<()> {
        GpuExecutable::synchronize(self)
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
        check_bytes(src, ty.size_bytes(), &what)?;
        self.device.check_span(src, &what)?;
        if self.index_rules.covers(name) {
            // Index values are checked on the host, as a host input's are.
            let mut words = crate::placed::bytes::aligned_zeros(src.bytes);
            let bytes = crate::placed::bytes::prefix_mut(&mut words, src.bytes);
            {
                let _issuing = issuing::<D>(&self.issue)?;
                // The range was checked above and the host slice holds `src.bytes` bytes.
                (self.device.download(bytes, src.ptr, Some(&self.streams[0])))
                    .map_err(|e| error(D::BACKEND, format!("copy {what} to the host"), e))?;
            }
            let layout = kiln_ir::Layout::contiguous(ty.shape.clone());
            let host = Tensor::from_host_bytes(ty.dtype, &layout, bytes)?;
            return self.set(name, &host);
        }
        let _issuing = issuing::<D>(&self.issue)?;
        let dst = self.slots[slot as usize].ptr;
        // The slot holds exactly the input's bytes and `src` was checked to hold them.
        (self.device.copy(dst, src.ptr, src.bytes, &self.streams[0]))
            .map_err(|e| error(D::BACKEND, format!("copy {what} on the device"), e))
    }

    fn get_to_device(&self, name: &str, dst: DeviceSpan) -> Result<()> {
        let what = format!("output `{name}`");
        let (addr, layout) = self.output_place(name)?;
        let bytes = layout.ty().size_bytes();
        check_bytes(dst, bytes, &what)?;
        self.device.check_span(dst, &what)?;
        if !(layout.is_contiguous() && layout.offset() == 0) {
            // A strided view (rare: the official programs' outputs are dense) goes through the
            // host, which lays it out row-major.
            let host = self.get(name)?.contiguous()?;
            let guard = host.storage().read()?;
            let data = crate::placed::bytes::of_data(guard.data());
            let size = host.dtype().size_bytes();
            let data = &data[host.offset() * size..][..bytes];
            let _issuing = issuing::<D>(&self.issue)?;
            return (self.device.upload(dst.ptr, data, &self.streams[0]))
                .map_err(|e| error(D::BACKEND, format!("copy {what} to the caller's memory"), e));
        }
        let _issuing = issuing::<D>(&self.issue)?;
        // The output's bytes lie inside its slot (lowering checked) and `dst` was checked to
        // hold them.
        let src = self.address(addr);
        (self.device.copy(dst.ptr, src, bytes, &self.streams[0]))
            .map_err(|e| error(D::BACKEND, format!("copy {what} on the device"), e))
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let alloc = DeviceAlloc::unfilled(&self.device, bytes)?;
        Ok(DeviceBuffer(Arc::new(alloc)))
    }
}

#[cfg(test)]
mod tests;
