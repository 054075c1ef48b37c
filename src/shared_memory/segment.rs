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
use std::fmt::Debug;
use std::os::fd::{BorrowedFd, OwnedFd};

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
    /// say so).
    fn descriptor(&self) -> BorrowedFd<'_>;
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
