//! The stream-ordered core that the pool, fixed-size, expandable and managed resources share:
//! the core itself (`stream_ordered.rs`), each stream's list (`stream_list.rs`), cross-stream
//! ordering (`stream_events.rs`), the free-list and growth interfaces (`free_list.rs`,
//! `growth.rs`) and the counters (`pool_stats.rs`).
//!
//! What the resources over the core and the free-list strategies use is re-exported here; the
//! per-stream lists and the counters stay inside.

mod free_list;
mod growth;
mod pool_stats;
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
    uses_device_streams, StreamOrderedCore,
};
