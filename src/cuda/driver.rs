//! Finding the driver and asking it about devices.

use super::check::check;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// The outcome of loading and initialising the driver, computed once per process.
fn driver_state() -> &'static std::result::Result<(), String> {
    // Why process-wide: the driver is loaded and initialised once per process.
    static STATE: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STATE.get_or_init(|| {
        // cudarc panics when libcuda is absent, so ask first, and never let a panic escape.
        let present = std::panic::catch_unwind(|| {
            // SAFETY: only tries to open the library by name; no other state is touched.
            unsafe { sys::is_culib_present() }
        })
        .unwrap_or(false);
        if !present {
            return Err("libcuda could not be loaded (no NVIDIA driver on this machine)".into());
        }
        let init = std::panic::catch_unwind(|| {
            // SAFETY: cuInit has no preconditions; 0 is the only valid flag value.
            unsafe { sys::cuInit(0) }
        });
        match init {
            Ok(sys::CUresult::CUDA_SUCCESS) => Ok(()),
            Ok(code) => Err(format!("cuInit failed: {code:?}")),
            Err(_) => Err("the CUDA driver library lacks a required symbol".into()),
        }
    })
}

/// Whether a CUDA driver is loaded and initialised. Never panics.
pub fn driver_available() -> bool {
    driver_state().is_ok()
}

/// Returns `Ok` when the driver is usable, else [`Error::NoDriver`].
#[inline]
pub fn ensure_driver() -> Result<()> {
    match driver_state() {
        Ok(()) => Ok(()),
        Err(why) => Err(Error::NoDriver(why.clone())),
    }
}

/// Number of CUDA devices; 0 where there is no driver.
pub fn device_count() -> usize {
    if ensure_driver().is_err() {
        return 0;
    }
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    match check("cuDeviceGetCount", unsafe {
        sys::cuDeviceGetCount(&mut count)
    }) {
        Ok(()) => count.max(0) as usize,
        Err(_) => 0,
    }
}

/// The driver's CUDA version, as `major * 1000 + minor * 10`.
pub fn driver_version() -> Result<i32> {
    ensure_driver()?;
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer.
    check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut version)
    })?;
    Ok(version)
}

/// The driver's handle for device `ordinal`, checked against the device count.
pub(crate) fn device_handle(ordinal: usize) -> Result<sys::CUdevice> {
    ensure_driver()?;
    let count = device_count();
    if ordinal >= count {
        return Err(Error::invalid(
            "device",
            format!("device {ordinal} does not exist ({count} devices)"),
        ));
    }
    let mut device = 0;
    // SAFETY: `device` is a valid out-pointer and the ordinal is in range.
    check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut device, ordinal as i32)
    })?;
    Ok(device)
}

/// The UUID of device `ordinal` as `nvidia-smi` writes it (`GPU-xxxxxxxx-xxxx-...`): the same
/// device in every process, whatever `CUDA_VISIBLE_DEVICES` makes its ordinal.
pub fn device_uuid(ordinal: usize) -> Result<String> {
    let device = device_handle(ordinal)?;
    // SAFETY: all-zero is a valid value of this plain C struct.
    let mut uuid: sys::CUuuid = unsafe { std::mem::zeroed() };
    // SAFETY: `uuid` is a valid out-pointer and the device a valid handle.
    check("cuDeviceGetUuid", unsafe {
        sys::cuDeviceGetUuid(&mut uuid, device)
    })?;
    let hex: String = uuid
        .bytes
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect();
    Ok(format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// The marketing name of device `ordinal`.
pub fn device_name(ordinal: usize) -> Result<String> {
    let device = device_handle(ordinal)?;
    let mut buf = [0 as std::ffi::c_char; 256];
    // SAFETY: the buffer is 256 bytes long and the length passed says so.
    check("cuDeviceGetName", unsafe {
        sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device)
    })?;
    // SAFETY: the driver NUL-terminates the name inside the buffer.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}
