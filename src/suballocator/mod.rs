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
mod core;
mod expandable;
mod fixed_size;
mod free_lists;
mod managed;
mod pool;

pub use self::core::{
    CudaStreamEvents, EventCall, NoStreamEvents, RecordingStreamEvents, StreamEvents, StreamKey,
};
pub use arena::{check_arena_size, ArenaMemoryResource, SUPERBLOCK_MIN};
pub use binning::BinningMemoryResource;
pub use expandable::{
    AutoPromote, DiscardFill, ExpandableMemoryResource, ExpandableOptions, ExpandableSizes,
    PoolExport, PoolShareFigures, SleepEstimate, SleepReport, SleepTag, DEFAULT_RESERVE_FACTOR,
};
/// Sleep, wake and promotion of any stack (its home is [`crate::resource::sleep`]).
pub mod sleep {
    pub use crate::resource::host_pages::mapped::PromoteReport;
    pub use crate::resource::sleep::stack::*;
    pub use crate::resource::sleep::{SleepCause, SleepPlan};
}
pub use fixed_size::{
    block_of, FixedSizeMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE,
};
pub use managed::{ManagedMemoryResource, ManagedOptions, DEFAULT_CACHE_DIVISOR};
pub use pool::{check_pool_sizes, PoolMemoryResource};

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
