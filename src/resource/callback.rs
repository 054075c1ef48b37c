//! A resource whose allocate and deallocate are functions given by the user.

use super::{MemoryKind, MemoryResource};
use crate::cuda::Stream;
use crate::error::Result;

/// The allocate function of a [`CallbackMemoryResource`].
pub type AllocateFn = Box<dyn Fn(usize, Stream) -> Result<usize> + Send + Sync>;
/// The deallocate function of a [`CallbackMemoryResource`].
pub type DeallocateFn = Box<dyn Fn(usize, usize, Stream) -> Result<()> + Send + Sync>;

/// Calls the user's functions for every allocation and deallocation.
pub struct CallbackMemoryResource {
    allocate: AllocateFn,
    deallocate: DeallocateFn,
    kind: MemoryKind,
}

impl CallbackMemoryResource {
    /// A resource over `allocate(bytes, stream)` and `deallocate(ptr, bytes, stream)`, handing
    /// out memory of `kind`.
    pub fn new(allocate: AllocateFn, deallocate: DeallocateFn, kind: MemoryKind) -> Self {
        CallbackMemoryResource {
            allocate,
            deallocate,
            kind,
        }
    }
}

impl std::fmt::Debug for CallbackMemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackMemoryResource")
            .finish_non_exhaustive()
    }
}

impl MemoryResource for CallbackMemoryResource {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        (self.allocate)(bytes, stream)
    }

    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        (self.deallocate)(ptr, bytes, stream)
    }

    fn kind(&self) -> MemoryKind {
        self.kind
    }

    fn name(&self) -> &'static str {
        "callback"
    }
}
