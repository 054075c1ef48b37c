//! Adoption: a new exporter takes over the segments and names an importer still maps after its
//! exporter died, copying nothing: the importer sends back the descriptors it received and its
//! table of names ([`super::Attachment::hand_back`]); the exporter maps each segment once,
//! exports the names again, and gives the importer a lease on each (it maps them).
//!
//! Only an exporter started with [`super::ExportOptions::accept_adoption`] takes anything; a
//! segment that cannot be mapped, or a buffer whose segment was not handed back, whose name is
//! taken, or which does not fit, is left out (the answer counts what was taken).

use super::book::ImporterId;
use super::exporter::Shared;
use super::message::{BufferSpec, SegmentId, SegmentInfo};
use super::segment;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// Takes `segments` (their descriptors `fds`, in order) and `buffers` from importer
/// `importer`, whose numbers for the segments it handed back so far are in `adopted`; the
/// segments taken (its number, this exporter's) and how many names were exported again.
pub(super) fn take(
    shared: &Shared,
    importer: ImporterId,
    adopted: &mut HashMap<SegmentId, SegmentId>,
    segments: Vec<SegmentInfo>,
    fds: Vec<OwnedFd>,
    buffers: Vec<(String, BufferSpec)>,
) -> (Vec<(SegmentId, SegmentId)>, u32) {
    let mut taken = Vec::new();
    for (info, fd) in segments.into_iter().zip(fds) {
        if adopted.contains_key(&info.id) {
            continue;
        }
        // Mapped outside the lock: the driver's import may take a while.
        let Ok(seg) = segment::map(&info, fd) else {
            continue;
        };
        let mut state = shared.state.lock();
        let new = state.add_segment(Arc::from(seg));
        state.figures.adopted_segments += 1;
        adopted.insert(info.id, new);
        taken.push((info.id, new));
    }
    let mut names = 0;
    let mut state = shared.state.lock();
    for (name, mut spec) in buffers {
        let Some(&new) = adopted.get(&spec.segment) else {
            continue;
        };
        spec.segment = new;
        if state.publish(&name, spec).is_ok() {
            state.book.resolve(importer, &name);
            state.figures.adopted_names += 1;
            names += 1;
        }
    }
    (taken, names)
}
