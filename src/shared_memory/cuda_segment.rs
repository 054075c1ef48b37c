//! Device memory behind the seam: a `cuMemCreate` allocation made with the POSIX file
//! descriptor handle type, exported once (`cuMemExportToShareableHandle`), imported by each
//! importer (`cuMemImportFromShareableHandle`) and mapped into a range it reserves, with
//! read-only access where the segment is not writable.
//!
//! Every driver call is in [`crate::cuda::vmm`]; this file only puts them together. Without a
//! driver each constructor fails with [`crate::Error::NoDriver`] (as [`ShareError::Driver`]),
//! so a CPU importer that is sent a device segment refuses it cleanly.
//!
//! What the expandable pool still needs to share its own pages (the GPU half of issue 49): its
//! pages are made by [`PhysicalMemory::new`], without the handle type; made by
//! [`PhysicalMemory::new_shareable`] instead, each page (or run of pages) can be wrapped as a
//! [`ShareableSegment`] in place of [`CudaSegment::new`]'s own allocation.
//!
//! A read-only device segment is enforced by the importer's access flags only: the driver's
//! descriptor carries no mode, so an importer that ignores the flag could map it writable.

use super::error::ShareError;
use super::message::SegmentKind;
use super::segment::ShareableSegment;
use crate::cuda::vmm::{
    allocation_granularity, set_access_mode, AddressReservation, Mapping, PhysicalMemory,
};
use crate::cuda::ContextGuard;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// Physical memory mapped into a range of its own on one device. Fields drop in order: the
/// mapping before the reservation it lies in.
#[derive(Debug)]
struct DeviceMap {
    mapping: Mapping,
    _reservation: AddressReservation,
    size: u64,
    device: usize,
}

impl DeviceMap {
    /// Reserves a range on `device`, maps `memory` there, grants the device access to it.
    fn new(device: usize, memory: PhysicalMemory, writable: bool) -> Result<DeviceMap, ShareError> {
        let _ctx = ContextGuard::new(device)?;
        let size = memory.size();
        let granularity = allocation_granularity(device)?;
        let reservation = AddressReservation::new(size, granularity)?;
        // SAFETY: the range is the whole of a reservation just made, which outlives the
        // mapping (dropped after it, field order), and nothing else is mapped there.
        let mapping = unsafe { Mapping::new(reservation.base(), memory) }?;
        set_access_mode(device, mapping.addr(), size, writable)?;
        Ok(DeviceMap {
            mapping,
            _reservation: reservation,
            size: size as u64,
            device,
        })
    }
}

/// The size in bytes as the driver takes it.
fn bytes(size: u64) -> Result<usize, ShareError> {
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| ShareError::invalid("size", format!("{size} bytes")))
}

/// Device memory shared between processes: an allocation an exporter made, or one imported
/// from a descriptor received (by an importer, or an exporter adopting it), on the current
/// device.
#[derive(Debug)]
pub struct CudaSegment {
    map: DeviceMap,
    fd: OwnedFd,
    writable: bool,
}

impl CudaSegment {
    /// `size` bytes (a multiple of the device's granularity) of new device memory on
    /// `device`, mapped here and exported once; importers may write it when `writable`.
    ///
    /// # Errors
    /// [`ShareError::Driver`]: no driver, out of memory, or a driver that cannot share memory.
    pub fn new(device: usize, size: u64, writable: bool) -> Result<CudaSegment, ShareError> {
        let _ctx = ContextGuard::new(device)?;
        let memory = PhysicalMemory::new_shareable(device, bytes(size)?)?;
        let fd = memory.export_fd()?;
        Ok(CudaSegment {
            map: DeviceMap::new(device, memory, true)?,
            fd,
            writable,
        })
    }

    /// Imports the memory behind `fd` (`size` bytes), maps it into a range reserved for it on
    /// the current device, readable, and writable when `writable`.
    ///
    /// # Errors
    /// [`ShareError::Driver`]: no driver, a descriptor that is not shareable device memory,
    /// a size that is not the memory's.
    pub fn import(fd: OwnedFd, size: u64, writable: bool) -> Result<CudaSegment, ShareError> {
        let device = crate::cuda::current_device()?;
        let _ctx = ContextGuard::new(device)?;
        let memory = PhysicalMemory::import_fd(fd.as_fd(), bytes(size)?)?;
        Ok(CudaSegment {
            map: DeviceMap::new(device, memory, writable)?,
            fd,
            writable,
        })
    }

    /// The device it lies on.
    pub fn device(&self) -> usize {
        self.map.device
    }
}

impl ShareableSegment for CudaSegment {
    fn kind(&self) -> SegmentKind {
        SegmentKind::CudaFd
    }

    fn size(&self) -> u64 {
        self.map.size
    }

    fn base(&self) -> usize {
        self.map.mapping.addr()
    }

    fn writable(&self) -> bool {
        self.writable
    }

    fn descriptor(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_a_device_segment_is_refused_cleanly() {
        if crate::cuda::driver_available() {
            return; // with a driver, the GPU half of issue 49 tests it
        }
        let fd: OwnedFd = std::fs::File::open("/proc/self/stat").unwrap().into();
        let e = CudaSegment::import(fd, 1 << 21, false).unwrap_err();
        assert!(
            matches!(e, ShareError::Driver(crate::Error::NoDriver(_))),
            "{e}"
        );
        assert!(matches!(
            CudaSegment::new(0, 1 << 21, true),
            Err(ShareError::Driver(crate::Error::NoDriver(_)))
        ));
    }
}
