//! Peer access between GPUs of one machine: whether a device can read another's memory
//! (`cuDeviceCanAccessPeer`) and turning that access on (`cuCtxEnablePeerAccess`).

use super::check::{check, cuda_error};
use super::context::{primary_context, ContextGuard};
use super::driver::device_handle;
use crate::error::Result;
use cudarc::driver::sys;

/// Whether device `device` can read and write memory of device `peer` directly (NVLink or
/// PCIe peer-to-peer): `cuDeviceCanAccessPeer`. False for a device and itself.
///
/// # Errors
/// No driver, a bad ordinal, or the CUDA error of the call.
pub fn can_access_peer(device: usize, peer: usize) -> Result<bool> {
    let (dev, peer_dev) = (device_handle(device)?, device_handle(peer)?);
    if device == peer {
        return Ok(false);
    }
    let mut can = 0;
    // SAFETY: `can` is a valid out-pointer; both handles are valid devices.
    check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, dev, peer_dev)
    })?;
    Ok(can != 0)
}

/// Maps every `cuMemAlloc` allocation of `peer`'s primary context (those made before and
/// after) into `device`'s primary context, so kernels and copies on `device` use them
/// (`cuCtxEnablePeerAccess` with `device`'s context current). Idempotent: access already
/// enabled is success.
///
/// # Errors
/// No driver, a bad ordinal, the driver's error when the devices have no peer link
/// (`CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`) or the device already has the most peers it can map.
pub fn enable_peer_access(device: usize, peer: usize) -> Result<()> {
    let peer_context = primary_context(peer)?;
    let _ctx = ContextGuard::new(device)?;
    // SAFETY: `device`'s primary context is current (the guard) and `peer_context` is a
    // retained primary context that lives until the process exits; 0 is the only valid flag.
    let result = unsafe { sys::cuCtxEnablePeerAccess(peer_context, 0) };
    match result {
        sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
            Ok(())
        }
        other => Err(cuda_error("cuCtxEnablePeerAccess", other)),
    }
}
