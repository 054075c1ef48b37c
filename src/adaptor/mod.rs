//! Resource adaptors: each wraps an upstream [`SharedResource`](crate::SharedResource) and adds
//! one behaviour (logging, statistics, tracking, a limit, alignment, a failure callback,
//! prefetching, checked frees), with RMM's semantics. One adaptor per file.

/// Forwards the descriptive methods of [`MemoryResource`](crate::MemoryResource) (kind, device
/// (`memory_from!`), memory_info, report, link, into_any) to `self.upstream`, and names it as the
/// one upstream. With `and OWN`, the link's calls are the upstream's combined with the adaptor's
/// own (`CallProfile::OWN`, for the work it adds to each call).
macro_rules! forward_upstream_info {
    () => {
        forward_upstream_info!(@common);
        /// The upstream's: an adaptor hands out its upstream's memory.
        fn link(&self) -> $crate::resource::Link {
            self.upstream.link()
        }
    };
    (and $own:ident) => {
        forward_upstream_info!(@common);
        /// The upstream's, with the adaptor's own work added to its calls.
        fn link(&self) -> $crate::resource::Link {
            self.upstream
                .link()
                .with_own_calls($crate::resource::CallProfile::$own)
        }
    };
    (@common) => {
        $crate::resource::memory_from!(|this| this.upstream);
        fn memory_info(&self) -> Option<(usize, usize)> {
            self.upstream.memory_info()
        }
        fn report(&self) -> Option<&dyn $crate::report::PoolReport> {
            self.upstream.report()
        }
        fn upstreams(&self) -> Vec<$crate::resource::SharedResource> {
            vec![self.upstream.clone()]
        }
        fn into_any(
            self: std::sync::Arc<Self>,
        ) -> Option<std::sync::Arc<dyn std::any::Any + Send + Sync>> {
            Some(self)
        }
    };
}

/// `deallocate` of an adaptor that hands out its upstream's pointers unchanged and adds nothing
/// to a free: the upstream's.
macro_rules! pass_through_deallocate {
    () => {
        // `Stream` and `Result` as the adaptor's file imports them.
        unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
            // SAFETY: the caller's contract (this resource hands out the upstream's pointers
            // unchanged).
            unsafe { self.upstream.deallocate(ptr, bytes, stream) }
        }
    };
}

mod aligned;
mod checked;
mod failure_callback;
mod fallback;
mod limiting;
mod log_row;
mod logging;
mod prefetch;
mod statistics;
mod tagged;
mod tiered;
mod tracking;

pub use crate::resource::TierCounts;
pub use aligned::AlignedResourceAdaptor;
pub use checked::CheckedResourceAdaptor;
pub use failure_callback::{FailureCallback, FailureCallbackResourceAdaptor};
pub use fallback::{FallbackCounts, FallbackResourceAdaptor};
pub use limiting::LimitingResourceAdaptor;
pub use log_row::LOG_HEADER;
pub use logging::{log_file_for_device, LoggingResourceAdaptor};
pub use prefetch::PrefetchResourceAdaptor;
pub use statistics::{Statistics, StatisticsResourceAdaptor};
pub use tagged::{TaggedMemoryResource, MAX_TAGS};
pub use tiered::{Tier, TierRecord, TieredMemoryResource, MAX_TIERS};
pub use tracking::TrackingResourceAdaptor;

#[cfg(test)]
pub(crate) mod test_util {
    use crate::{SharedResource, SimulatedMemoryResource};
    use std::sync::Arc;

    /// A 1 MiB simulated device.
    pub(crate) fn simulated() -> SharedResource {
        Arc::new(SimulatedMemoryResource::new(1 << 20))
    }

    /// Compile-time check that an adaptor is `Send + Sync`.
    pub(crate) fn assert_send_sync<T: Send + Sync>() {}

    /// A path in the temporary directory for a test's allocation log, `rrmm-log-{tag}-{pid}.csv`.
    pub(crate) fn temp_log_path(tag: &str) -> String {
        std::env::temp_dir()
            .join(format!("rrmm-log-{tag}-{}.csv", std::process::id()))
            .to_string_lossy()
            .into_owned()
    }
}
