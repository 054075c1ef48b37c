//! [`HostVirtualMemory`]: host memory as a [`VirtualMemory`], so the expandable pool runs on
//! pinned host memory: one reserved range, pages committed and registered with CUDA when the
//! pool grows, unregistered and given back when it trims.
//!
//! Each maximal run of mapped pages is one registration (`cuMemHostRegister`): a map that
//! touches a run's end re-registers the joined run, an unmap inside a run re-registers what is
//! left on either side. So a buffer that spans two growths is still one pinned range, and a copy
//! from it runs at the link's speed. Without registration (`pinned: false`) it is pageable host
//! memory that works without a driver (what the CPU tests use).

use super::host_pages::mapped::{PretendDevice, SpillFigures};
use super::host_pages::registered::PageSpec;
use super::virtual_memory::{round_up, VirtualMemory};
use super::{CallProfile, MemoryKind};
use crate::cuda;
use crate::error::{Error, Result};
use crate::os::host_pages::{
    check_host_room, host_memory_info, sealed_memory_file, Commit, Reservation, HUGE_PAGE,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

/// The default page of host virtual memory: the unit of growth and trim.
pub const HOST_PAGE_SIZE: usize = 32 << 20;

/// Host memory mapped into one reserved range in pages; pinned when made with `pinned`.
#[derive(Debug)]
pub struct HostVirtualMemory {
    reservation: Reservation,
    page_size: usize,
    pinned: bool,
    numa_node: Option<u32>,
    /// The device whose context registers the pages (when pinned).
    device: usize,
    /// Maximal runs of mapped pages: start address -> bytes.
    runs: Mutex<BTreeMap<usize, usize>>,
    /// A pretend device (CPU tests of spilling and promotion), taken after `runs`.
    pretend: Option<Mutex<PretendDevice>>,
    /// When shareable: each mapped page is a memory file of its own, mapped shared at its
    /// address (page address -> the file), taken after `runs`.
    files: Option<Mutex<BTreeMap<usize, OwnedFd>>>,
}

impl HostVirtualMemory {
    /// Reserves `reserve_size` bytes (rounded up to pages) of host addresses, mapped in pages of
    /// `page_size` bytes (default [`HOST_PAGE_SIZE`], rounded up to huge pages); `pinned`:
    /// registered with CUDA (needs a driver), pages placed on `numa_node` where given.
    ///
    /// # Errors
    /// No driver (when `pinned`); [`Error::InvalidArgument`] for sizes that overflow;
    /// [`Error::OutOfMemory`] when the address space runs out.
    pub fn new(
        reserve_size: usize,
        page_size: Option<usize>,
        pinned: bool,
        numa_node: Option<u32>,
    ) -> Result<Self> {
        let device = if pinned { cuda::current_device()? } else { 0 };
        let page_size = round_up(page_size.unwrap_or(HOST_PAGE_SIZE).max(1), HUGE_PAGE)?;
        let reserved = round_up(reserve_size.max(1), page_size)?;
        Ok(HostVirtualMemory {
            reservation: Reservation::new(reserved)?,
            page_size,
            pinned,
            numa_node,
            device,
            runs: Mutex::new(BTreeMap::new()),
            pretend: None,
            files: None,
        })
    }

    /// The same memory, each page a memory file of its own (`memfd_create`, sealed at the
    /// page's size) mapped shared at its address, so other processes can map the pool's pages
    /// ([`VirtualMemory::export_page`]): the CPU stand-in for a device's shareable pages.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for pinned memory (its registration is of the process's own
    /// pages) or a pretend device that spills (a promotion gives pages to the OS and makes
    /// them again, under the importers' feet); or for memory with pages mapped already.
    pub fn shareable(mut self) -> Result<Self> {
        let spills = self
            .pretend
            .as_ref()
            .is_some_and(|p| p.lock().figures().limit > 0);
        let why = match () {
            _ if self.pinned => Some("pinned host memory is registered as this process's pages"),
            _ if spills => Some(
                "a pool that spills to host pages cannot share its memory: a promotion remaps \
                 pages that importers map; leave spill_to_host unset",
            ),
            _ if self.mapped_bytes() > 0 => Some("pages are mapped already"),
            _ => None,
        };
        if let Some(why) = why {
            return Err(Error::invalid("shareable", why));
        }
        self.files = Some(Mutex::new(BTreeMap::new()));
        Ok(self)
    }

    /// Makes a memory file for each page of `offset .. offset + bytes` (whole pages of the
    /// reservation, none mapped) and maps it there; all or nothing.
    fn map_files(
        &self,
        files: &Mutex<BTreeMap<usize, OwnedFd>>,
        offset: usize,
        bytes: usize,
    ) -> Result<()> {
        check_host_room(bytes, false)?;
        let mut files = files.lock();
        let mut done = 0;
        let mut failed = None;
        while done < bytes {
            let at = offset + done;
            let made = sealed_memory_file(self.page_size as u64).and_then(|fd| {
                // SAFETY: a page of this reservation that is not mapped (the caller checked
                // the runs), so nothing uses what lies there; the file is sealed at the page's
                // size.
                unsafe {
                    self.reservation
                        .map_file(at, self.page_size, fd.as_fd(), true)
                }?;
                Ok(fd)
            });
            match made {
                Ok(fd) => {
                    files.insert(self.reservation.base() + at, fd);
                    done += self.page_size;
                }
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            drop(files);
            // SAFETY: the pages mapped by this call a moment ago; nothing has used them.
            let _ = unsafe { self.unmap_files(offset, done) };
            return Err(e);
        }
        Ok(())
    }

    /// Puts reserved addresses back over the pages of `offset .. offset + bytes` and lets go
    /// of their files (the memory goes once no other process maps it).
    ///
    /// # Safety
    /// 1. Nothing in this process uses the range until it is mapped again.
    unsafe fn unmap_files(&self, offset: usize, bytes: usize) -> Result<()> {
        let Some(files) = &self.files else {
            return Ok(());
        };
        let mut files = files.lock();
        let mut at = offset;
        while at < offset + bytes {
            // SAFETY: the caller's precondition 1.
            unsafe { self.reservation.unmap_file(at, self.page_size) }?;
            files.remove(&(self.reservation.base() + at));
            at += self.page_size;
        }
        Ok(())
    }

    /// Plain host memory that pretends to be a device of `capacity` bytes which spills at most
    /// `spill_limit` bytes to host pages: what the CPU tests of spilling and promotion map
    /// into (real bytes; a promotion gives each page to the OS and copies its bytes into a
    /// fresh one). Its `memory_info` is the pretend device's.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn pretend_device(
        reserve_size: usize,
        page_size: Option<usize>,
        capacity: usize,
        spill_limit: usize,
    ) -> Result<Self> {
        let mut vm = Self::new(reserve_size, page_size, false, None)?;
        let pretend = PretendDevice::new(
            capacity / vm.page_size * vm.page_size,
            spill_limit,
            vm.page_size,
        );
        vm.pretend = Some(Mutex::new(pretend));
        Ok(vm)
    }

    /// Pinned host memory for device `device`: registered in its context, pages on the host
    /// NUMA node the driver reports closest to it.
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn pinned(device: usize, reserve_size: usize, page_size: Option<usize>) -> Result<Self> {
        let _ctx = cuda::ContextGuard::new(device)?;
        Self::new(reserve_size, page_size, true, cuda::host_numa_node(device))
    }

    /// Whether the mapped pages are registered with CUDA.
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// The NUMA node pages are placed on, where one was given.
    pub fn numa_node(&self) -> Option<u32> {
        self.numa_node
    }

    /// The registered runs (start, bytes), lowest first: one per maximal run of mapped pages.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        self.runs.lock().iter().map(|(&a, &b)| (a, b)).collect()
    }

    fn offset_of(&self, addr: usize, bytes: usize) -> Result<usize> {
        let offset = addr.checked_sub(self.reservation.base());
        match (offset, offset.and_then(|o| o.checked_add(bytes))) {
            (Some(offset), Some(end))
                if end <= self.reservation.len()
                    && offset % self.page_size == 0
                    && bytes % self.page_size == 0
                    && bytes > 0 =>
            {
                Ok(offset)
            }
            _ => Err(Error::invalid(
                "range",
                format!(
                    "{bytes} bytes at {addr:#x} are not whole pages of {} inside the reservation",
                    self.page_size
                ),
            )),
        }
    }

    fn register(&self, addr: usize, bytes: usize) -> Result<()> {
        if self.pinned {
            let _ctx = cuda::ContextGuard::new(self.device)?;
            // SAFETY: committed pages of this reservation, unregistered before they are
            // decommitted or the reservation is dropped.
            unsafe { cuda::mem_host_register(addr, bytes) }
        } else {
            Ok(())
        }
    }

    fn unregister(&self, addr: usize) {
        if self.pinned {
            let _ctx = cuda::ContextGuard::new(self.device);
            // SAFETY: `addr` starts a run registered by `register`; callers unregister a run
            // only when nothing uses the pages they take away (the unmap's precondition), and
            // re-register the pages that stay before any use of them.
            let _ = unsafe { cuda::mem_host_unregister(addr) };
        }
    }
}

impl HostVirtualMemory {
    /// Gives the pages of `offset .. offset + bytes` back: their memory files, or the
    /// reservation's anonymous pages.
    ///
    /// # Safety
    /// 1. Nothing uses the range until it is mapped again; a registration was undone first.
    unsafe fn decommit(&self, offset: usize, bytes: usize) -> Result<()> {
        match self.files {
            // SAFETY: the caller's precondition 1.
            Some(_) => unsafe { self.unmap_files(offset, bytes) },
            // SAFETY: the caller's precondition 1.
            None => unsafe { self.reservation.decommit(offset, bytes) },
        }
    }
}

impl VirtualMemory for HostVirtualMemory {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn base(&self) -> usize {
        self.reservation.base()
    }

    fn reserved_bytes(&self) -> usize {
        self.reservation.len()
    }

    fn mapped_bytes(&self) -> usize {
        self.runs.lock().values().sum()
    }

    fn map(&self, addr: usize, bytes: usize) -> Result<()> {
        let offset = self.offset_of(addr, bytes)?;
        let end = addr + bytes;
        let mut runs = self.runs.lock();
        let left = runs.range(..end).next_back().map(|(&a, &b)| (a, b));
        if left.is_some_and(|(a, b)| a + b > addr) {
            return Err(Error::Logic(format!(
                "map of {bytes} bytes at {addr:#x}: part of it is mapped already"
            )));
        }
        let how = Commit {
            numa_node: self.numa_node,
            populate: self.pinned,
        };
        if let Some(pretend) = &self.pretend {
            let mut pretend = pretend.lock();
            pretend.place(addr, bytes)?;
            pretend.keep_ahead();
        }
        let committed = match &self.files {
            Some(files) => self.map_files(files, offset, bytes),
            None => self.reservation.commit(offset, bytes, how),
        };
        if let Err(e) = committed {
            if let Some(pretend) = &self.pretend {
                pretend.lock().unplace(addr, bytes);
            }
            return Err(e);
        }
        let left = left.filter(|&(a, b)| a + b == addr);
        let right = runs.get(&end).map(|&b| (end, b));
        let start = left.map_or(addr, |(a, _)| a);
        let joined = bytes + left.map_or(0, |(_, b)| b) + right.map_or(0, |(_, b)| b);
        for &(a, _) in left.iter().chain(right.iter()) {
            self.unregister(a);
        }
        if let Err(e) = self.register(start, joined) {
            // Back to how it was: the neighbours registered again, the new pages given back.
            for &(a, b) in left.iter().chain(right.iter()) {
                let _ = self.register(a, b);
            }
            // SAFETY: the pages were committed by this call and nothing has used them.
            let _ = unsafe { self.decommit(offset, bytes) };
            if let Some(pretend) = &self.pretend {
                pretend.lock().unplace(addr, bytes);
            }
            return Err(e);
        }
        if let Some((a, _)) = left {
            runs.remove(&a);
        }
        if let Some((a, _)) = right {
            runs.remove(&a);
        }
        runs.insert(start, joined);
        Ok(())
    }

    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()> {
        let offset = self.offset_of(addr, bytes)?;
        let end = addr + bytes;
        let mut runs = self.runs.lock();
        let (start, len) = runs
            .range(..=addr)
            .next_back()
            .map(|(&a, &b)| (a, b))
            .filter(|&(a, b)| a + b >= end)
            .ok_or_else(|| {
                Error::Logic(format!(
                    "unmap of {bytes} bytes at {addr:#x}: not all of it is mapped"
                ))
            })?;
        self.unregister(start);
        runs.remove(&start);
        let pieces = [(start, addr - start), (end, start + len - end)];
        for (a, b) in pieces {
            if b > 0 {
                // Pages that stay keep their registration (a failure leaves them pageable:
                // still correct memory, copied at pageable speed).
                let _ = self.register(a, b);
                runs.insert(a, b);
            }
        }
        if let Some(pretend) = &self.pretend {
            pretend.lock().unplace(addr, bytes);
        }
        // SAFETY: unregistered above; nothing uses the range (the caller's precondition 1).
        unsafe { self.decommit(offset, bytes) }
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        match &self.pretend {
            Some(pretend) => Some(pretend.lock().memory_info()),
            None => host_memory_info(),
        }
    }

    fn spill_figures(&self) -> Option<SpillFigures> {
        self.pretend.as_ref().map(|p| p.lock().figures())
    }

    fn spilled_runs(&self) -> Vec<(usize, usize)> {
        self.pretend
            .as_ref()
            .map_or_else(Vec::new, |p| p.lock().runs())
    }

    /// Each page: the host's room for the new page checked first (a refusal moves nothing
    /// more: the page keeps its bytes where they are), its bytes copied aside, the page given to
    /// the OS and made again at its first touch, the bytes copied back. Refused for lack of
    /// room before any page moved: out of memory, nothing touched.
    unsafe fn promote(&self, addr: usize, bytes: usize) -> Result<usize> {
        let Some(pretend) = &self.pretend else {
            return Ok(0);
        };
        self.offset_of(addr, bytes)?;
        let _runs = self.runs.lock();
        let mut pretend = pretend.lock();
        let mut aside = vec![0u8; self.page_size];
        let mut moved = 0;
        for page in pretend.promotable(addr, bytes) {
            if let Err(e) = check_host_room(self.page_size, false) {
                if moved == 0 {
                    return Err(Error::out_of_memory(
                        self.page_size,
                        format!("pretend device: promotion refused, nothing was moved ({e})"),
                    ));
                }
                break;
            }
            let offset = page - self.reservation.base();
            // SAFETY: a mapped page (spilled pages are mapped) nothing uses (the caller's
            // precondition 1); `aside` is ours; `renew` keeps the page accessible.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    page as *const u8,
                    aside.as_mut_ptr(),
                    self.page_size,
                );
                self.reservation.renew(offset, self.page_size)?;
                std::ptr::copy_nonoverlapping(aside.as_ptr(), page as *mut u8, self.page_size);
            }
            pretend.promoted(page);
            moved += self.page_size;
        }
        Ok(moved)
    }

    fn lend_unmapped(&self, on: bool) -> bool {
        match &self.pretend {
            Some(pretend) => {
                pretend.lock().lend(on);
                true
            }
            None => false,
        }
    }

    fn give_back_spill(&self, keep: usize) -> usize {
        self.pretend
            .as_ref()
            .map_or(0, |p| p.lock().give_back(keep))
    }

    fn shareable(&self) -> bool {
        self.files.is_some()
    }

    /// A new descriptor of the page's memory file.
    fn export_page(&self, addr: usize) -> Result<OwnedFd> {
        let files = self.files.as_ref().ok_or_else(|| {
            Error::Logic("host virtual memory not made shareable: no page can be exported".into())
        })?;
        let files = files.lock();
        let fd = files
            .get(&addr)
            .ok_or_else(|| Error::Logic(format!("no shareable page is mapped at {addr:#x}")))?;
        fd.try_clone()
            .map_err(|e| Error::Logic(format!("dup of a page's memory file: {e}")))
    }

    fn kind(&self) -> MemoryKind {
        if self.pinned {
            MemoryKind::PinnedHost
        } else {
            MemoryKind::Host
        }
    }

    fn call_profile(&self) -> CallProfile {
        // Page faults of many pages, registration: calls that block.
        CallProfile::BLOCKING
    }

    /// Plain host pages: the copies are `memcpy`s.
    fn host_pages(&self) -> Result<Option<PageSpec>> {
        Ok(Some(PageSpec::plain()))
    }

    unsafe fn copy_out(&self, addr: usize, dst: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's preconditions: `addr..` is mapped (committed) memory nothing
        // writes, `dst..` host memory valid for writes; distinct ranges (dst is not mapped here).
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn copy_in(&self, addr: usize, src: usize, bytes: usize) -> Result<()> {
        // SAFETY: as `copy_out`, the other way.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, addr as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn fill_zero(&self, addr: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's precondition: mapped memory nothing uses.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0, bytes) };
        Ok(())
    }
}

impl Drop for HostVirtualMemory {
    fn drop(&mut self) {
        let starts: Vec<usize> = self.runs.get_mut().keys().copied().collect();
        for start in starts {
            self.unregister(start);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = HUGE_PAGE;

    #[test]
    fn runs_join_on_map_and_split_on_unmap() {
        let vm = HostVirtualMemory::new(8 * PAGE, Some(PAGE), false, None).unwrap();
        let b = vm.base();
        vm.map(b + 2 * PAGE, PAGE).unwrap();
        vm.map(b, PAGE).unwrap();
        assert_eq!(vm.runs(), vec![(b, PAGE), (b + 2 * PAGE, PAGE)]);
        vm.map(b + PAGE, PAGE).unwrap();
        assert_eq!(vm.runs(), vec![(b, 3 * PAGE)]);
        assert_eq!(vm.mapped_bytes(), 3 * PAGE);
        // SAFETY: host memory nothing uses.
        unsafe {
            std::ptr::write_bytes((b + 2 * PAGE) as *mut u8, 9, PAGE);
            vm.unmap(b + PAGE, PAGE).unwrap();
        }
        assert_eq!(vm.runs(), vec![(b, PAGE), (b + 2 * PAGE, PAGE)]);
        // SAFETY: still mapped: its bytes survived the unmap beside it.
        assert_eq!(unsafe { *((b + 3 * PAGE - 1) as *const u8) }, 9);
        assert!(vm.map(b + 2 * PAGE, PAGE).is_err(), "mapped twice");
        // SAFETY: host memory nothing uses (and the call is refused).
        let twice = unsafe { vm.unmap(b + PAGE, PAGE) };
        assert!(twice.is_err(), "unmapped twice");
        assert!(vm.map(b + 8 * PAGE, PAGE).is_err(), "outside");
        assert!(vm.map(b + 1, PAGE).is_err(), "not a page");
        assert_eq!(vm.kind(), MemoryKind::Host);
    }
}
