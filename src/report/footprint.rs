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
    /// External fragmentation: `1 - largest_free_block / free_bytes` (0 when nothing is free).
    pub fn fragmentation(&self) -> f64 {
        if self.free_bytes == 0 {
            0.0
        } else {
            1.0 - self.largest_free_block as f64 / self.free_bytes as f64
        }
    }
}
