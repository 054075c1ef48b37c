//! How much memory a resource holds and how fragmented its free part is.

/// How much memory a resource holds and how fragmented its free part is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Bytes held from the upstream (a pool's size; for simulated memory, the bytes in use).
    pub held_bytes: usize,
    /// Bytes held but free.
    pub free_bytes: usize,
    /// The largest free block, in bytes.
    pub largest_free_block: usize,
    /// Number of free blocks.
    pub free_blocks: usize,
}

impl Footprint {
    /// Two resources' footprints together: bytes and blocks summed, the larger largest block.
    #[must_use]
    pub fn plus(self, other: Footprint) -> Footprint {
        Footprint {
            held_bytes: self.held_bytes.saturating_add(other.held_bytes),
            free_bytes: self.free_bytes.saturating_add(other.free_bytes),
            largest_free_block: self.largest_free_block.max(other.largest_free_block),
            free_blocks: self.free_blocks.saturating_add(other.free_blocks),
        }
    }

    /// External fragmentation: `1 - largest_free_block / free_bytes` (0 when nothing is free).
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.free_bytes as f64
        }
    }
}

/// Free bytes of a stream-ordered pool by the stream whose list holds them, as seen from one
/// stream: what that stream can take at once, and what waits on other streams' lists (memory
/// freed there, reusable here only after their work: the pool synchronizes those streams, or all
/// of them, to take it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamFree {
    /// Free bytes on the stream's own list.
    pub this_stream: usize,
    /// Free bytes on other streams' lists.
    pub other_streams: usize,
    /// How many other streams' lists hold free bytes.
    pub other_lists: usize,
}
