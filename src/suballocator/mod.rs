//! Suballocators: the stream-ordered pool, fixed-size and binning resources, and the arena
//! (`arena/`: global, per-thread and per-stream arenas of superblocks).
//!
//! The pool and the fixed-size resource share one generic core (`core/stream_ordered.rs`, no global
//! lock on the same-stream path) with a pluggable free-list strategy (`core/free_list.rs`: coalescing
//! TLSF-style lists for the pool, stacks of equal blocks for fixed-size) and growth policy
//! (`core/growth.rs`); each stream's list lives in `core/stream_list.rs`; cross-stream ordering goes
//! through [`StreamEvents`].
//!
//! Folders: `core/` (the stream-ordered core, its per-stream lists, events, the free-list and
//! growth interfaces, the counters), `free_lists/` (the free-list strategies and the size-class
//! math), `arena/`; each resource over the core in its own file here.

#![deny(unsafe_code)]

mod arena;
mod binning;
#[path = "free_lists/coalescing_free_list.rs"]
mod coalescing_free_list;
mod expandable;
mod fixed_size;
#[path = "free_lists/fixed_size_free_list.rs"]
mod fixed_size_free_list;
#[path = "core/free_list.rs"]
mod free_list;
#[path = "core/growth.rs"]
mod growth;
mod managed;
mod pool;
#[path = "core/pool_stats.rs"]
mod pool_stats;
#[path = "free_lists/size_classes.rs"]
mod size_classes;
#[path = "core/stream_events.rs"]
pub mod stream_events;
#[path = "core/stream_list.rs"]
mod stream_list;
#[path = "core/stream_ordered.rs"]
mod stream_ordered;
#[path = "free_lists/whole_block_free_list.rs"]
mod whole_block_free_list;

pub use arena::{ArenaMemoryResource, SUPERBLOCK_MIN};
pub use binning::BinningMemoryResource;
pub use expandable::{
    DiscardFill, ExpandableMemoryResource, SleepEstimate, SleepReport, SleepTag,
    DEFAULT_RESERVE_FACTOR,
};
/// Sleep and wake of the expandable pools under a stack (see
/// [`ExpandableMemoryResource::offload`]).
pub mod sleep {
    pub use super::expandable::{asleep, offload, restore, sleep_estimate, sleep_targets};
}
pub use fixed_size::{FixedSizeMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE};
pub use managed::{ManagedMemoryResource, ManagedOptions, DEFAULT_CACHE_DIVISOR};
pub use pool::PoolMemoryResource;
pub use stream_events::{
    CudaStreamEvents, EventCall, NoStreamEvents, RecordingStreamEvents, StreamEvents, StreamKey,
};

// Every suballocator is a thread-safe memory resource.
const _: () = {
    const fn assert_resource<T: crate::resource::MemoryResource + Send + Sync + Clone>() {}
    assert_resource::<PoolMemoryResource>();
    assert_resource::<ArenaMemoryResource>();
    assert_resource::<FixedSizeMemoryResource>();
    assert_resource::<BinningMemoryResource>();
    assert_resource::<ExpandableMemoryResource>();
    assert_resource::<ManagedMemoryResource>();
};
