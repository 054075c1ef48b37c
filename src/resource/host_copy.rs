//! [`HostCopy`]: the host memory that holds a sleeping expandable pool's bytes (see
//! `ExpandableMemoryResource::offload`), pages of the process's host page supply
//! ([`HostPageSupply`]) of the kind the [`VirtualMemory`](super::VirtualMemory) asks for: pinned
//! for a device (copies at the link's speed), plain for host virtual memory (a `memcpy`),
//! nothing for simulated memory (no bytes behind it).

use super::host_supply::{HostPageSupply, HostPages, PageSpec};
use crate::error::Result;

/// Host memory of one sleep: `len()` bytes from `addr()`, back to the supply when dropped.
#[derive(Debug)]
pub enum HostCopy {
    /// Pages of the supply (boxed: a range carries the figures of how it was made).
    Supplied(Box<HostPages>),
    /// No memory: the pages have no bytes to keep (simulated virtual memory); counts `0` bytes
    /// held, its `addr()` is 0.
    Nothing(usize),
}

impl HostCopy {
    /// Host memory for `bytes` bytes of pages of `spec` from `supply` (`None`: pages with no
    /// bytes to keep). A sleep's copy grows with the pool: free ranges of the supply too small
    /// for it are given back first (held between sleeps, they would only add up).
    ///
    /// # Errors
    /// The supply's (no room on the host; the driver's errors).
    pub fn take(
        supply: &'static HostPageSupply,
        spec: Option<PageSpec>,
        bytes: usize,
    ) -> Result<Self> {
        match spec {
            Some(spec) if bytes > 0 => Ok(HostCopy::Supplied(Box::new(
                supply.take_replacing(spec, bytes)?,
            ))),
            _ => Ok(HostCopy::Nothing(bytes)),
        }
    }

    /// The first address (0 for [`HostCopy::Nothing`]).
    pub fn addr(&self) -> usize {
        match self {
            HostCopy::Supplied(p) => p.addr(),
            HostCopy::Nothing(_) => 0,
        }
    }

    /// Bytes it can hold.
    pub fn len(&self) -> usize {
        match self {
            HostCopy::Supplied(p) => p.len(),
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
            HostCopy::Supplied(p) => p.len(),
            HostCopy::Nothing(_) => 0,
        }
    }

    /// Whether the memory is pinned.
    pub fn is_pinned(&self) -> bool {
        matches!(self, HostCopy::Supplied(p) if p.is_pinned())
    }

    /// Whether its pages were ready when taken (made before this sleep).
    pub fn was_ready(&self) -> bool {
        matches!(self, HostCopy::Supplied(p) if p.was_ready())
    }

    /// Makes the drop give the pages back to the OS instead of to the supply.
    pub fn give_back_on_drop(&mut self) {
        if let HostCopy::Supplied(p) = self {
            p.give_back_on_drop();
        }
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
