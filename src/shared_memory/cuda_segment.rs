//! Device memory behind the seam: a `cuMemCreate` allocation made with the POSIX file
//! descriptor handle type, exported once (`cuMemExportToShareableHandle`), imported by each
//! importer (`cuMemImportFromShareableHandle`) and mapped into a range it reserves, with
//! read-only access where the segment is not writable.
//!
//! Every driver call is in [`crate::cuda::vmm`]; this file only puts them together. Without a
//! driver each constructor fails with [`crate::Error::NoDriver`] (as [`ShareError::Driver`]),
//! so a CPU importer that is sent a device segment refuses it cleanly.
//!
//! An expandable pool made shareable makes its pages with [`PhysicalMemory::new_shareable`] and
//! exports each page as its own segment (the expandable pool's sharing, `ExpandableMemoryResource::publish`); an
//! importer maps those into one range of its own, each at its place in the exporter's range
//! ([`CudaSegment::place`]), so a buffer across pages is contiguous there too.
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
use std::sync::Arc;

/// Physical memory mapped into a range on one device (its own, or an importer's range shared
/// by the segments of one exporter). Fields drop in order: the mapping before the reservation
/// it lies in.
#[derive(Debug)]
struct DeviceMap {
    mapping: Mapping,
    _reservation: Arc<AddressReservation>,
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
            _reservation: Arc::new(reservation),
            size: size as u64,
            device,
        })
    }

    /// Maps `memory` at `offset` of `range` (where the caller checked nothing else lies), grants
    /// `device` access to it.
    fn placed(
        device: usize,
        memory: PhysicalMemory,
        writable: bool,
        range: &Arc<AddressReservation>,
        offset: usize,
    ) -> Result<DeviceMap, ShareError> {
        let size = memory.size();
        if offset
            .checked_add(size)
            .map_or(true, |end| end > range.size())
        {
            return Err(ShareError::invalid(
                "segment place",
                format!(
                    "{size} bytes at {offset} pass the range's {} bytes",
                    range.size()
                ),
            ));
        }
        let _ctx = ContextGuard::new(device)?;
        // SAFETY: the range lies inside `range` (checked above), which outlives the mapping
        // (held by it, dropped after it: field order); the caller checked that nothing else is
        // mapped there.
        let mapping = unsafe { Mapping::new(range.base() + offset, memory) }?;
        set_access_mode(device, mapping.addr(), size, writable)?;
        Ok(DeviceMap {
            mapping,
            _reservation: range.clone(),
            size: size as u64,
            device,
        })
    }
}

impl DeviceMap {
    /// Grants the device read-only or (`writable`) read-write access to the map.
    fn set_writable(&self, writable: bool) -> Result<(), ShareError> {
        let _ctx = ContextGuard::new(self.device)?;
        set_access_mode(
            self.device,
            self.mapping.addr(),
            self.size as usize,
            writable,
        )?;
        Ok(())
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

    /// As [`import`](Self::import), mapped at `offset` of `range` (an importer's range for an
    /// exporter's placed segments), where the caller checked that nothing else lies.
    ///
    /// # Errors
    /// As [`import`](Self::import); [`ShareError::Invalid`] for a place outside the range.
    pub fn place(
        fd: OwnedFd,
        size: u64,
        writable: bool,
        range: &Arc<AddressReservation>,
        offset: usize,
    ) -> Result<CudaSegment, ShareError> {
        let device = crate::cuda::current_device()?;
        let _ctx = ContextGuard::new(device)?;
        let memory = PhysicalMemory::import_fd(fd.as_fd(), bytes(size)?)?;
        Ok(CudaSegment {
            map: DeviceMap::placed(device, memory, writable, range, offset)?,
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

    fn descriptor(&self) -> Result<BorrowedFd<'_>, ShareError> {
        Ok(self.fd.as_fd())
    }

    fn protect(&self) -> Result<bool, ShareError> {
        // A driver that refuses read-only access leaves the map's access as it was.
        Ok(self.map.set_writable(false).is_ok())
    }

    fn allow_writes(&self) -> Result<(), ShareError> {
        self.map.set_writable(true)
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
