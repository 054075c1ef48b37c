//! The CPU stand-in for the driver's shareable handle: a memory file (`memfd_create`), sealed
//! against shrinking and growing, mapped shared in the exporter and in each importer.
//!
//! A sealed size is what makes a peer's descriptor safe to map: a file that could shrink under a
//! mapping would make a read past its new end a `SIGBUS`. An exporter seals its files when it
//! makes them; an importer maps only a file sealed so, at least as long as the message says. A
//! segment that importers may only read is exported through a read-only descriptor (the same
//! file opened again for reading), so an importer cannot map it writable even if it tried.
//!
//! The `mmap`/`munmap` calls are the only `unsafe` here ([`HostMap`]).

use super::error::ShareError;
use super::message::SegmentKind;
use super::segment::ShareableSegment;
use crate::os::host_pages::Reservation;
use rustix::fs::{fcntl_get_seals, fstat, SealFlags};
use rustix::mm::{mmap, mprotect, munmap, MapFlags, MprotectFlags, ProtFlags};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared mapping of a whole file: unmapped when dropped (a map placed in a range gives
/// the range its addresses back).
#[derive(Debug)]
pub struct HostMap {
    base: usize,
    len: usize,
    /// Whether it is mapped writable now ([`HostMap::set_writable`] changes it).
    writable: AtomicBool,
    /// The range it was placed in, and where: kept alive while the map lies in it.
    placed: Option<(Arc<Reservation>, usize)>,
}

impl HostMap {
    /// Maps the first `len` bytes of `fd`, shared, readable and (`writable`) writable.
    ///
    /// # Errors
    /// The I/O error of `mmap` (`EACCES` for a writable map of a read-only descriptor).
    fn new(fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<HostMap, ShareError> {
        if len == 0 {
            return Err(ShareError::invalid("size", "a segment of no bytes"));
        }
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a new mapping at an address the kernel picks (null hint, no MAP_FIXED), so no
        // existing memory is replaced; `fd` is open for the call; the length is checked against
        // the file's sealed size by every caller, so no page of the map lies past the file.
        let ptr = unsafe { mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0) }
            .map_err(|e| ShareError::io("mmap", e))?;
        Ok(HostMap {
            base: ptr as usize,
            len,
            writable: AtomicBool::new(writable),
            placed: None,
        })
    }

    /// Maps the first `len` bytes of `fd`, shared, at `offset` of `range` (whole small pages
    /// the caller checked hold nothing else), readable and (`writable`) writable.
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for a range outside the reservation; the kernel's refusal.
    fn placed(
        fd: BorrowedFd<'_>,
        len: usize,
        writable: bool,
        range: &Arc<Reservation>,
        offset: usize,
    ) -> Result<HostMap, ShareError> {
        // SAFETY: the caller checked that nothing else lies at `offset .. offset + len` of the
        // range (an importer places each segment once, at distinct offsets), so nothing in use
        // is replaced; every caller checks the file's sealed size first (`check_sealed`).
        unsafe { range.map_file(offset, len, fd, writable) }?;
        Ok(HostMap {
            base: range.base() + offset,
            len,
            writable: AtomicBool::new(writable),
            placed: Some((range.clone(), offset)),
        })
    }

    /// Maps it read-only or (`writable`) read-write from now on: a write to a read-only map
    /// faults. Writable needs a descriptor open for writing, as the map's was.
    ///
    /// # Errors
    /// The I/O error of `mprotect` (`EACCES` making a map of a read-only descriptor writable).
    pub fn set_writable(&self, writable: bool) -> Result<(), ShareError> {
        let flags = if writable {
            MprotectFlags::READ | MprotectFlags::WRITE
        } else {
            MprotectFlags::READ
        };
        // SAFETY: `base .. base + len` is this live map, whole pages (mmap's); changing its
        // protection replaces no memory. A read-only map is written through no Rust reference
        // (the map hands out copies; `write` checks the flag first).
        unsafe { mprotect(self.base as *mut std::ffi::c_void, self.len, flags) }
            .map_err(|e| ShareError::io("mprotect", e))?;
        self.writable.store(writable, Ordering::Release);
        Ok(())
    }

    /// The first byte's address.
    pub fn base(&self) -> usize {
        self.base
    }

    /// The range `offset .. offset + len` when it lies within the map.
    fn range(&self, offset: u64, len: usize) -> Result<usize, ShareError> {
        let end = offset.checked_add(len as u64);
        match end {
            Some(end) if end <= self.len as u64 => Ok(self.base + offset as usize),
            _ => Err(ShareError::invalid(
                "range",
                format!(
                    "{len} bytes at {offset} pass the segment's {} bytes",
                    self.len
                ),
            )),
        }
    }

    /// A copy of `len` bytes at `offset`.
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for a range outside the map.
    pub fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, ShareError> {
        let at = self.range(offset, len)?;
        let mut out = vec![0u8; len];
        // SAFETY: `at .. at + len` lies in this live map (checked by `range`), readable; the
        // file's size is sealed, so every page is there. Another process may write the bytes
        // meanwhile: they are plain bytes (any value is valid), copied as they are.
        unsafe { std::ptr::copy_nonoverlapping(at as *const u8, out.as_mut_ptr(), len) };
        Ok(out)
    }

    /// Writes `bytes` at `offset`.
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for a range outside the map or a map that is read-only.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), ShareError> {
        if !self.writable.load(Ordering::Acquire) {
            return Err(ShareError::invalid("segment", "mapped read-only"));
        }
        let at = self.range(offset, bytes.len())?;
        // SAFETY: `at .. at + len` lies in this live map (checked by `range`), mapped writable
        // (checked above); the memory is shared bytes that no Rust reference in this process
        // covers (the map hands out copies only).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), at as *mut u8, bytes.len()) };
        Ok(())
    }
}

impl Drop for HostMap {
    fn drop(&mut self) {
        if let Some((range, offset)) = &self.placed {
            // SAFETY: the range's own pages, mapped by `placed`; the map lends no references
            // into it (copies only), and what the process built over its addresses (arrays
            // through `__array_interface__`) is its owner's to drop first.
            let _ = unsafe { range.unmap_file(*offset, self.len) };
            return;
        }
        // SAFETY: `base .. base + len` was mapped by `new` and is unmapped once; the map lends
        // no references into it (copies only), so nothing points there after.
        let _ = unsafe { munmap(self.base as *mut std::ffi::c_void, self.len) };
    }
}

/// Checks that `fd` is a memory file sealed against shrinking, of at least `size` bytes that
/// this process can map; the length to map.
fn check_sealed(fd: BorrowedFd<'_>, size: u64) -> Result<usize, ShareError> {
    let have = fcntl_get_seals(fd).map_err(|_| {
        ShareError::Protocol("the descriptor is not a memory file that can be sealed".into())
    })?;
    if !have.contains(SealFlags::SHRINK) {
        return Err(ShareError::Protocol(
            "the memory file can still shrink (a read past its end would crash this process)"
                .into(),
        ));
    }
    let stat = fstat(fd).map_err(|e| ShareError::io("fstat", e))?;
    let len = u64::try_from(stat.st_size).unwrap_or(0);
    if len < size {
        return Err(ShareError::Protocol(format!(
            "the memory file has {len} bytes, the message says {size}"
        )));
    }
    usize::try_from(size).map_err(|_| ShareError::invalid("size", "past the address space"))
}

/// The same file as `fd`, opened again for reading only: a descriptor that cannot be mapped
/// writable.
fn reopen_read_only(fd: BorrowedFd<'_>) -> Result<OwnedFd, ShareError> {
    let file = std::fs::File::open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| ShareError::io("reopening a memory file read-only (/proc/self/fd)", e))?;
    Ok(file.into())
}

/// A memory file shared between processes: one an exporter made, or one mapped from a
/// descriptor received (by an importer, or an exporter adopting it).
#[derive(Debug)]
pub struct MemfdSegment {
    /// The descriptor it is shared by (read-only when importers may not write it).
    fd: OwnedFd,
    map: HostMap,
    writable: bool,
}

impl MemfdSegment {
    /// A new memory file of `size` bytes (zeroed), sealed at that size and mapped writable
    /// here; importers may write it when `writable` (otherwise they receive a read-only
    /// descriptor).
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for no bytes; the I/O error of the calls.
    pub fn new(size: u64, writable: bool) -> Result<MemfdSegment, ShareError> {
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| ShareError::invalid("size", format!("{size} bytes")))?;
        let fd = crate::os::host_pages::sealed_memory_file(size)?;
        let map = HostMap::new(fd.as_fd(), len, true)?;
        let fd = if writable {
            fd
        } else {
            reopen_read_only(fd.as_fd())?
        };
        Ok(MemfdSegment { fd, map, writable })
    }

    /// Maps the memory file `fd` of `size` bytes that another process shared, writable when
    /// `writable`.
    ///
    /// # Errors
    /// [`ShareError::Protocol`] for a descriptor that is not a memory file sealed against
    /// shrinking of at least `size` bytes; the I/O error of `mmap` (a writable map of a
    /// read-only descriptor).
    pub fn from_descriptor(
        fd: OwnedFd,
        size: u64,
        writable: bool,
    ) -> Result<MemfdSegment, ShareError> {
        let len = check_sealed(fd.as_fd(), size)?;
        let map = HostMap::new(fd.as_fd(), len, writable)?;
        Ok(MemfdSegment { fd, map, writable })
    }

    /// As [`from_descriptor`](Self::from_descriptor), mapped at `offset` of `range` (an
    /// importer's range for an exporter's placed segments), where the caller checked that
    /// nothing else lies.
    ///
    /// # Errors
    /// As [`from_descriptor`](Self::from_descriptor); [`ShareError::Invalid`] for a place
    /// outside the range or not on whole pages.
    pub fn place(
        fd: OwnedFd,
        size: u64,
        writable: bool,
        range: &Arc<Reservation>,
        offset: usize,
    ) -> Result<MemfdSegment, ShareError> {
        let len = check_sealed(fd.as_fd(), size)?;
        let map = HostMap::placed(fd.as_fd(), len, writable, range, offset)?;
        Ok(MemfdSegment { fd, map, writable })
    }

    /// This process's map of it (to fill and read it).
    pub fn host_map(&self) -> &HostMap {
        &self.map
    }
}

impl ShareableSegment for MemfdSegment {
    fn kind(&self) -> SegmentKind {
        SegmentKind::Memfd
    }

    fn size(&self) -> u64 {
        self.map.len as u64
    }

    fn base(&self) -> usize {
        self.map.base
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn host(&self) -> Option<&HostMap> {
        Some(&self.map)
    }

    fn protect(&self) -> Result<bool, ShareError> {
        self.map.set_writable(false)?;
        Ok(true)
    }

    fn allow_writes(&self) -> Result<(), ShareError> {
        self.map.set_writable(true)
    }

    fn descriptor(&self) -> Result<BorrowedFd<'_>, ShareError> {
        Ok(self.fd.as_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::{ftruncate, memfd_create, MemfdFlags};

    fn dup(fd: BorrowedFd<'_>) -> OwnedFd {
        fd.try_clone_to_owned().unwrap()
    }

    #[test]
    fn an_importer_sees_the_exporters_bytes_and_they_its() {
        let seg = MemfdSegment::new(1 << 16, true).unwrap();
        seg.host_map().write(100, b"exported").unwrap();
        let imp =
            MemfdSegment::from_descriptor(dup(seg.descriptor().unwrap()), 1 << 16, true).unwrap();
        assert_ne!(imp.base(), seg.base(), "mapped once more, elsewhere");
        assert_eq!(imp.host_map().read(100, 8).unwrap(), b"exported");
        imp.host_map().write(0, b"back").unwrap();
        assert_eq!(seg.host_map().read(0, 4).unwrap(), b"back");
        assert!(seg.host_map().read(1 << 16, 1).is_err());
        assert!(seg.host_map().read(u64::MAX, 2).is_err());
    }

    #[test]
    fn placed_maps_lie_side_by_side_and_give_their_addresses_back() {
        const PAGE: usize = 2 << 20;
        let range = Arc::new(Reservation::new(4 * PAGE).unwrap());
        let a = MemfdSegment::new(PAGE as u64, true).unwrap();
        let b = MemfdSegment::new(PAGE as u64, true).unwrap();
        a.host_map().write(PAGE as u64 - 3, b"end").unwrap();
        b.host_map().write(0, b"start").unwrap();
        let pa = MemfdSegment::place(
            dup(a.descriptor().unwrap()),
            PAGE as u64,
            false,
            &range,
            PAGE,
        )
        .unwrap();
        let pb = MemfdSegment::place(
            dup(b.descriptor().unwrap()),
            PAGE as u64,
            false,
            &range,
            2 * PAGE,
        )
        .unwrap();
        assert_eq!(
            (pa.base(), pb.base()),
            (range.base() + PAGE, range.base() + 2 * PAGE)
        );
        // One read across the two: the pages lie one after the other.
        let mut across = [0u8; 8];
        // SAFETY: both pages are mapped readable, contiguous, and sealed at their size.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (pb.base() - 3) as *const u8,
                across.as_mut_ptr(),
                across.len(),
            );
        }
        assert_eq!(&across, b"endstart");
        assert!(pa.host_map().write(0, b"x").is_err(), "mapped read-only");
        drop(pa);
        // Its addresses are reserved again: a new map fits there.
        let again = MemfdSegment::place(
            dup(a.descriptor().unwrap()),
            PAGE as u64,
            true,
            &range,
            PAGE,
        )
        .unwrap();
        assert_eq!(again.host_map().read(PAGE as u64 - 3, 3).unwrap(), b"end");
        assert!(
            MemfdSegment::place(
                dup(a.descriptor().unwrap()),
                PAGE as u64,
                true,
                &range,
                4 * PAGE
            )
            .is_err(),
            "past the range"
        );
    }

    #[test]
    fn a_read_only_segment_cannot_be_mapped_writable() {
        let seg = MemfdSegment::new(4096, false).unwrap();
        seg.host_map().write(0, b"ro").unwrap();
        let e =
            MemfdSegment::from_descriptor(dup(seg.descriptor().unwrap()), 4096, true).unwrap_err();
        assert!(e.to_string().contains("mmap"), "{e}");
        let imp =
            MemfdSegment::from_descriptor(dup(seg.descriptor().unwrap()), 4096, false).unwrap();
        assert_eq!(imp.host_map().read(0, 2).unwrap(), b"ro");
        assert!(imp.host_map().write(0, b"x").is_err());
    }

    #[test]
    fn descriptors_that_could_crash_an_importer_are_refused() {
        let seg = MemfdSegment::new(4096, true).unwrap();
        // Claiming more than the file holds.
        let e =
            MemfdSegment::from_descriptor(dup(seg.descriptor().unwrap()), 8192, false).unwrap_err();
        assert!(e.to_string().contains("4096 bytes"), "{e}");
        // A memory file without seals could shrink under the map.
        let loose = memfd_create("loose", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        ftruncate(&loose, 4096).unwrap();
        let e = MemfdSegment::from_descriptor(loose, 4096, false).unwrap_err();
        assert!(e.to_string().contains("shrink"), "{e}");
        // Not a memory file at all.
        let file: OwnedFd = std::fs::File::open("/proc/self/stat").unwrap().into();
        assert!(matches!(
            MemfdSegment::from_descriptor(file, 1, false),
            Err(ShareError::Protocol(_))
        ));
        // And a sealed file cannot be shrunk by anyone holding it.
        assert!(ftruncate(seg.descriptor().unwrap(), 0).is_err());
        assert!(MemfdSegment::new(0, true).is_err());
    }
}
