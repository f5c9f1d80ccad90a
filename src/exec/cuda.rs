//! The CUDA backend's entry: detects the driver without letting cudarc panic when it is absent.

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    std::panic::catch_unwind(cudarc::driver::sys::is_culib_present).unwrap_or(false)
}
