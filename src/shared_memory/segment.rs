//! What can be shared: a segment of memory that an exporter maps and exports once as a file
//! descriptor, and that each importer maps from that descriptor ([`ShareableSegment`], one
//! trait for both ends).
//!
//! Two kinds stand behind the seam: a memory file ([`super::memfd`], host memory: the CPU
//! stand-in, and what the tests use) and the CUDA driver's shareable handle of a `cuMemCreate`
//! allocation ([`super::cuda_segment`]). The protocol moves descriptors and numbers only; which
//! kind a descriptor is travels with it ([`SegmentKind`]), and [`map`] maps it the kind's way.

use super::error::ShareError;
use super::memfd::HostMap;
use super::message::{SegmentInfo, SegmentKind};
use crate::cuda::vmm::AddressReservation;
use crate::os::host_pages::Reservation;
use std::fmt::Debug;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

/// Memory shared between processes, mapped in this one at [`base`](Self::base), with the
/// descriptor it is shared by: in an exporter, a segment it made (or adopted), whose
/// descriptor was made once and is what importers receive; in an importer, a segment mapped
/// from the descriptor it received, kept open to hand back to a new exporter (adoption). The
/// mapping goes when the segment is dropped; the memory stays while another process maps it or
/// holds its descriptor.
pub trait ShareableSegment: Send + Sync + Debug {
    /// What stands behind its descriptor.
    fn kind(&self) -> SegmentKind;
    /// Its length in bytes.
    fn size(&self) -> u64;
    /// Where this process maps it (a host address for a memory file, a device address for
    /// device memory).
    fn base(&self) -> usize;
    /// In an exporter, whether importers may be given write access; in an importer, whether
    /// this process may write it.
    fn writable(&self) -> bool;
    /// This process's host map of it, where the CPU can reach it (a memory file).
    fn host(&self) -> Option<&HostMap> {
        None
    }
    /// The descriptor it is shared by (read-only where it is not writable and the kind can
    /// say so); a segment may make it at the first call (a pool's page is exported when an
    /// importer first needs it), once.
    ///
    /// # Errors
    /// Where the descriptor cannot be made (the driver's refusal to export).
    fn descriptor(&self) -> Result<BorrowedFd<'_>, ShareError>;
    /// Where it lies in its exporter's range, for a segment that is part of one (a page of an
    /// expandable pool: [`super::message::SegmentInfo`]'s `at`); `None` for a segment on its own.
    fn at(&self) -> Option<u64> {
        None
    }
    /// In an importer, maps it read-only here from now on (a write faults); whether it is (a
    /// kind or driver that cannot protect it leaves it as mapped: `false`).
    ///
    /// # Errors
    /// Where the protection was asked for and failed in a way that leaves the map unknown.
    fn protect(&self) -> Result<bool, ShareError> {
        Ok(false)
    }
    /// In an importer, maps it read-write here from now on (after [`protect`](Self::protect));
    /// for a segment the exporter lets importers write only.
    ///
    /// # Errors
    /// Where it cannot be made writable (the system's refusal).
    fn allow_writes(&self) -> Result<(), ShareError> {
        Ok(())
    }
}

/// Maps the segment `info` describes from its descriptor `fd`, the way of its kind: an
/// importer's map, and an adopting exporter's.
///
/// # Errors
/// [`ShareError::Protocol`] when the descriptor is not what `info` says (too small, a memory
/// file that can still shrink); [`ShareError::Driver`] for a device segment where the driver
/// cannot import it (no driver: see [`super::cuda_segment`]); the I/O error of the map.
pub fn map(info: &SegmentInfo, fd: OwnedFd) -> Result<Box<dyn ShareableSegment>, ShareError> {
    match info.kind {
        SegmentKind::Memfd => Ok(Box::new(super::memfd::MemfdSegment::from_descriptor(
            fd,
            info.size,
            info.writable,
        )?)),
        SegmentKind::CudaFd => Ok(Box::new(super::cuda_segment::CudaSegment::import(
            fd,
            info.size,
            info.writable,
        )?)),
    }
}

/// An importer's range for one exporter's placed segments ([`SegmentInfo::at`]): reserved once,
/// as large as the exporter's range, in host or device addresses by the segments' kind. Each
/// placed segment holds it, so it stays until the last of them is unmapped.
#[derive(Debug, Clone)]
pub enum PlacedRange {
    /// Host addresses, for memory files.
    Host(Arc<Reservation>),
    /// Device addresses on the current device, for the driver's shareable handles.
    Device(Arc<AddressReservation>),
}

impl PlacedRange {
    /// Reserves `size` bytes of addresses for segments of `kind`.
    ///
    /// # Errors
    /// [`ShareError::Invalid`] for no bytes; [`ShareError::Driver`] when the addresses cannot be
    /// reserved (out of address space, no driver for device segments).
    pub fn reserve(kind: SegmentKind, size: u64) -> Result<PlacedRange, ShareError> {
        let len = usize::try_from(size)
            .ok()
            .filter(|&l| l > 0)
            .ok_or_else(|| ShareError::invalid("range", format!("{size} bytes")))?;
        Ok(match kind {
            SegmentKind::Memfd => PlacedRange::Host(Arc::new(Reservation::new(len)?)),
            SegmentKind::CudaFd => {
                let device = crate::cuda::current_device()?;
                let _ctx = crate::cuda::ContextGuard::new(device)?;
                let granularity = crate::cuda::vmm::allocation_granularity(device)?;
                let len = len
                    .div_ceil(granularity)
                    .checked_mul(granularity)
                    .ok_or_else(|| ShareError::invalid("range", format!("{size} bytes")))?;
                PlacedRange::Device(Arc::new(AddressReservation::new(len, granularity)?))
            }
        })
    }

    /// The kind of segment it holds.
    pub fn kind(&self) -> SegmentKind {
        match self {
            PlacedRange::Host(_) => SegmentKind::Memfd,
            PlacedRange::Device(_) => SegmentKind::CudaFd,
        }
    }

    /// Its first address.
    pub fn base(&self) -> usize {
        match self {
            PlacedRange::Host(r) => r.base(),
            PlacedRange::Device(r) => r.base(),
        }
    }

    /// Its bytes.
    pub fn size(&self) -> usize {
        match self {
            PlacedRange::Host(r) => r.len(),
            PlacedRange::Device(r) => r.size(),
        }
    }
}

/// Maps the segment `info` describes from its descriptor `fd` at `at` of `range`, where the
/// caller checked that no other segment lies: an importer's map of an exporter's placed
/// segment.
///
/// # Errors
/// [`ShareError::Protocol`] for a segment of another kind than the range's; as [`map`]; the
/// refusal of a place outside the range.
pub fn place(
    info: &SegmentInfo,
    fd: OwnedFd,
    range: &PlacedRange,
    at: u64,
) -> Result<Box<dyn ShareableSegment>, ShareError> {
    let offset =
        usize::try_from(at).map_err(|_| ShareError::Protocol(format!("a segment at {at}")))?;
    match (info.kind, range) {
        (SegmentKind::Memfd, PlacedRange::Host(r)) => Ok(Box::new(
            super::memfd::MemfdSegment::place(fd, info.size, info.writable, r, offset)?,
        )),
        (SegmentKind::CudaFd, PlacedRange::Device(r)) => Ok(Box::new(
            super::cuda_segment::CudaSegment::place(fd, info.size, info.writable, r, offset)?,
        )),
        (kind, range) => Err(ShareError::Protocol(format!(
            "a {kind:?} segment in a range of {:?} segments",
            range.kind()
        ))),
    }
}
