//! Whether `Device::Cuda` has a device: the CUDA driver, loaded at run time through `cudarc`
//! (a machine without `libcuda` answers no, never panics).

use std::sync::OnceLock;

/// CUDA devices the driver sees, or why none is usable (no driver library, the driver failed
/// to start, no device). Probed once per process.
pub fn devices() -> Result<i32, String> {
    static PROBED: OnceLock<Result<i32, String>> = OnceLock::new();
    PROBED.get_or_init(probe).clone()
}

fn probe() -> Result<i32, String> {
    // SAFETY: only tries to open the driver library; no CUDA call is made without it.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err("no CUDA driver on this machine (libcuda.so was not found); install NVIDIA's driver, or use Device::Cpu or Device::Gpu".into());
    }
    cudarc::driver::result::init().map_err(|e| format!("the CUDA driver did not start: {e:?}"))?;
    let n = cudarc::driver::result::device::get_count()
        .map_err(|e| format!("cuDeviceGetCount: {e:?}"))?;
    if n == 0 {
        return Err("the CUDA driver sees no device".into());
    }
    Ok(n)
}
