//! What can be shared: a segment of memory that an exporter maps and exports once as a file
//! descriptor ([`ShareableSegment`]), and the same memory as an importer maps it from that
//! descriptor ([`MappedSegment`]).
//!
//! Two kinds stand behind the seam: a memory file ([`super::memfd`], host memory: the CPU
//! stand-in, and what the tests use) and the CUDA driver's shareable handle of a `cuMemCreate`
//! allocation ([`super::cuda_segment`]). The protocol moves descriptors and numbers only; which
//! kind a descriptor is travels with it ([`SegmentKind`]), and [`map`] maps it the kind's way.

use super::error::ShareError;
use super::memfd::HostMap;
use super::message::{SegmentInfo, SegmentKind};
use std::fmt::Debug;
use std::os::fd::{BorrowedFd, OwnedFd};

/// Memory an exporter shares: mapped in the exporter at [`base`](Self::base), exported once as
/// a descriptor that stays open while the segment lives.
pub trait ShareableSegment: Send + Sync + Debug {
    /// What stands behind its descriptor.
    fn kind(&self) -> SegmentKind;
    /// Its length in bytes.
    fn size(&self) -> u64;
    /// Where the exporter maps it (a host address for a memory file, a device address for
    /// device memory).
    fn base(&self) -> usize;
    /// Whether importers may be given write access.
    fn writable(&self) -> bool;
    /// The exporter's host map of it, where the CPU can reach it (a memory file).
    fn host(&self) -> Option<&HostMap> {
        None
    }
    /// The descriptor importers receive: made once, when the segment was made or adopted
    /// (read-only where the segment is not writable and the kind can say so).
    fn descriptor(&self) -> BorrowedFd<'_>;
}

/// A segment as an importer maps it from the descriptor it received; unmapped when dropped
/// (the memory stays while another process maps it or holds its descriptor).
pub trait MappedSegment: Send + Sync + Debug {
    /// What stands behind it.
    fn kind(&self) -> SegmentKind;
    /// Where this process maps it.
    fn base(&self) -> usize;
    /// Its length in bytes.
    fn size(&self) -> u64;
    /// Whether this process may write it.
    fn writable(&self) -> bool;
    /// This process's host map of it, where the CPU can reach it (a memory file).
    fn host(&self) -> Option<&HostMap> {
        None
    }
    /// The descriptor it was mapped from (kept open: handed back to a new exporter in an
    /// adoption).
    fn descriptor(&self) -> BorrowedFd<'_>;
}

/// Maps the segment `info` describes from its descriptor `fd`, the way of its kind.
///
/// # Errors
/// [`ShareError::Protocol`] when the descriptor is not what `info` says (too small, a memory
/// file that can still shrink); [`ShareError::Driver`] for a device segment where the driver
/// cannot import it (no driver, or a build without the import: see
/// [`super::cuda_segment`]); the I/O error of the map.
pub fn map(info: &SegmentInfo, fd: OwnedFd) -> Result<Box<dyn MappedSegment>, ShareError> {
    match info.kind {
        SegmentKind::Memfd => Ok(Box::new(super::memfd::MemfdMapping::map(
            fd,
            info.size,
            info.writable,
        )?)),
        SegmentKind::CudaFd => Ok(Box::new(super::cuda_segment::CudaMapping::import(
            fd,
            info.size,
            info.writable,
        )?)),
    }
}

/// A segment an exporter takes over from an importer's mapping (adoption): the kind's way of
/// exporting memory it did not make.
///
/// # Errors
/// As [`map`].
pub fn adopt(info: &SegmentInfo, fd: OwnedFd) -> Result<Box<dyn ShareableSegment>, ShareError> {
    match info.kind {
        SegmentKind::Memfd => Ok(Box::new(super::memfd::MemfdSegment::adopt(
            fd,
            info.size,
            info.writable,
        )?)),
        SegmentKind::CudaFd => Ok(Box::new(super::cuda_segment::CudaSegment::adopt(
            fd,
            info.size,
            info.writable,
        )?)),
    }
}
