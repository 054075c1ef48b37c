//! Events, used to order one stream after another.

use super::check::check;
use super::driver::ensure_driver;
use super::stream::Stream;
use crate::error::Result;
use cudarc::driver::sys;

/// An owned CUDA event with timing disabled (the cheap kind); destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: usize,
}

impl Event {
    /// Creates an event on the current device (its primary context is made current if no
    /// context is).
    pub fn new() -> Result<Self> {
        ensure_driver()?;
        let _ctx = super::ContextGuard::new(super::current_device()?)?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; the flag is a valid event flag.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(Event { raw: raw as usize })
    }

    /// Records the work enqueued so far on `stream`.
    pub fn record(&self, stream: Stream) -> Result<()> {
        // SAFETY: the event is live; the stream handle is the caller's live stream.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw as sys::CUevent, stream.as_cu())
        })
    }

    /// Makes `stream` wait (on the device) for the work this event recorded.
    pub fn wait_on(&self, stream: Stream) -> Result<()> {
        // SAFETY: the event is live; flags 0 is the only valid value.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream.as_cu(), self.raw as sys::CUevent, 0)
        })
    }

    /// Waits on the host for the recorded work.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is live.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw as sys::CUevent)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event was created by `new` and is destroyed exactly once.
        unsafe {
            sys::cuEventDestroy_v2(self.raw as sys::CUevent);
        }
    }
}
