//! An adaptor that calls back on out of memory and retries while the callback says so.

use crate::cuda::Stream;
use crate::error::Result;
use crate::resource::{MemoryResource, SharedResource};

/// The callback of [`FailureCallbackResourceAdaptor`]: given the bytes that could not be
/// allocated, returns whether to retry, or fails with its own error (typically
/// [`Error::Callback`](crate::Error::Callback) carrying what it raised), which the allocation
/// then returns unchanged.
pub type FailureCallback = Box<dyn Fn(usize) -> Result<bool> + Send + Sync>;

/// On an out-of-memory error from the upstream, calls `callback(bytes)`; retries the allocation
/// while it returns true and returns the error once it returns false (RMM's
/// `failure_callback_resource_adaptor`). Other errors pass through at once; an error of the
/// callback itself is returned as it is (RMM: the callback's exception propagates).
pub struct FailureCallbackResourceAdaptor {
    upstream: SharedResource,
    callback: FailureCallback,
}

impl FailureCallbackResourceAdaptor {
    /// An adaptor over `upstream` calling `callback` on out of memory.
    pub fn new(upstream: SharedResource, callback: FailureCallback) -> Self {
        FailureCallbackResourceAdaptor { upstream, callback }
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.upstream
    }
}

impl MemoryResource for FailureCallbackResourceAdaptor {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        loop {
            match self.upstream.allocate(bytes, stream) {
                Err(e) if e.is_out_of_memory() => {
                    if !(self.callback)(bytes)? {
                        return Err(e);
                    }
                }
                other => return other,
            }
        }
    }

    pass_through_deallocate!();

    // The callback is arbitrary code (a Python function from Python).
    forward_upstream_info!(and UNKNOWN);

    fn name(&self) -> &'static str {
        "failure_callback"
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_util::{assert_send_sync, simulated};
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn retries_while_callback_returns_true() {
        assert_send_sync::<FailureCallbackResourceAdaptor>();
        let calls = Arc::new(AtomicUsize::new(0));
        let seen = calls.clone();
        let mr = FailureCallbackResourceAdaptor::new(
            simulated(),
            Box::new(move |bytes| {
                assert_eq!(bytes, 2 << 20);
                Ok(seen.fetch_add(1, Ordering::SeqCst) < 2)
            }),
        );
        assert!(mr
            .allocate(2 << 20, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let p = mr.allocate(100, Stream::DEFAULT).unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 100, Stream::DEFAULT) }.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn callback_can_free_memory_and_retry_succeeds() {
        let up = simulated();
        let hog = up.allocate(1 << 20, Stream::DEFAULT).unwrap();
        let up2 = up.clone();
        let mr = FailureCallbackResourceAdaptor::new(
            up,
            // SAFETY: `hog` was allocated from `up` with 1 MiB and this callback frees it once
            // (a second call finds it freed and the simulated resource reports that).
            Box::new(move |_| Ok(unsafe { up2.deallocate(hog, 1 << 20, Stream::DEFAULT) }.is_ok())),
        );
        let p = mr.allocate(4096, Stream::DEFAULT).unwrap();
        // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
        unsafe { mr.deallocate(p, 4096, Stream::DEFAULT) }.unwrap();
    }

    /// The callback's own error comes out of `allocate` unchanged, payload and all, through
    /// further adaptors and a pool; the resource keeps working.
    #[test]
    fn the_callbacks_error_travels_untouched_with_its_payload() {
        #[derive(Debug, PartialEq)]
        struct Raised(u32);
        let mr = FailureCallbackResourceAdaptor::new(
            simulated(),
            Box::new(|bytes| {
                Err(crate::Error::callback(
                    format!("raised for {bytes}"),
                    false,
                    Raised(7),
                ))
            }),
        );
        let mr: crate::SharedResource = std::sync::Arc::new(mr);
        let outer = crate::StatisticsResourceAdaptor::new(std::sync::Arc::new(
            crate::LimitingResourceAdaptor::new(mr.clone(), usize::MAX),
        ));
        let err = outer.allocate(2 << 20, Stream::DEFAULT).unwrap_err();
        assert_eq!(err.callback_payload::<Raised>(), Some(&Raised(7)));
        assert_eq!(err.to_string(), "raised for 2097152");
        assert!(!err.is_out_of_memory());
        let p = outer.allocate(100, Stream::DEFAULT).unwrap();
        // SAFETY: allocated just above with 100 bytes, freed once.
        unsafe { outer.deallocate(p, 100, Stream::DEFAULT) }.unwrap();
    }
}
