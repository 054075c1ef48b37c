//! Primary contexts: made current where a call needs one, and the caller's context restored.

use super::check::check;
use super::driver::{device_count, device_handle, ensure_driver};
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// One slot per device for its retained primary context, as an address.
fn context_table() -> &'static [OnceLock<usize>] {
    // Why process-wide: a device's primary context is one per process (CUDA's), retained once.
    static CONTEXTS: OnceLock<Vec<OnceLock<usize>>> = OnceLock::new();
    CONTEXTS.get_or_init(|| (0..device_count()).map(|_| OnceLock::new()).collect())
}

/// The retained primary context of each device (contexts live until exit).
pub(super) fn primary_context(ordinal: usize) -> Result<sys::CUcontext> {
    let table = context_table();
    let slot = table
        .get(ordinal)
        .ok_or_else(|| Error::invalid("device", format!("device {ordinal} does not exist")))?;
    if let Some(&ctx) = slot.get() {
        return Ok(ctx as sys::CUcontext);
    }
    let device = device_handle(ordinal)?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; the retained context is never released, so the
    // address stays valid for the life of the process.
    check("cuDevicePrimaryCtxRetain", unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, device)
    })?;
    let ctx = *slot.get_or_init(|| ctx as usize);
    Ok(ctx as sys::CUcontext)
}

fn current_context() -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer.
    check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut ctx) })?;
    Ok(ctx)
}

/// The device of the calling thread's current context (CUDA's "current device"); 0 when no
/// context is current or the machine has one device. rrmm's one notion of "current device".
pub fn current_device() -> Result<usize> {
    ensure_driver()?;
    // With at most one device the answer is 0 whatever is current: no driver call.
    if context_table().len() <= 1 {
        return Ok(0);
    }
    let ctx = current_context()?;
    if ctx.is_null() {
        return Ok(0);
    }
    // Fast path: a primary context rrmm already knows (one TLS read, no further driver call).
    if let Some(ordinal) = context_table()
        .iter()
        .position(|slot| slot.get() == Some(&(ctx as usize)))
    {
        return Ok(ordinal);
    }
    let mut device = 0;
    // SAFETY: a context is current, and `device` is a valid out-pointer.
    check("cuCtxGetDevice", unsafe {
        sys::cuCtxGetDevice(&mut device)
    })?;
    let mut ordinal = 0;
    for i in 0..device_count() {
        if device_handle(i)? == device {
            ordinal = i;
            break;
        }
    }
    Ok(ordinal)
}

/// Makes the primary context of device `ordinal` current on this thread and leaves it current
/// (CUDA's `cudaSetDevice`).
///
/// # Errors
/// No driver, a bad ordinal, or the CUDA error of the context calls.
pub fn set_current_device(ordinal: usize) -> Result<()> {
    ensure_driver()?;
    let ctx = primary_context(ordinal)?;
    // SAFETY: `ctx` is a retained primary context that lives until the process exits.
    check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// Makes a device's primary context current for as long as it lives, then restores the
/// caller's context. Costs one `cuCtxGetCurrent` when the right context is already current.
///
/// A thread with no current context keeps the primary context bound after the guard (as the
/// CUDA runtime binds it on a thread's first call): unbinding it again would cost two
/// `cuCtxSetCurrent` on every later call from that thread (a third of a `cuda_async`
/// allocate-free pair, measured), and no context is what such a thread had only because nothing
/// had used CUDA on it yet. A different context that was current is restored.
#[must_use = "the context is restored when the guard drops"]
pub struct ContextGuard {
    previous: Option<usize>,
}

impl ContextGuard {
    /// Makes the primary context of device `ordinal` current on this thread.
    ///
    /// # Errors
    /// [`Error::NoDriver`] without a driver, [`Error::InvalidArgument`] for a bad ordinal, or the
    /// CUDA error of the context calls.
    pub fn new(ordinal: usize) -> Result<Self> {
        ensure_driver()?;
        let wanted = primary_context(ordinal)?;
        let current = current_context()?;
        if current == wanted {
            return Ok(ContextGuard { previous: None });
        }
        // SAFETY: `wanted` is a retained primary context that outlives this call.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(wanted) })?;
        Ok(ContextGuard {
            previous: (!current.is_null()).then_some(current as usize),
        })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous {
            // SAFETY: restores the context that was current before (possibly null, which
            // unbinds); the result is ignored because drop cannot report it.
            unsafe {
                sys::cuCtxSetCurrent(previous as sys::CUcontext);
            }
        }
    }
}
