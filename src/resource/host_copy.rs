//! [`HostCopy`]: the host memory that holds a sleeping expandable pool's bytes (see
//! `ExpandableMemoryResource::offload`), made by the [`VirtualMemory`](super::VirtualMemory)
//! whose pages it saves: pinned for a device (copies at the link's speed), pageable for host
//! virtual memory (a `memcpy`), nothing for simulated memory (no bytes behind it).

use super::PinnedPages;

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
