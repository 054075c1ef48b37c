//! [`HostCopy`]: the host memory that holds a sleeping expandable pool's bytes (see
//! `ExpandableMemoryResource::offload`), made by the [`VirtualMemory`](super::VirtualMemory)
//! whose pages it saves: pinned for a device (copies at the link's speed), pageable for host
//! virtual memory (a `memcpy`), nothing for simulated memory (no bytes behind it).

use super::PinnedPages;
use crate::error::Result;

/// Host memory of one sleep: `len()` bytes from `addr()`, released when dropped.
#[derive(Debug)]
pub enum HostCopy {
    /// Pinned host pages (a device's pages are copied here by DMA).
    Pinned(PinnedPages),
    /// Pageable host memory.
    Pageable(Vec<u8>),
    /// No memory: the pages have no bytes to keep (simulated virtual memory); counts `0` bytes
    /// held, its `addr()` is 0.
    Nothing(usize),
}

impl HostCopy {
    /// Host memory for `bytes` bytes of pageable memory (zeroed lazily by the kernel).
    pub fn pageable(bytes: usize) -> Self {
        HostCopy::Pageable(vec![0; bytes])
    }

    /// The first address (0 for [`HostCopy::Nothing`]); `&mut` because copies write through it.
    pub fn addr(&mut self) -> usize {
        match self {
            HostCopy::Pinned(p) => p.addr(),
            HostCopy::Pageable(v) => v.as_mut_ptr() as usize,
            HostCopy::Nothing(_) => 0,
        }
    }

    /// Bytes it can hold.
    pub fn len(&self) -> usize {
        match self {
            HostCopy::Pinned(p) => p.bytes(),
            HostCopy::Pageable(v) => v.len(),
            HostCopy::Nothing(n) => *n,
        }
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of host memory it holds (0 for [`HostCopy::Nothing`]).
    pub fn host_bytes(&self) -> usize {
        match self {
            HostCopy::Nothing(_) => 0,
            _ => self.len(),
        }
    }

    /// Whether the memory is pinned.
    pub fn is_pinned(&self) -> bool {
        matches!(self, HostCopy::Pinned(_))
    }
}

/// A point in a virtual memory's queued copies ([`VirtualMemory::copy_fence`]): waiting on it
/// waits for every copy asked before it, not for those asked after.
///
/// [`VirtualMemory::copy_fence`]: super::VirtualMemory::copy_fence
#[derive(Debug)]
pub struct CopyFence(Option<crate::cuda::Event>);

impl CopyFence {
    /// A fence with nothing to wait for (copies that ran when asked).
    pub fn done() -> Self {
        CopyFence(None)
    }

    /// A fence at `event`, recorded after the copies.
    pub fn at(event: crate::cuda::Event) -> Self {
        CopyFence(Some(event))
    }

    /// Waits for the copies asked before the fence.
    ///
    /// # Errors
    /// CUDA errors of the copies.
    pub fn wait(&self) -> Result<()> {
        match &self.0 {
            Some(event) => event.synchronize(),
            None => Ok(()),
        }
    }
}
