//! Streams as cheap `Copy` handles, and an owning stream.

use super::check::check;
use super::driver::ensure_driver;
use crate::error::Result;
use cudarc::driver::sys;

/// A CUDA stream handle: `Copy`, hashable, and never owning. It can name the legacy default
/// stream, the per-thread default stream, a stream rrmm created ([`OwnedStream`]) or a raw
/// `CUstream`/`cudaStream_t` from another library (CuPy, PyTorch, cudarc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Stream(usize);

impl Stream {
    /// The default stream: handle 0, which CUDA treats as the legacy default stream.
    pub const DEFAULT: Stream = Stream(0);
    /// The legacy default stream under its explicit handle (`cudaStreamLegacy`, 0x1).
    pub const LEGACY: Stream = Stream(0x1);
    /// The per-thread default stream (`cudaStreamPerThread`, 0x2): a different stream on each
    /// thread.
    pub const PER_THREAD: Stream = Stream(0x2);

    /// Wraps a raw stream handle from another library.
    ///
    /// # Safety
    /// 1. `handle` is 0, 0x1 or 0x2 (the default streams), or a `CUstream` that stays live (not
    ///    destroyed) for as long as the returned handle, or any resource call made with it, is in
    ///    use: rrmm passes it to the driver (synchronize, event record and wait, stream-ordered
    ///    allocation) without checking it.
    /// 2. If it names a stream, that stream belongs to a context of the device whose resources it
    ///    is used with.
    ///
    /// A handle used only with resources that never call the driver (simulated memory, the host
    /// system allocator with no driver loaded) is a plain key and may be any value.
    pub const unsafe fn from_raw(handle: usize) -> Stream {
        Stream(handle)
    }

    /// The raw handle, for passing to CUDA or other libraries.
    pub const fn raw(self) -> usize {
        self.0
    }

    /// Whether this is the legacy default stream (0 or 0x1).
    pub const fn is_legacy_default(self) -> bool {
        self.0 == 0 || self.0 == 0x1
    }

    /// Whether this is the per-thread default stream.
    pub const fn is_per_thread_default(self) -> bool {
        self.0 == 0x2
    }

    /// Whether this is one of the default streams.
    pub const fn is_default(self) -> bool {
        self.0 <= 0x2
    }

    pub(crate) fn as_cu(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }

    /// Whether `self` and `other` name the same stream (0 and 0x1 both name the legacy
    /// default stream).
    pub const fn same_as(self, other: Stream) -> bool {
        self.0 == other.0 || (self.is_legacy_default() && other.is_legacy_default())
    }

    /// Makes this stream wait, on the device, for the work enqueued on `other` so far (an event
    /// recorded on `other`, waited on by this stream); nothing when they are the same stream.
    /// The host does not wait. The event is made in the current device's primary context
    /// (made current for the call if none is), which `other` must belong to.
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::Error::NoDriver) without a driver; the CUDA errors of
    /// creating, recording or waiting on the event.
    pub fn wait_for(self, other: Stream) -> Result<()> {
        if self.same_as(other) {
            return Ok(());
        }
        let _ctx = super::ContextGuard::new(super::current_device()?)?;
        let event = super::Event::new()?;
        event.record(other)?;
        event.wait_on(self)
    }

    /// Waits on the host for all work enqueued on this stream.
    pub fn synchronize(self) -> Result<()> {
        ensure_driver()?;
        // SAFETY: the handle names a live stream (the caller's contract for raw handles).
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.as_cu())
        })
    }
}

/// A stream rrmm created; destroyed on drop. Derefs to its [`Stream`] handle.
#[derive(Debug)]
pub struct OwnedStream {
    handle: Stream,
}

impl OwnedStream {
    /// Creates a stream on the current device (its primary context is made current if no context
    /// is). `non_blocking` gives
    /// `CU_STREAM_NON_BLOCKING` (no implicit synchronisation with the legacy default stream).
    pub fn new(non_blocking: bool) -> Result<Self> {
        ensure_driver()?;
        let _ctx = super::ContextGuard::new(super::current_device()?)?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = if non_blocking {
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32
        } else {
            sys::CUstream_flags::CU_STREAM_DEFAULT as u32
        };
        // SAFETY: `raw` is a valid out-pointer; the flags are valid stream flags.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, flags)
        })?;
        Ok(OwnedStream {
            handle: Stream(raw as usize),
        })
    }

    /// The handle of this stream.
    pub fn stream(&self) -> Stream {
        self.handle
    }
}

impl std::ops::Deref for OwnedStream {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.handle
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        // SAFETY: this stream was created by `new` and is destroyed exactly once.
        unsafe {
            sys::cuStreamDestroy_v2(self.handle.as_cu());
        }
    }
}

// A stream handle is a plain integer key for the driver, usable from any thread.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Stream>();
    assert_send_sync::<OwnedStream>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_legacy_default_stream_has_two_handles() {
        assert!(Stream::DEFAULT.same_as(Stream::LEGACY) && Stream::LEGACY.same_as(Stream::DEFAULT));
        assert!(!Stream::DEFAULT.same_as(Stream::PER_THREAD));
        // SAFETY: plain keys, never passed to the driver.
        let (a, b) = unsafe { (Stream::from_raw(0x1000), Stream::from_raw(0x2000)) };
        assert!(a.same_as(a) && !a.same_as(b));
    }

    #[test]
    fn waiting_for_the_same_stream_needs_no_driver() {
        Stream::DEFAULT.wait_for(Stream::LEGACY).unwrap();
        Stream::PER_THREAD.wait_for(Stream::PER_THREAD).unwrap();
        if !super::super::driver_available() {
            let other = Stream::DEFAULT.wait_for(Stream::PER_THREAD);
            assert!(matches!(other, Err(crate::Error::NoDriver(_))), "{other:?}");
        }
    }
}
