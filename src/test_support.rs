//! Helpers shared by the crate's unit tests.

use crate::cuda::Stream;
use crate::resource::MemoryResource;
use crate::Result;

/// Frees `ptr` (`bytes` bytes) on `stream` through the unsafe trait method, for tests over
/// resources that check every free against what they handed out (a bad one is an error, which
/// the tests provoke on purpose) and whose memory no work uses.
pub(crate) fn free_on<M: MemoryResource + ?Sized>(
    mr: &M,
    ptr: usize,
    bytes: usize,
    stream: Stream,
) -> Result<()> {
    // SAFETY: the tests free pointers from `allocate` on `mr` with their sizes, once, or bogus
    // ones that these resources check and refuse; nothing dereferences the (simulated) memory
    // or runs work on it.
    unsafe { mr.deallocate(ptr, bytes, stream) }
}

/// [`free_on`] the default stream.
pub(crate) fn free<M: MemoryResource + ?Sized>(mr: &M, ptr: usize, bytes: usize) -> Result<()> {
    free_on(mr, ptr, bytes, Stream::DEFAULT)
}
