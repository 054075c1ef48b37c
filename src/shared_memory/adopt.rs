//! Adoption: a new exporter takes over the segments and names an importer still maps after its
//! exporter died, copying nothing: the importer sends back the descriptors it received and its
//! table of names ([`super::Attachment::hand_back`]); the exporter maps each segment once,
//! exports the names again, and gives the importer a lease on each (it maps them).
//!
//! A placed segment (a page of an expandable pool: [`SegmentInfo::at`]) keeps its place: the
//! exporter maps it at that offset of a range of its own as large as the dead exporter's, and
//! tells importers that range, so a buffer across pages stays contiguous in the exporter and in
//! every importer. The first placed segment taken sets the range; a segment of another range,
//! kind, or one overlapping a segment taken before (other than the same place, which another
//! importer handed back already: taken as that one) is left out. A name handed back again in
//! the same place (by a second importer that held it) gives that importer a lease on it.
//!
//! Only an exporter started with [`super::ExportOptions::accept_adoption`] takes anything; a
//! segment that cannot be mapped, or a buffer whose segment was not handed back, whose name is
//! taken, or which does not fit, is left out (the answer counts what was taken).

use super::book::ImporterId;
use super::error::ShareError;
use super::exporter::{Shared, State};
use super::memfd::HostMap;
use super::message::{BufferSpec, SegmentId, SegmentInfo, SegmentKind};
use super::segment::{self, PlacedRange, ShareableSegment};
use std::collections::HashMap;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

/// What an importer hands back in one message.
pub(super) struct Handed {
    /// The bytes of the dead exporter's range its placed segments lie in (0: none).
    pub(super) range: u64,
    /// The segments, each with its descriptor in `fds`, in order.
    pub(super) segments: Vec<SegmentInfo>,
    /// Their descriptors.
    pub(super) fds: Vec<OwnedFd>,
    /// The names and their buffers (segments by the importer's numbers).
    pub(super) buffers: Vec<(String, BufferSpec)>,
}

/// Takes what importer `importer` `handed` back; `adopted` holds its numbers for the segments
/// it handed back so far and this exporter's. The segments taken (its number, this
/// exporter's) and how many names were exported again.
pub(super) fn take(
    shared: &Shared,
    importer: ImporterId,
    adopted: &mut HashMap<SegmentId, SegmentId>,
    handed: Handed,
) -> (Vec<(SegmentId, SegmentId)>, u32) {
    let Handed {
        range,
        segments,
        fds,
        buffers,
    } = handed;
    let mut taken = Vec::new();
    for (info, fd) in segments.into_iter().zip(fds) {
        if adopted.contains_key(&info.id) {
            continue;
        }
        let new = match info.at {
            None => take_alone(shared, &info, fd),
            Some(at) => take_placed(shared, &info, fd, range, at),
        };
        if let Some(new) = new {
            adopted.insert(info.id, new);
            taken.push((info.id, new));
        }
    }
    let mut names = 0;
    let mut state = shared.state.lock();
    for (name, mut spec) in buffers {
        let Some(&new) = adopted.get(&spec.segment) else {
            continue;
        };
        spec.segment = new;
        // A name another importer handed back already, in the same place: a lease on it.
        let same = state.book.get(&name).is_some_and(|(_, had)| *had == spec);
        if same || state.publish(&name, spec).is_ok() {
            state.book.resolve(importer, &name);
            state.figures.adopted_names += u64::from(!same);
            names += 1;
        }
    }
    (taken, names)
}

/// Maps a segment on its own (outside the lock: the driver's import may take a while) and
/// adds it.
fn take_alone(shared: &Shared, info: &SegmentInfo, fd: OwnedFd) -> Option<SegmentId> {
    let seg = segment::map(info, fd).ok()?;
    let mut state = shared.state.lock();
    state.figures.adopted_segments += 1;
    Some(state.add_segment(Arc::from(seg)))
}

/// Maps a placed segment at its place `at` in this exporter's range for adopted segments
/// (reserved at the first, `range` bytes), and adds it; the segment already there when
/// another importer handed back the same place.
fn take_placed(
    shared: &Shared,
    info: &SegmentInfo,
    fd: OwnedFd,
    range: u64,
    at: u64,
) -> Option<SegmentId> {
    let into = {
        let mut state = shared.state.lock();
        match room_for(&mut state, info, range, at)? {
            Room::Taken(id) => return Some(id),
            Room::Free(into) => into,
        }
    };
    let map = segment::place(info, fd, &into, at).ok()?;
    let mut state = shared.state.lock();
    // Another importer may have handed back the same place meanwhile.
    match state.placed_at(at, info.size) {
        Ok(None) => {}
        Ok(Some(id)) => return Some(id),
        Err(()) => return None,
    }
    state.figures.adopted_segments += 1;
    Some(state.add_segment(Arc::new(Placed { map, at })))
}

/// Where a placed segment goes.
enum Room {
    /// The same place, taken already (from another importer): that segment.
    Taken(SegmentId),
    /// Free, in this range.
    Free(PlacedRange),
}

/// Checks that a placed segment of `info` at `at` in a range of `range` bytes fits this
/// exporter's range (setting it at the first: the exporter has none of its own) and its place
/// is free; reserves the range at the first. `None`: left out.
fn room_for(state: &mut State, info: &SegmentInfo, range: u64, at: u64) -> Option<Room> {
    let fits = info.size > 0 && at.checked_add(info.size).is_some_and(|end| end <= range);
    if !fits || (state.range != 0 && state.range != range) {
        return None;
    }
    if let Some(id) = state.placed_at(at, info.size).ok()? {
        return Some(Room::Taken(id));
    }
    let into = match &state.adopted_range {
        Some(r) if r.kind() == info.kind => r.clone(),
        Some(_) => return None,
        // An exporter with a range of its own (a pool's) places its own pages: none adopted.
        None if state.range != 0 => return None,
        None => {
            let r = PlacedRange::reserve(info.kind, range).ok()?;
            state.adopted_range = Some(r.clone());
            r
        }
    };
    state.range = range;
    Some(Room::Free(into))
}

/// An adopted segment mapped at its place in the exporter's range: what importers are told
/// of it ([`ShareableSegment::at`]) is that place.
#[derive(Debug)]
struct Placed {
    map: Box<dyn ShareableSegment>,
    at: u64,
}

impl ShareableSegment for Placed {
    fn kind(&self) -> SegmentKind {
        self.map.kind()
    }

    fn size(&self) -> u64 {
        self.map.size()
    }

    fn base(&self) -> usize {
        self.map.base()
    }

    fn writable(&self) -> bool {
        self.map.writable()
    }

    fn host(&self) -> Option<&HostMap> {
        self.map.host()
    }

    fn descriptor(&self) -> Result<BorrowedFd<'_>, ShareError> {
        self.map.descriptor()
    }

    fn at(&self) -> Option<u64> {
        Some(self.at)
    }
}
