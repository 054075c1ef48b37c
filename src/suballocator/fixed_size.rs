//! `FixedSizeMemoryResource`: blocks of one size, stream-ordered, taken from the upstream in
//! chunks.

use super::core::{
    default_events, forward_memory_resource, Chunks, Keeps, StreamEvents, StreamOrderedCore,
};
use super::free_lists::FixedSizeFreeList;
use crate::error::{Error, Result};
use crate::resource::{align_up, SharedResource, ALLOCATION_ALIGNMENT};
use std::sync::Arc;

/// RMM's default block size: 1 MiB.
pub const DEFAULT_BLOCK_SIZE: usize = 1 << 20;
/// RMM's default number of blocks per upstream chunk.
pub const DEFAULT_BLOCKS_TO_PREALLOCATE: usize = 128;

/// Hands out blocks of one size (RMM's `fixed_size_memory_resource`); a larger request is out of
/// memory. Blocks come from the upstream in chunks of `blocks_to_preallocate` blocks (one chunk at
/// construction) and go back only when the resource drops. Stream-ordered like the pool; cheap to
/// clone. A free of a pointer it did not hand out, or of one already freed, is
/// [`Error::Logic`] and changes nothing.
#[derive(Clone, Debug)]
pub struct FixedSizeMemoryResource {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    core: StreamOrderedCore<FixedSizeFreeList>,
    block_size: usize,
    /// The upstream (its growth policy's source, shared).
    upstream: SharedResource,
}

/// A block size given as argument `name` (a fixed-size resource's, a bin's), rounded up to 256
/// bytes, the block each request of it takes.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `name` and the value: 0, or too large to round up.
pub fn block_of(name: &'static str, bytes: usize) -> Result<usize> {
    if bytes == 0 {
        return Err(Error::invalid(
            name,
            format!("{name}=0: must be positive (a block of at least 1 byte)"),
        ));
    }
    align_up(bytes, ALLOCATION_ALIGNMENT).ok_or_else(|| {
        Error::invalid(
            name,
            format!("{name}={bytes}: too large to round up to 256 bytes"),
        )
    })
}

impl FixedSizeMemoryResource {
    /// Blocks of `block_size` bytes (rounded up to 256) over `upstream`, in chunks of
    /// `blocks_to_preallocate` blocks (at least 1); RMM's defaults are
    /// [`DEFAULT_BLOCK_SIZE`] and [`DEFAULT_BLOCKS_TO_PREALLOCATE`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a zero or overflowing block size; the upstream's error when
    /// the first chunk cannot be allocated.
    pub fn new(
        upstream: SharedResource,
        block_size: usize,
        blocks_to_preallocate: usize,
    ) -> Result<Self> {
        let events = default_events(&upstream);
        Self::with_events(upstream, block_size, blocks_to_preallocate, events)
    }

    /// As [`FixedSizeMemoryResource::new`], with an explicit cross-stream ordering
    /// implementation.
    ///
    /// # Errors
    /// As [`FixedSizeMemoryResource::new`].
    pub fn with_events(
        upstream: SharedResource,
        block_size: usize,
        blocks_to_preallocate: usize,
        events: Arc<dyn StreamEvents>,
    ) -> Result<Self> {
        let block_size = block_of("block_size", block_size)?;
        let chunk = block_size
            .checked_mul(blocks_to_preallocate.max(1))
            .ok_or_else(|| Error::invalid("blocks_to_preallocate", "chunk size overflows"))?;
        let source = upstream.clone();
        let core = StreamOrderedCore::new(
            events,
            Box::new(Chunks {
                upstream,
                chunk,
                block: block_size,
                name: "fixed_size",
            }),
            block_size,
            "fixed_size",
            // Not a cache of the place: its chunks stay until it drops (as RMM's), so its free
            // blocks count as held, not as memory a relief could give back.
            Keeps::UntilDropped,
        );
        core.preallocate(chunk)?;
        let inner = Arc::new(Inner {
            core,
            upstream: source,
            block_size,
        });
        Ok(FixedSizeMemoryResource { inner })
    }

    /// The size of every block, in bytes.
    pub fn block_size(&self) -> usize {
        self.inner.block_size
    }

    /// Bytes held from the upstream.
    pub fn pool_size(&self) -> usize {
        self.inner.core.pool_size()
    }

    super::core::free_figures!("held from the upstream");

    /// The upstream resource.
    pub fn upstream(&self) -> &SharedResource {
        &self.inner.upstream
    }
}

forward_memory_resource!(FixedSizeMemoryResource, |this| &this.inner.core);
#[cfg(test)]
// Tests call the unsafe `deallocate` and make fake stream keys, each with its SAFETY line.
#[allow(unsafe_code)]
mod tests {
    use super::*;
    use crate::cuda::Stream;
    use crate::resource::{MemoryResource, SimulatedMemoryResource};
    use crate::test_support::free_on;

    /// 1 KiB blocks, four to a chunk, over 1 MiB of simulated memory.
    fn four_blocks_of_1k() -> FixedSizeMemoryResource {
        let up = Arc::new(SimulatedMemoryResource::new(1 << 20));
        FixedSizeMemoryResource::new(up, 1024, 4).unwrap()
    }

    #[test]
    fn too_large_requests_are_out_of_memory_and_chunks_grow() {
        let up = Arc::new(SimulatedMemoryResource::new(1 << 20));
        let mr = FixedSizeMemoryResource::new(up.clone(), 1000, 4).unwrap();
        assert_eq!(mr.block_size(), 1024);
        assert_eq!(mr.pool_size(), 4096);
        let e = mr.allocate(1025, Stream::DEFAULT).unwrap_err();
        assert!(e.is_out_of_memory(), "{e}");
        let ptrs: Vec<usize> = (0..5)
            .map(|_| mr.allocate(10, Stream::DEFAULT).unwrap())
            .collect();
        assert_eq!(mr.pool_size(), 8192);
        for p in ptrs {
            assert_eq!(p % 256, 0);
            // SAFETY: allocated just above from this resource with this size, freed once; no work uses it.
            unsafe { mr.deallocate(p, 10, Stream::DEFAULT) }.unwrap();
        }
        assert_eq!(mr.free_block_count(), 8);
        assert_eq!((mr.free_bytes(), mr.largest_free_block()), (8192, 1024));
        assert_eq!(mr.name(), "fixed_size");
        drop(mr);
        assert_eq!(up.bytes_in_use(), 0);
    }

    #[test]
    fn double_and_foreign_frees_are_logic_errors_and_change_nothing() {
        // Issue 9: a double free made the same block come out twice.
        let mr = four_blocks_of_1k();
        let a = mr.allocate(100, Stream::DEFAULT).unwrap();
        free_on(&mr, a, 100, Stream::DEFAULT).unwrap();
        let e = free_on(&mr, a, 100, Stream::DEFAULT).unwrap_err();
        assert!(matches!(e, Error::Logic(_)), "{e}");
        assert!(e.to_string().contains("did not allocate"), "{e}");
        // Never handed out: inside a chunk (a free block, and a block's interior) and outside.
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let s = unsafe { Stream::from_raw(0x1000) };
        for bogus in [a + 1024, a + 256, 0x7000_0000] {
            assert!(matches!(free_on(&mr, bogus, 100, s), Err(Error::Logic(_))));
        }
        assert_eq!(mr.free_block_count(), 4, "nothing changed");
        let (x, y) = (
            mr.allocate(100, Stream::DEFAULT).unwrap(),
            mr.allocate(100, Stream::DEFAULT).unwrap(),
        );
        assert_ne!(x, y);
        free_on(&mr, x, 100, s).unwrap();
        free_on(&mr, y, 100, Stream::DEFAULT).unwrap();
        assert_eq!(mr.free_block_count(), 4);
    }

    #[test]
    fn a_free_with_a_size_of_another_block_size_is_a_logic_error() {
        let mr = four_blocks_of_1k();
        let a = mr.allocate(100, Stream::DEFAULT).unwrap();
        // SAFETY: a key only: simulated memory never passes it to the driver.
        let s = unsafe { Stream::from_raw(0x1000) };
        for (bytes, stream) in [(1025, Stream::DEFAULT), (0, Stream::DEFAULT), (4096, s)] {
            let e = free_on(&mr, a, bytes, stream).unwrap_err();
            assert!(
                matches!(&e, Error::Logic(m) if m.contains("1024 bytes")),
                "{e}"
            );
        }
        assert_eq!(mr.free_block_count(), 3, "nothing changed");
        // Any size of the block size is its size.
        free_on(&mr, a, 1000, s).unwrap();
        assert_eq!(mr.free_block_count(), 4);
    }

    #[test]
    fn zero_block_size_is_invalid() {
        let up: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        assert!(matches!(
            FixedSizeMemoryResource::new(up, 0, 4),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
