//! One copy, many processes: memory an exporter maps that importers of the same user map too,
//! without copying (issue 49).
//!
//! An [`Exporter`] holds segments (large allocations, each exported once as a file descriptor:
//! [`ShareableSegment`]) and names buffers in them ([`BufferSpec`]: segment, offset, size,
//! dtype, shape, read-only). It serves them on a Unix socket in the ledger's checked directory
//! ([`crate::shared_gpu::ledger_dir`], only its user can reach it; each connection's user is
//! checked again with `SO_PEERCRED`). An [`Attachment`] connects, resolves names, receives each
//! segment's descriptor once (`SCM_RIGHTS`, beside the first name that lies in it), maps it once
//! ([`segment::map`]) and turns names into addresses ([`Resolved`]).
//!
//! - **Lifetimes**: a resolve takes a lease. A free of an exported buffer ([`Exporter::free`])
//!   runs when the last importer holding it lets go, or dies (a closed socket releases its
//!   leases); the figures count the frees that wait ([`ExportFigures`]). An importer whose
//!   exporter dies keeps its mappings and its resolved names.
//! - **Adoption**: a new exporter ([`ExportOptions::accept_adoption`]) takes the segments and
//!   names back from a live importer ([`Attachment::hand_back`]), copying nothing ([`adopt`]).
//! - **Trust**: messages are framed with a version and a sequence number and decoded with every
//!   length bounded ([`message`], [`codec`]); a bad, truncated or replayed request is refused
//!   with its reason and the exporter serves on; every wait has a deadline ([`transport`]); an
//!   importer resolves only exported names and receives only the segments they lie in
//!   (`serve.rs`). An importer checks what it is sent as carefully ([`importer`]).
//!
//! Two kinds of segment stand behind the seam: a sealed memory file ([`memfd`], host memory:
//! the CPU stand-in the tests use) and device memory through the driver's shareable handle
//! ([`cuda_segment`]).
//!
//! An expandable pool made shareable exports its own pages as segments placed in its range
//! ([`SegmentInfo::at`](message::SegmentInfo::at)); importers map them side by side in one
//! range of their own ([`segment::PlacedRange`]), so a buffer across pages is contiguous
//! there (`crate::suballocator::ExpandableMemoryResource::publish`).
//!
//! A published pool sleeps only with no importer attached and exports its new pages at the
//! wake under the same numbers (`crate::suballocator::expandable::share`); an adopting
//! exporter keeps each placed segment's place ([`adopt`]), so a buffer across pages stays
//! contiguous after an adoption too.

pub mod adopt;
pub mod book;
pub mod codec;
pub mod cuda_segment;
pub mod error;
pub mod exporter;
pub mod importer;
pub mod memfd;
pub mod message;
pub mod segment;
mod serve;
pub mod transport;

#[cfg(test)]
mod tests;

use crate::shared_gpu::ledger_dir::LedgerDir;

pub use error::{Refusal, ShareError, WireError};

/// The socket of the exporter named `name` in the ledger directory `dir`.
///
/// # Errors
/// [`ShareError::Invalid`] for a name that cannot name a socket
/// ([`LedgerDir::share_path`]).
pub fn socket_path(dir: &LedgerDir, name: &str) -> Result<std::path::PathBuf, ShareError> {
    dir.share_path(name)
        .map_err(|e| ShareError::invalid("name", e.to_string()))
}
pub use exporter::{ExportFigures, ExportOptions, Exporter, FreeOutcome};
pub use importer::{AttachOptions, Attachment, Resolved};
pub use memfd::MemfdSegment;
pub use message::{BufferSpec, SegmentId, SegmentKind};
pub use segment::ShareableSegment;
