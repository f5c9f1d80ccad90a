//! The CUDA backend's entry: detects the driver without letting cudarc panic when it is absent.

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library with libloading; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
