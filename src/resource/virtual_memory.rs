//! [`VirtualMemory`]: one reserved address range whose pages are backed by physical memory on
//! request, on a CUDA device ([`CudaVirtualMemory`]) or pretend
//! ([`SimulatedVirtualMemory`](super::SimulatedVirtualMemory)).

use super::host_pages::mapped::{HostPageKeep, SpillFigures};
use super::host_pages::registered::{HostPageSupply, PageSpec};
use super::{CallProfile, CopyFence, MemoryKind};
use crate::cuda::vmm::{HostPageSource, VirtualRange};
use crate::cuda::{mem_get_info, ContextGuard};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;

/// One reserved address range mapped and unmapped in whole pages; what the expandable resource
/// grows into. Thread-safe (implementations lock internally).
pub trait VirtualMemory: Send + Sync + std::fmt::Debug {
    /// Bytes of one page: the unit of [`map`](VirtualMemory::map) and
    /// [`unmap`](VirtualMemory::unmap).
    fn page_size(&self) -> usize;

    /// The first reserved address (a multiple of the page size).
    fn base(&self) -> usize;

    /// Reserved bytes (a multiple of the page size).
    fn reserved_bytes(&self) -> usize;

    /// Bytes currently mapped.
    fn mapped_bytes(&self) -> usize;

    /// Backs `addr .. addr + bytes` (whole pages inside the reservation, none mapped) with
    /// physical memory; all or nothing.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`] when physical memory runs out (nothing of the call stays mapped);
    /// [`Error::Logic`] or [`Error::InvalidArgument`] for a range that is not unmapped whole pages
    /// of the reservation; CUDA errors.
    fn map(&self, addr: usize, bytes: usize) -> Result<()>;

    /// Gives the physical memory of `addr .. addr + bytes` (whole mapped pages) back.
    ///
    /// # Safety
    /// 1. No work queued or running uses the range, and none will before it is mapped again.
    ///
    /// # Errors
    /// [`Error::Logic`] or [`Error::InvalidArgument`] for a range that is not mapped whole pages
    /// (nothing is unmapped then); CUDA errors.
    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()>;

    /// Free and total physical bytes of the memory behind the range, where known.
    fn memory_info(&self) -> Option<(usize, usize)>;

    /// The kind of memory mapped.
    fn kind(&self) -> MemoryKind;

    /// The device ordinal, where there is one (the default: none, as for host or simulated
    /// memory).
    fn device(&self) -> Option<usize> {
        None
    }

    /// What [`map`](VirtualMemory::map) and [`unmap`](VirtualMemory::unmap) may do (see
    /// [`MemoryResource::call_profile`](super::MemoryResource::call_profile)); the default, for
    /// implementations that do not say, is the safe [`CallProfile::UNKNOWN`].
    fn call_profile(&self) -> CallProfile {
        CallProfile::UNKNOWN
    }

    /// The host pages that hold this memory's pages while a pool sleeps: pinned for a device
    /// (copies run at the link's speed), plain for host memory; `None` where the pages have no
    /// bytes to keep (simulated memory). The default refuses: memory that cannot be copied
    /// cannot sleep.
    ///
    /// # Errors
    /// [`Error::Logic`] where the memory cannot be copied.
    fn host_pages(&self) -> Result<Option<PageSpec>> {
        Err(Error::Logic(format!(
            "{:?} virtual memory cannot copy its pages to the host",
            self.kind()
        )))
    }

    /// The supply the sleep takes its host pages from (the process's: [`host_pages::registered::supply`]).
    ///
    /// [`host_pages::registered::supply`]: super::host_pages::registered::supply
    fn host_supply(&self) -> &'static HostPageSupply {
        super::host_pages::registered::supply()
    }

    /// Copies `bytes` from `addr` (mapped pages of this range) to host memory at `dst`; the copy
    /// may still run when this returns, until [`wait_copies`](VirtualMemory::wait_copies) (copies
    /// run in the order they were asked).
    ///
    /// # Safety
    /// 1. `addr .. addr + bytes` is mapped and no work writes it until `wait_copies` returns.
    /// 2. `dst .. dst + bytes` is host memory valid for writes that nothing else uses until
    ///    `wait_copies` returns.
    ///
    /// # Errors
    /// CUDA errors; the default refuses (see [`host_pages`](VirtualMemory::host_pages)).
    unsafe fn copy_out(&self, addr: usize, dst: usize, bytes: usize) -> Result<()> {
        let _ = (addr, dst, bytes);
        self.host_pages().map(drop)
    }

    /// Copies `bytes` from host memory at `src` to `addr` (mapped pages of this range); as
    /// [`copy_out`](VirtualMemory::copy_out), it may run until `wait_copies`.
    ///
    /// # Safety
    /// 1. `addr .. addr + bytes` is mapped and no work uses it until `wait_copies` returns.
    /// 2. `src .. src + bytes` is host memory valid for reads that nothing writes until
    ///    `wait_copies` returns.
    ///
    /// # Errors
    /// As [`copy_out`](VirtualMemory::copy_out).
    unsafe fn copy_in(&self, addr: usize, src: usize, bytes: usize) -> Result<()> {
        let _ = (addr, src, bytes);
        self.host_pages().map(drop)
    }

    /// Writes zeros to `addr .. addr + bytes` (mapped pages of this range); as
    /// [`copy_out`](VirtualMemory::copy_out), it may run until `wait_copies`.
    ///
    /// # Safety
    /// 1. `addr .. addr + bytes` is mapped and no work uses it until `wait_copies` returns.
    ///
    /// # Errors
    /// As [`copy_out`](VirtualMemory::copy_out).
    unsafe fn fill_zero(&self, addr: usize, bytes: usize) -> Result<()> {
        let _ = (addr, bytes);
        self.host_pages().map(drop)
    }

    /// The most bytes a restore maps in one call, so that the copies into mapped chunks run
    /// while the next chunk is mapped (default: whole runs in one call).
    fn map_chunk_bytes(&self) -> usize {
        usize::MAX
    }

    /// Waits for every copy and fill asked so far (the default: they ran when asked).
    ///
    /// # Errors
    /// CUDA errors of the copies.
    fn wait_copies(&self) -> Result<()> {
        Ok(())
    }

    /// A fence after the copies asked so far, to wait for them alone while later ones run (the
    /// default: nothing to wait for).
    ///
    /// # Errors
    /// CUDA errors.
    fn copy_fence(&self) -> Result<CopyFence> {
        Ok(CopyFence::done())
    }

    /// The figures of the host pages this memory spills to when its device is full, where it
    /// spills (the default: it never does).
    fn spill_figures(&self) -> Option<SpillFigures> {
        None
    }

    /// The runs of mapped pages that lie on the host, spilled: (address, bytes), lowest first
    /// (the default: none).
    fn spilled_runs(&self) -> Vec<(usize, usize)> {
        Vec::new()
    }

    /// Moves the spilled pages of `addr .. addr + bytes` (whole pages of the reservation) to
    /// device memory at the same addresses, their bytes kept, as far as the device has room;
    /// the host pages are kept for the next spill. Returns the bytes moved (the default:
    /// nothing spills, nothing moves).
    ///
    /// # Safety
    /// 1. No work queued or running uses the range until this returns (its pages are
    ///    remapped).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a range that is not whole pages; CUDA errors (the pages
    /// moved before stay moved, the others keep their host pages and bytes).
    unsafe fn promote(&self, addr: usize, bytes: usize) -> Result<usize> {
        let _ = (addr, bytes);
        Ok(0)
    }

    /// While `on`, the device pages [`unmap`](Self::unmap) takes off are lent to the next
    /// [`promote`](Self::promote), which copies spilled bytes into them where they lie and maps
    /// them in place of the host pages (no device memory made for the move); turned off, the
    /// pages no promotion took are released. Returns whether this memory lends (the default:
    /// it does not; its unmaps release as always).
    fn lend_unmapped(&self, on: bool) -> bool {
        let _ = on;
        false
    }

    /// Makes host pages for a spill of `bytes` ahead of need, on `threads` threads, and keeps
    /// them; returns the bytes made (the default: nothing spills, nothing is made).
    ///
    /// # Errors
    /// Out of memory when the host has no room; CUDA errors.
    fn prepare_spill(&self, bytes: usize, threads: usize) -> Result<usize> {
        let _ = (bytes, threads);
        Ok(0)
    }

    /// Gives kept spill pages back to the OS until at most `keep` bytes stay kept; returns the
    /// bytes given back (the default: none kept).
    fn give_back_spill(&self, keep: usize) -> usize {
        let _ = keep;
        0
    }

    /// Whether each page is made so that other processes can map it ([`export_page`]: the
    /// driver's shareable handle, a memory file on the host); the default: it is not.
    ///
    /// [`export_page`]: VirtualMemory::export_page
    fn shareable(&self) -> bool {
        false
    }

    /// A descriptor of the physical memory of the mapped page at `addr`, for another process
    /// to map (a new descriptor at each call; the memory stays while any process maps it or
    /// holds a descriptor of it).
    ///
    /// # Errors
    /// [`Error::Logic`] for memory that is not [`shareable`](VirtualMemory::shareable) (the
    /// default) or a page that is not mapped; the driver's error of the export.
    fn export_page(&self, addr: usize) -> Result<std::os::fd::OwnedFd> {
        Err(Error::Logic(format!(
            "{:?} virtual memory was not made shareable: the page at {addr:#x} cannot be exported",
            self.kind()
        )))
    }
}

/// Virtual memory of a CUDA device: one `cuMemAddressReserve` range, one `cuMemCreate` handle
/// per mapped page.
#[derive(Debug)]
pub struct CudaVirtualMemory {
    ordinal: usize,
    base: usize,
    reserved: usize,
    page_size: usize,
    range: Mutex<VirtualRange>,
    /// The host pages it spills to when the device is full (none: it never spills).
    spill: Option<Arc<HostPageKeep>>,
    /// Whether its pages are made with the driver's shareable handle type.
    shareable: bool,
}

impl CudaVirtualMemory {
    /// Reserves `reserve_size` bytes (rounded up to pages) of addresses on device `ordinal`, to
    /// be mapped in pages of `page_size` bytes (default: the device's allocation granularity;
    /// rounded up to a multiple of it).
    ///
    /// # Errors
    /// No driver, a bad ordinal, a device without virtual memory management, or the CUDA error
    /// of the reservation.
    pub fn new(ordinal: usize, reserve_size: usize, page_size: Option<usize>) -> Result<Self> {
        let _ctx = ContextGuard::new(ordinal)?;
        let granularity = crate::cuda::vmm::allocation_granularity(ordinal)?;
        let page_size = round_up(page_size.unwrap_or(granularity).max(1), granularity)?;
        let reserved = round_up(reserve_size.max(1), page_size)?;
        let range = VirtualRange::new(ordinal, reserved, page_size)?;
        Ok(CudaVirtualMemory {
            ordinal,
            base: range.base(),
            reserved,
            page_size,
            range: Mutex::new(range),
            spill: None,
            shareable: false,
        })
    }

    /// The same memory, each page made with the driver's shareable handle type (a POSIX file
    /// descriptor: [`VirtualMemory::export_page`]), so other processes can map the pool's
    /// pages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for memory that spills to the host
    /// ([`with_host_spill`](Self::with_host_spill)): spilled pages are host memory the driver
    /// does not export, and a promotion remaps pages under the importers' feet; or for memory
    /// with pages mapped already.
    pub fn shareable(mut self) -> Result<Self> {
        if self.spill.is_some() {
            return Err(Error::invalid(
                "shareable",
                "a pool that spills to host pages cannot share its memory: its spilled pages \
                 are host memory the driver does not export, and a promotion would remap pages \
                 that importers map; leave spill_to_host unset",
            ));
        }
        let mut range = self.range.lock();
        if range.mapped_bytes() > 0 {
            return Err(Error::invalid(
                "shareable",
                "pages are mapped already: make the memory shareable before the pool maps any",
            ));
        }
        range.set_shareable();
        drop(range);
        self.shareable = true;
        Ok(self)
    }

    /// The same memory, spilling to host pages when the device is full: pages the device
    /// cannot back are backed by pinned host memory on its host NUMA node, mapped under the
    /// same addresses and read in place over the link, at most `limit` bytes of them (mapped
    /// and kept for the next spill); [`promote`](VirtualMemory::promote) moves them back.
    pub fn with_host_spill(mut self, limit: usize) -> Self {
        self.spill = Some(Arc::new(HostPageKeep::new(
            self.ordinal,
            self.page_size,
            limit,
        )));
        self
    }
}

/// Rounds `bytes` up to a multiple of `unit` (not necessarily a power of two).
pub(crate) fn round_up(bytes: usize, unit: usize) -> Result<usize> {
    bytes
        .div_ceil(unit)
        .checked_mul(unit)
        .ok_or_else(|| Error::invalid("size", format!("{bytes} rounded to {unit} overflows")))
}

impl VirtualMemory for CudaVirtualMemory {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn base(&self) -> usize {
        self.base
    }

    fn reserved_bytes(&self) -> usize {
        self.reserved
    }

    fn mapped_bytes(&self) -> usize {
        self.range.lock().mapped_bytes()
    }

    fn map(&self, addr: usize, bytes: usize) -> Result<()> {
        let offset = addr
            .checked_sub(self.base)
            .ok_or_else(|| Error::invalid("addr", format!("{addr:#x} is below the reservation")))?;
        // Out of memory relieves the device's caches (and asks the processes sharing it) and
        // tries again, as the device's other sources do.
        let on_device = crate::pressure::retry_after_relief(
            crate::pressure::Place::Device(self.ordinal),
            bytes,
            || {
                let _ctx = ContextGuard::new(self.ordinal)?;
                // The whole range is what is missing (the error names the page that failed).
                self.range
                    .lock()
                    .map(offset, bytes, None)
                    .map(drop)
                    .map_err(|e| match e {
                        Error::OutOfMemory { message, .. } => Error::OutOfMemory {
                            requested: bytes,
                            message,
                        },
                        other => other,
                    })
            },
        );
        let mapped = match (&self.spill, on_device) {
            // The device is full even after relief: the pages it lacks go to the host.
            (Some(host), Err(e)) if e.is_out_of_memory() => {
                let _ctx = ContextGuard::new(self.ordinal)?;
                self.range
                    .lock()
                    .map(offset, bytes, Some(host.as_ref()))
                    .map(drop)
                    .map_err(|spilled| match spilled {
                        Error::OutOfMemory { message, .. } => Error::OutOfMemory {
                            requested: bytes,
                            message: format!("{e}; and {message}"),
                        },
                        other => other,
                    })
            }
            (_, done) => done,
        };
        // Past the mark, the host pages of the next spills are made in the background (a pool
        // that never spills asks the driver nothing more).
        if let Some(keep) = &self.spill {
            if let Some((free, total)) = self.memory_info() {
                let spilled = keep.figures().spilled;
                if let Some(window) =
                    crate::resource::host_pages::mapped::spill_window(free, total, spilled)
                {
                    keep.keep_ahead(window);
                }
            }
        }
        mapped
    }

    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()> {
        let offset = addr
            .checked_sub(self.base)
            .ok_or_else(|| Error::invalid("addr", format!("{addr:#x} is below the reservation")))?;
        let _ctx = ContextGuard::new(self.ordinal)?;
        let host = self.spill.as_deref().map(|h| h as &dyn HostPageSource);
        // SAFETY: the caller's precondition 1, passed on.
        unsafe { self.range.lock().unmap(offset, bytes, host) }
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        let _ctx = ContextGuard::new(self.ordinal).ok()?;
        mem_get_info().ok()
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    fn device(&self) -> Option<usize> {
        Some(self.ordinal)
    }

    fn call_profile(&self) -> CallProfile {
        // cuMemCreate/cuMemMap/cuMemUnmap/cuMemRelease: driver calls that may wait.
        CallProfile::BLOCKING
    }

    /// Pinned host pages on the device's host NUMA node.
    fn host_pages(&self) -> Result<Option<PageSpec>> {
        Ok(Some(PageSpec::pinned_for(self.ordinal)))
    }

    unsafe fn copy_out(&self, addr: usize, dst: usize, bytes: usize) -> Result<()> {
        let _ctx = ContextGuard::new(self.ordinal)?;
        // SAFETY: the caller's preconditions 1 and 2 (both ranges valid, nothing else uses them
        // until `wait_copies`, which synchronizes the stream).
        unsafe { crate::cuda::memcpy_async(dst, addr, bytes, crate::cuda::Stream::DEFAULT) }
    }

    unsafe fn copy_in(&self, addr: usize, src: usize, bytes: usize) -> Result<()> {
        let _ctx = ContextGuard::new(self.ordinal)?;
        // SAFETY: the caller's preconditions 1 and 2 (as `copy_out`).
        unsafe { crate::cuda::memcpy_async(addr, src, bytes, crate::cuda::Stream::DEFAULT) }
    }

    unsafe fn fill_zero(&self, addr: usize, bytes: usize) -> Result<()> {
        let _ctx = ContextGuard::new(self.ordinal)?;
        // SAFETY: the caller's precondition 1: mapped device memory nothing uses until
        // `wait_copies`.
        unsafe { crate::cuda::memset_async(addr, 0, bytes, crate::cuda::Stream::DEFAULT) }
    }

    /// 1 GiB (whole pages): a restore's copies run while the next GiB is mapped.
    fn map_chunk_bytes(&self) -> usize {
        (1usize << 30).max(self.page_size)
    }

    /// Synchronizes the (legacy default) stream the copies ran on.
    fn wait_copies(&self) -> Result<()> {
        let _ctx = ContextGuard::new(self.ordinal)?;
        crate::cuda::Stream::DEFAULT.synchronize()
    }

    /// An event recorded on the copies' stream.
    fn copy_fence(&self) -> Result<CopyFence> {
        let _ctx = ContextGuard::new(self.ordinal)?;
        let event = crate::cuda::Event::new()?;
        event.record(crate::cuda::Stream::DEFAULT)?;
        Ok(CopyFence::at(event))
    }

    fn spill_figures(&self) -> Option<SpillFigures> {
        self.spill.as_ref().map(|h| h.figures())
    }

    fn spilled_runs(&self) -> Vec<(usize, usize)> {
        match self.spill {
            Some(_) => self.range.lock().host_runs(),
            None => Vec::new(),
        }
    }

    /// A GiB of pages at a time: device memory at a second address, the copies, the remap.
    unsafe fn promote(&self, addr: usize, bytes: usize) -> Result<usize> {
        let Some(host) = &self.spill else {
            return Ok(0);
        };
        let offset = addr
            .checked_sub(self.base)
            .ok_or_else(|| Error::invalid("addr", format!("{addr:#x} is below the reservation")))?;
        let _ctx = ContextGuard::new(self.ordinal)?;
        host.stop_ahead();
        let batch = (self.map_chunk_bytes() / self.page_size).max(1);
        // SAFETY: the caller's precondition 1, passed on; the device's context is current.
        let (moved, times) = unsafe {
            self.range
                .lock()
                .promote(offset, bytes, host.as_ref(), batch)
        }?;
        host.count_promoted(moved, times);
        Ok(moved)
    }

    fn lend_unmapped(&self, on: bool) -> bool {
        let Some(host) = &self.spill else {
            return false;
        };
        if on {
            // A promotion follows: no host page is made beside it.
            host.stop_ahead();
        }
        let mut range = self.range.lock();
        if !on && range.lent_bytes() > 0 {
            // Releasing the pages no promotion took is an unmap: in the device's context.
            let _ctx = ContextGuard::new(self.ordinal);
            range.lend_unmapped(false);
        } else {
            range.lend_unmapped(on);
        }
        true
    }

    fn prepare_spill(&self, bytes: usize, threads: usize) -> Result<usize> {
        match &self.spill {
            Some(host) => host.make_ahead(bytes, threads),
            None => Ok(0),
        }
    }

    fn give_back_spill(&self, keep: usize) -> usize {
        self.spill.as_ref().map_or(0, |h| h.give_back(keep))
    }

    fn shareable(&self) -> bool {
        self.shareable
    }

    /// `cuMemExportToShareableHandle` of the page's physical memory.
    fn export_page(&self, addr: usize) -> Result<std::os::fd::OwnedFd> {
        let offset = addr
            .checked_sub(self.base)
            .ok_or_else(|| Error::invalid("addr", format!("{addr:#x} is below the reservation")))?;
        let _ctx = ContextGuard::new(self.ordinal)?;
        self.range.lock().export_page(offset)
    }
}
