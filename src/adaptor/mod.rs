//! Resource adaptors: each wraps an upstream [`SharedResource`](crate::SharedResource) and adds
//! one behaviour (logging, statistics, tracking, a limit, alignment, a failure callback,
//! prefetching), with RMM's semantics. One adaptor per file.

/// Forwards the descriptive methods of [`MemoryResource`](crate::MemoryResource) (kind, device,
/// memory_info, footprint) to `self.upstream`.
macro_rules! forward_upstream_info {
    () => {
        fn kind(&self) -> $crate::MemoryKind {
            self.upstream.kind()
        }
        fn device(&self) -> Option<usize> {
            self.upstream.device()
        }
        fn memory_info(&self) -> Option<(usize, usize)> {
            self.upstream.memory_info()
        }
        fn footprint(&self) -> Option<$crate::Footprint> {
            self.upstream.footprint()
        }
    };
}

mod aligned;
mod failure_callback;
mod limiting;
mod log_row;
mod logging;
mod prefetch;
mod statistics;
mod tracking;

pub use aligned::AlignedResourceAdaptor;
pub use failure_callback::{FailureCallback, FailureCallbackResourceAdaptor};
pub use limiting::LimitingResourceAdaptor;
pub use log_row::LOG_HEADER;
pub use logging::LoggingResourceAdaptor;
pub use prefetch::PrefetchResourceAdaptor;
pub use statistics::{Statistics, StatisticsResourceAdaptor};
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
}
