//! The stream-ordered core that the pool, fixed-size, expandable and managed resources share:
//! the core itself (`stream_ordered.rs`), each stream's list (`stream_list.rs`), cross-stream
//! ordering (`stream_events.rs`), the free-list and growth interfaces (`free_list.rs`,
//! `growth.rs`) and the counters (`pool_stats.rs`).
//!
//! What the resources over the core and the free-list strategies use is re-exported here; the
//! per-stream lists and the counters stay inside.

/// The free-memory figures of a pool over a [`StreamOrderedCore`] at `self.inner.core`
/// (`free_bytes`, `largest_free_block`, `free_block_count`), the same for every such pool;
/// `$held` says where its bytes are held (in `free_bytes`' doc).
macro_rules! free_figures {
    ($held:literal) => {
        #[doc = concat!("Free bytes in the pool (", $held, " and not allocated), over all streams.")]
        pub fn free_bytes(&self) -> usize {
            self.inner.core.free_bytes()
        }

        /// The largest free block, in bytes.
        ///
        /// # Time Complexity
        /// O(blocks in the largest size class of each stream).
        pub fn largest_free_block(&self) -> usize {
            self.inner.core.footprint().largest_free_block
        }

        /// Number of free blocks, over all streams.
        pub fn free_block_count(&self) -> usize {
            self.inner.core.free_blocks()
        }
    };
}
pub(super) use free_figures;

/// [`Relieve`](crate::pressure::Relieve) for a suballocator's shared state `$inner`, whose
/// stream-ordered core is its `core` field: a relief gives back the core's free chunks and trims
/// its free pages without waiting for its lock; `held` (optional) is what it holds straight from
/// the source (an expandable pool's mapped pages).
macro_rules! relieve_by_core {
    ($inner:ty $(, held: |$this:ident| $held:expr)?) => {
        impl $crate::pressure::Relieve for $inner {
            fn relieve(&self) -> usize {
                self.core.try_release_to(0).unwrap_or(0)
            }

            fn cached(&self) -> usize {
                self.core.free_bytes_now_or_last()
            }

            $(fn held(&self) -> usize {
                let $this = self;
                $held
            })?
        }
    };
}
pub(super) use relieve_by_core;

mod free_list;
mod growth;
mod pool_stats;
pub(super) use pool_stats::ListCounters;
mod stream_events;
mod stream_list;
mod stream_ordered;

pub(super) use free_list::{AddressMap, Block, Found, FreeList};
pub(super) use growth::{
    check_maximum, checked_chunk, memory_info_below, Chunks, FreeRanges, Geometric, GrowRequest,
    Growth,
};
pub(super) use stream_events::current_thread_tag;
pub use stream_events::{
    CudaStreamEvents, EventCall, NoStreamEvents, RecordingStreamEvents, StreamEvents, StreamKey,
};
pub(super) use stream_ordered::{
    default_events, default_events_for, forward_memory_resource, next_instance_id,
    uses_device_streams, Keeps, StreamOrderedCore,
};
