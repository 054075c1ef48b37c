//! What resources that hold memory report about it: the ground floor of the crate's figures
//! (nothing here imports a resource). A resource offers them through one accessor,
//! [`MemoryResource::report`](crate::MemoryResource::report), which adaptors forward to their
//! upstream; a new figure is a method here and in the resources that have it.
//!
//! - [`Footprint`]: bytes held and free, the largest free block (every memory-holding resource).
//! - [`MemoryStats`]: PyTorch's `torch.cuda.memory_stats()` figures (pools).
//! - [`StreamFree`]: free bytes by the stream whose list holds them (stream-ordered pools).
//! - [`SegmentInfo`]: segments and blocks as `torch.cuda.memory._snapshot()` lays them out.

#![deny(unsafe_code)]

mod byte_spec;
mod footprint;
mod memory_stats;
pub mod snapshot;

pub use byte_spec::{likely_meant_device, read_byte_spec, NotASize};
pub use footprint::{Footprint, StreamFree};

use crate::cuda::Stream;

/// Bytes in binary units, two decimals above a KiB ("512.00 MiB", "100 B"): the one formatter
/// of setup lines and out-of-memory reports.
pub fn human_bytes(bytes: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
pub use memory_stats::{MemoryStats, Stat};
pub use snapshot::{BlockInfo, BlockState, SegmentInfo};

/// The figures of a resource that holds memory (a pool, an arena, an expandable pool, binning,
/// simulated memory), reached through [`MemoryResource::report`](crate::MemoryResource::report).
pub trait PoolReport: Send + Sync {
    /// Bytes held, free, the largest free block and the number of free blocks.
    fn footprint(&self) -> Footprint;

    /// Bytes held ([`Footprint::held_bytes`]) alone: what a caller that samples often asks
    /// for. Resources whose full footprint walks per-stream or per-thread state answer it
    /// without the walk.
    fn held_bytes(&self) -> usize {
        self.footprint().held_bytes
    }

    /// PyTorch-style counters; `None` where the resource keeps none.
    fn memory_stats(&self) -> Option<MemoryStats> {
        None
    }

    /// Sets the peaks of [`PoolReport::memory_stats`] to the current values; whether there were
    /// counters to reset.
    fn reset_peak_memory_stats(&self) -> bool {
        false
    }

    /// Free bytes split by the stream whose list holds them, as seen from `stream`; `None` where
    /// the resource keeps no per-stream lists.
    fn stream_free(&self, stream: Stream) -> Option<StreamFree> {
        let _ = stream;
        None
    }

    /// Every segment and block; `None` where the resource does not lay them out.
    fn memory_snapshot(&self) -> Option<Vec<SegmentInfo>> {
        None
    }

    /// Whether the calling thread is inside one of this resource's own calls to its upstream
    /// (an upstream callback calling back into it): its figures cannot be read from there and
    /// read as empty.
    fn busy(&self) -> bool {
        false
    }

    /// Whether the resource is a source of memory (a simulated device) rather than one that
    /// holds memory from a source: its free bytes are the device's, outside what it holds, so a
    /// resource above it must not count them as free memory it holds.
    fn is_source(&self) -> bool {
        false
    }
}
