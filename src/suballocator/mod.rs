//! Stream-ordered suballocators: the pool, the fixed-size resource and the binning resource.
//!
//! The pool and the fixed-size resource share one generic core (`stream_ordered.rs`, no global
//! lock on the same-stream path) with a pluggable free-list strategy (`free_list.rs`: coalescing
//! TLSF-style lists for the pool, stacks of equal blocks for fixed-size) and growth policy
//! (`growth.rs`); each stream's list lives in `stream_list.rs`; cross-stream ordering goes
//! through [`StreamEvents`].

#![deny(unsafe_code)]

mod binning;
mod coalescing_free_list;
mod fixed_size;
mod fixed_size_free_list;
mod free_list;
mod growth;
mod pool;
pub mod stream_events;
mod stream_list;
mod stream_ordered;

pub use binning::BinningMemoryResource;
pub use fixed_size::{FixedSizeMemoryResource, DEFAULT_BLOCKS_TO_PREALLOCATE, DEFAULT_BLOCK_SIZE};
pub use pool::PoolMemoryResource;
pub use stream_events::{
    CudaStreamEvents, EventCall, NoStreamEvents, RecordingStreamEvents, StreamEvents, StreamKey,
};

// Every suballocator is a thread-safe memory resource.
const _: () = {
    const fn assert_resource<T: crate::resource::MemoryResource + Send + Sync + Clone>() {}
    assert_resource::<PoolMemoryResource>();
    assert_resource::<FixedSizeMemoryResource>();
    assert_resource::<BinningMemoryResource>();
};
