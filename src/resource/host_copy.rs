//! [`HostCopy`]: where a sleeping expandable pool's bytes are (see
//! `ExpandableMemoryResource::offload`): pages of the process's host page supply
//! ([`HostPageSupply`]) of the kind the pool asks for (the [`VirtualMemory`]'s: pinned for a
//! device, copies at the link's speed; plain for host virtual memory, a `memcpy`; or plain
//! pageable pages a pool chose), files on disk ([`DiskCopy`]), or nothing for simulated memory
//! (no bytes behind it).

use super::host_pages::disk::DiskCopy;
use super::host_pages::registered::{HostPageSupply, HostPages, PageKind, PageSpec};
use super::VirtualMemory;
use crate::error::Result;

/// Where one sleep's bytes are: `len()` bytes over one or more ranges of the supply (back to the
/// supply when dropped), or files. Offsets into it are the copy's own (0 .. `len()`);
/// [`host_spans`](Self::host_spans) gives the host addresses of a piece, [`copy`](Self::copy)
/// moves bytes between it and the pool's pages.
#[derive(Debug)]
pub enum HostCopy {
    /// Pages of the supply, in offset order.
    Supplied(Vec<HostPages>),
    /// No memory: the pages have no bytes to keep (simulated virtual memory); counts `0` bytes
    /// held, and its spans are their offsets.
    Nothing(usize),
    /// Files on disk (a sleep with a disk target); no host memory held between transitions.
    OnDisk(Box<DiskCopy>),
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
    /// (one piece unless it crosses from one range into the next); `None` where no host memory
    /// holds them (nothing, or files).
    pub fn host_spans(&self, off: usize, len: usize) -> Option<Vec<(usize, usize)>> {
        matches!(self, HostCopy::Supplied(_)).then(|| self.spans(off, len))
    }

    /// As [`host_spans`](Self::host_spans); for [`HostCopy::Nothing`] the "address" is the
    /// offset (the pieces of a disk copy are not host memory: never asked).
    fn spans(&self, off: usize, len: usize) -> Vec<(usize, usize)> {
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

    /// Copies `bytes` between the pool's device addresses `dev ..` and the copy at `off`,
    /// `toward` the copy ([`Toward::Copy`]: a sleep) or the device ([`Toward::Device`]: a
    /// wake); queued (the copies may run until `vm`'s `wait_copies`; a disk copy's writes are
    /// done when this returns).
    ///
    /// # Safety
    /// 1. As [`VirtualMemory::copy_out`]'s (toward the copy) or [`VirtualMemory::copy_in`]'s
    ///    (toward the device) first precondition for `dev .. dev + bytes`.
    /// 2. `off + bytes` is at most [`len`](Self::len); nothing else uses those bytes of the copy,
    ///    which lives, until the copies are waited for.
    ///
    /// # Errors
    /// The virtual memory's copy errors; a disk copy's file errors (out of memory for a full
    /// disk, a file that changed since the sleep).
    pub unsafe fn copy(
        &self,
        vm: &dyn VirtualMemory,
        toward: Toward,
        dev: usize,
        off: usize,
        bytes: usize,
    ) -> Result<()> {
        if let HostCopy::OnDisk(disk) = self {
            // SAFETY: the caller's precondition 1, passed on.
            return unsafe { disk.stream(vm, toward, dev, off, bytes) };
        }
        let mut at = dev;
        for (host, n) in self.spans(off, bytes) {
            // SAFETY: the caller's preconditions: `at .. at + n` lies in the mapped device range,
            // `host .. host + n` in the copy's host memory (precondition 2), which nothing else
            // uses and which lives until the copies are waited for.
            unsafe {
                match toward {
                    Toward::Copy => vm.copy_out(at, host, n),
                    Toward::Device => vm.copy_in(at, host, n),
                }
            }?;
            at += n;
        }
        Ok(())
    }

    /// Ends a transition's copies: a disk copy syncs the files it wrote (`wrote`) and gives
    /// its staging ranges back; nothing for host memory.
    ///
    /// # Errors
    /// A disk copy's sync or copy errors.
    pub fn finish(&self, wrote: bool) -> Result<()> {
        match self {
            HostCopy::OnDisk(disk) => disk.finish(wrote),
            _ => Ok(()),
        }
    }

    /// Checks, before a wake maps anything, that the bytes are still there (a disk copy's
    /// files, each of its length).
    ///
    /// # Errors
    /// A logic error naming a missing or shortened file.
    pub fn check(&self) -> Result<()> {
        match self {
            HostCopy::OnDisk(disk) => disk.check(),
            _ => Ok(()),
        }
    }

    /// Whether it can hold a later sleep's `bytes` in pages of `spec` (a copy kept with its
    /// pool, taken again by the next sleep).
    pub fn serves(&self, spec: Option<PageSpec>, bytes: usize) -> bool {
        match (self, spec) {
            (HostCopy::Supplied(r), Some(spec)) => {
                self.len() >= bytes
                    && r.iter()
                        .all(|p| p.is_pinned() == (spec.kind == PageKind::Pinned))
            }
            _ => false,
        }
    }

    /// Copies the copy's bytes `off .. off + out.len()` into `out`; false where they are not
    /// in host memory (nothing, or files) or pass its end.
    pub fn read(&self, off: usize, out: &mut [u8]) -> bool {
        let fits = off
            .checked_add(out.len())
            .is_some_and(|end| end <= self.len());
        if !fits || !matches!(self, HostCopy::Supplied(_)) {
            return false;
        }
        let mut at = 0;
        for (addr, n) in self.spans(off, out.len()) {
            // SAFETY: `addr .. addr + n` lies inside a range of the supply this copy holds (its
            // spans of bytes inside its length), host memory that lives as long as `self`; the
            // only writes into it are `copy_out`'s, whose callers keep every other use away
            // until their copies are waited for.
            let src = unsafe { std::slice::from_raw_parts(addr as *const u8, n) };
            out[at..at + n].copy_from_slice(src);
            at += n;
        }
        true
    }

    /// Bytes it can hold.
    pub fn len(&self) -> usize {
        match self {
            HostCopy::Supplied(r) => r.iter().map(HostPages::len).sum(),
            HostCopy::Nothing(n) => *n,
            HostCopy::OnDisk(d) => d.len(),
        }
    }

    /// Bytes of it on disk (0 unless it is a disk copy).
    pub fn disk_bytes(&self) -> usize {
        match self {
            HostCopy::OnDisk(d) => d.len(),
            _ => 0,
        }
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of host memory it holds (0 for nothing and for files).
    pub fn host_bytes(&self) -> usize {
        match self {
            HostCopy::Supplied(r) => r.iter().map(HostPages::len).sum(),
            HostCopy::Nothing(_) | HostCopy::OnDisk(_) => 0,
        }
    }

    /// The ranges of the supply it spans (0 for nothing and for files).
    pub fn ranges(&self) -> usize {
        match self {
            HostCopy::Supplied(r) => r.len(),
            HostCopy::Nothing(_) | HostCopy::OnDisk(_) => 0,
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

/// Which way [`HostCopy::copy`] moves bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toward {
    /// From the pool's pages into the copy (a sleep).
    Copy,
    /// From the copy back to the pool's pages (a wake).
    Device,
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
