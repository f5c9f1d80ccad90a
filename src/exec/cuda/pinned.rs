//! Page-locked host bytes. What every step copies from the host (the bound inputs, the
//! tensor tables) is kept here, so that the copies are asynchronous and a CUDA Graph can
//! capture them (a graph copies only from page-locked memory).

use super::device_error;
use crate::exec::ExecError;
use cudarc::driver::result;

/// A page-locked host allocation holding a fixed copy of some bytes; freed when dropped.
pub(super) struct Pinned {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the allocation is owned by this value alone and only read after it is written
// in `copy_of`; the driver reads it only through copies the executor orders.
unsafe impl Send for Pinned {}

impl Pinned {
    /// A page-locked copy of `bytes`, allocated in the current context.
    pub(super) fn copy_of(bytes: &[u8]) -> Result<Pinned, ExecError> {
        // SAFETY: allocates at least one byte of page-locked memory (no flags: neither
        // write-combined nor mapped); it is written below before anything reads it.
        let ptr = unsafe { result::malloc_host(bytes.len().max(1), 0) }.map_err(device_error)?;
        let ptr = ptr.cast::<u8>();
        // SAFETY: `ptr` holds at least `bytes.len()` bytes and does not overlap `bytes`.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        Ok(Pinned {
            ptr,
            len: bytes.len(),
        })
    }

    /// The number of bytes held.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// The address of byte `at` (at most `len()`).
    pub(super) fn address(&self, at: usize) -> *const u8 {
        self.ptr.wrapping_add(at.min(self.len))
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from `malloc_host` and is freed once; the executor synchronizes
        // its streams at the end of every step, so no copy from it is in flight.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}
