//! The plan's arena on the GPU: one allocation, device memory (`cuMemAlloc`), or for a plan
//! in unified memory (`--unified`) managed memory (`cuMemAllocManaged`) that the driver
//! pages between the device and the host as the kernels touch it. Everything else reaches
//! it by address: kernels get its base, uploads and downloads copy at base plus offset on
//! the compute stream, in stream order with the kernels.

use super::device_error;
use super::pinned::Pinned;
use crate::exec::ExecError;
use cudarc::driver::{
    result, sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DriverError, UnifiedSlice,
};
use std::ops::Range;
use std::sync::Arc;

/// The arena's allocation; it is freed when dropped.
pub(super) enum Arena {
    /// Device memory.
    Device(CudaSlice<u8>),
    /// Managed memory, attached to every stream.
    Managed(UnifiedSlice<u8>),
}

impl Arena {
    /// `bytes` zeroed (at least one), in managed memory when `managed`; the device
    /// refusing managed memory is a device error saying so.
    pub(super) fn zeroed(
        ctx: &Arc<CudaContext>,
        stream: &Arc<CudaStream>,
        bytes: u64,
        managed: bool,
    ) -> Result<Arena, ExecError> {
        let bytes = bytes.max(1) as usize;
        if !managed {
            return (stream.alloc_zeros::<u8>(bytes))
                .map(Arena::Device)
                .map_err(device_error);
        }
        // SAFETY: bytes are valid for every bit pattern, and they are zeroed below before
        // anything reads them.
        let slice = unsafe { ctx.alloc_unified::<u8>(bytes, true) }.map_err(|e: DriverError| {
            ExecError::Device(format!(
                "CUDA driver: managed memory for the unified arena ({bytes} bytes): {e}"
            ))
        })?;
        let arena = Arena::Managed(slice);
        // SAFETY: the range is the whole allocation just made.
        unsafe { result::memset_d8_async(arena.base(stream), 0, bytes, stream.cu_stream()) }
            .map_err(device_error)?;
        Ok(arena)
    }

    /// The arena's device address.
    pub(super) fn base(&self, stream: &CudaStream) -> u64 {
        let (ptr, _recorded) = match self {
            Arena::Device(s) => s.device_ptr(stream),
            Arena::Managed(s) => s.device_ptr(stream),
        };
        ptr
    }

    /// The arena's length in bytes.
    fn len(&self) -> usize {
        match self {
            Arena::Device(s) => s.len(),
            Arena::Managed(s) => s.len(),
        }
    }

    /// Copies `bytes` to offset `at`, after the work issued on `stream` so far (a copy from
    /// pageable host memory: `bytes` may be reused once this returns).
    pub(super) fn upload(
        &self,
        stream: &CudaStream,
        at: usize,
        bytes: &[u8],
    ) -> Result<(), ExecError> {
        self.check(at..at + bytes.len())?;
        // SAFETY: the range lies inside the allocation (checked); a copy from pageable
        // memory has consumed `bytes` when the call returns.
        unsafe {
            result::memcpy_htod_async(self.base(stream) + at as u64, bytes, stream.cu_stream())
        }
        .map_err(device_error)
    }

    /// Copies bytes `from[range]` of page-locked memory to offset `at`, asynchronously
    /// after the work issued on `stream` so far (a copy a CUDA Graph can capture).
    pub(super) fn upload_pinned(
        &self,
        stream: &CudaStream,
        at: usize,
        from: &Pinned,
        range: Range<usize>,
    ) -> Result<(), ExecError> {
        self.check(at..at + range.len())?;
        if range.end > from.len() {
            return Err(ExecError::Shape(format!(
                "bytes {range:?} lie past the {} staged",
                from.len()
            )));
        }
        // SAFETY: the destination lies inside the allocation and the source inside the
        // page-locked allocation (both checked), which lives until the stream is
        // synchronized at the step's end.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.base(stream) + at as u64,
                from.address(range.start).cast(),
                range.len(),
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(device_error)
    }

    /// The bytes of `range`, once the work issued on `stream` so far is done.
    pub(super) fn download(
        &self,
        stream: &CudaStream,
        range: Range<usize>,
    ) -> Result<Vec<u8>, ExecError> {
        self.check(range.clone())?;
        let mut out = vec![0u8; range.len()];
        let from = self.base(stream) + range.start as u64;
        // SAFETY: the range lies inside the allocation (checked) and `out` holds its bytes;
        // the stream is synchronized before `out` is read.
        unsafe { result::memcpy_dtoh_async(&mut out, from, stream.cu_stream()) }
            .map_err(device_error)?;
        stream.synchronize().map_err(device_error)?;
        Ok(out)
    }

    fn check(&self, range: Range<usize>) -> Result<(), ExecError> {
        match range.end <= self.len() {
            true => Ok(()),
            false => Err(ExecError::Shape(format!(
                "bytes {range:?} lie past the arena's {}",
                self.len()
            ))),
        }
    }
}
