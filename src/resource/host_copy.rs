//! [`HostCopy`]: the host memory that holds a sleeping expandable pool's bytes (see
//! `ExpandableMemoryResource::offload`), pages of the process's host page supply
//! ([`HostPageSupply`]) of the kind the [`VirtualMemory`](super::VirtualMemory) asks for: pinned
//! for a device (copies at the link's speed), plain for host virtual memory (a `memcpy`),
//! nothing for simulated memory (no bytes behind it).

use super::host_pages::registered::{HostPageSupply, HostPages, PageSpec};
use crate::error::Result;

/// Host memory of one sleep: `len()` bytes over one or more ranges of the supply, back to the
/// supply when dropped. Offsets into it are the copy's own (0 .. `len()`); [`spans`](Self::spans)
/// gives the host addresses of a piece.
#[derive(Debug)]
pub enum HostCopy {
    /// Pages of the supply, in offset order.
    Supplied(Vec<HostPages>),
    /// No memory: the pages have no bytes to keep (simulated virtual memory); counts `0` bytes
    /// held, and its spans are their offsets.
    Nothing(usize),
}

impl HostCopy {
    /// Host memory for `bytes` bytes of pages of `spec` from `supply` (`None`: pages with no
    /// bytes to keep), over as few of its ranges as serve: a copy that grew with its pool takes
    /// the ranges made for the pool as it grew ([`HostPageSupply::take_spanning`]).
    ///
    /// # Errors
    /// The supply's (no room on the host; the driver's errors).
    pub fn take(
        supply: &'static HostPageSupply,
        spec: Option<PageSpec>,
        bytes: usize,
    ) -> Result<Self> {
        match spec {
            Some(spec) if bytes > 0 => Ok(HostCopy::Supplied(supply.take_spanning(spec, bytes)?)),
            _ => Ok(HostCopy::Nothing(bytes)),
        }
    }

    /// The host pieces `(address, bytes)` of the copy's bytes `off .. off + len`, in order
    /// (one piece unless it crosses from one range into the next). For [`HostCopy::Nothing`]
    /// the "address" is the offset.
    pub fn spans(&self, off: usize, len: usize) -> Vec<(usize, usize)> {
        let HostCopy::Supplied(ranges) = self else {
            return vec![(off, len)];
        };
        let mut out = Vec::with_capacity(1);
        let (mut at, mut left, mut start) = (off, len, 0usize);
        for r in ranges {
            if left == 0 {
                break;
            }
            let end = start + r.len();
            if at < end {
                let n = left.min(end - at);
                out.push((r.addr() + (at - start), n));
                at += n;
                left -= n;
            }
            start = end;
        }
        out
    }

    /// Bytes it can hold.
    pub fn len(&self) -> usize {
        match self {
            HostCopy::Supplied(r) => r.iter().map(HostPages::len).sum(),
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
            HostCopy::Supplied(r) => r.iter().map(HostPages::len).sum(),
            HostCopy::Nothing(_) => 0,
        }
    }

    /// The ranges of the supply it spans (0 for [`HostCopy::Nothing`]).
    pub fn ranges(&self) -> usize {
        match self {
            HostCopy::Supplied(r) => r.len(),
            HostCopy::Nothing(_) => 0,
        }
    }

    /// Whether the memory is pinned.
    pub fn is_pinned(&self) -> bool {
        matches!(self, HostCopy::Supplied(r) if r.iter().all(HostPages::is_pinned))
    }

    /// Whether its pages were ready when taken (made before this sleep).
    pub fn was_ready(&self) -> bool {
        matches!(self, HostCopy::Supplied(r) if r.iter().all(HostPages::was_ready))
    }

    /// Makes the drop give the pages back to the OS instead of to the supply.
    pub fn give_back_on_drop(&mut self) {
        if let HostCopy::Supplied(r) = self {
            r.iter_mut().for_each(HostPages::give_back_on_drop);
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
