//! Suballocators: the stream-ordered pool, fixed-size and binning resources, and the arena
//! (`arena/`: global, per-thread and per-stream arenas of superblocks).
//!
//! The pool and the fixed-size resource share one generic core (`stream_ordered.rs`, no global
//! lock on the same-stream path) with a pluggable free-list strategy (`free_list.rs`: coalescing
//! TLSF-style lists for the pool, stacks of equal blocks for fixed-size) and growth policy
//! (`growth.rs`); each stream's list lives in `stream_list.rs`; cross-stream ordering goes
//! through [`StreamEvents`].

#![deny(unsafe_code)]

mod arena;
mod binning;
mod coalescing_free_list;
mod expandable;
mod fixed_size;
mod fixed_size_free_list;
mod free_list;
mod growth;
mod managed;
mod pool;
mod pool_stats;
mod size_classes;
pub mod stream_events;
mod stream_list;
mod stream_ordered;
mod whole_block_free_list;

pub use arena::{ArenaMemoryResource, SUPERBLOCK_MIN};
pub use binning::BinningMemoryResource;
pub use expandable::{ExpandableMemoryResource, DEFAULT_RESERVE_FACTOR};
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
