//! The exporter's thread: one `poll` over its listening socket and every importer's, one packet
//! of each ready importer a turn, every answer sent with a deadline.
//!
//! How a hostile, stopped or dying importer is met:
//! - another user's connection is closed at once; past [`ExportOptions::max_importers`] a
//!   connection is refused (busy) and closed;
//! - a request that does not decode, is out of sequence (replayed, dropped or reordered), or
//!   is not one to answer now is refused with its reason ([`Refusal`]); past
//!   [`ExportOptions::max_refusals`] the importer is muted;
//! - an answer that cannot be sent within [`ExportOptions::send_timeout`] (an importer that
//!   does not read: stopped, or hostile) mutes the importer;
//! - a muted importer is read no more, but its leases hold until its socket closes: it may still
//!   map what it resolved, so nothing it holds is reused while it lives;
//! - a closed socket (the importer let go, exited or was killed) releases all its leases, and
//!   the frees that waited for them run.
//!
//! The state's lock is held only to compute an answer, never across a send or a free.
//!
//! [`ExportOptions::max_importers`]: super::ExportOptions::max_importers
//! [`ExportOptions::max_refusals`]: super::ExportOptions::max_refusals
//! [`ExportOptions::send_timeout`]: super::ExportOptions::send_timeout

use super::book::ImporterId;
use super::error::{Refusal, ShareError};
use super::exporter::{OnFree, Shared};
use super::message::{limits, Entry, Frame, Message, SegmentId, SegmentInfo};
use super::segment::ShareableSegment;
use super::transport::{Channel, Listener, Packet};
use rustix::event::{poll, PollFd, PollFlags};
use std::collections::{HashMap, HashSet};
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One importer's connection.
struct Importer {
    id: ImporterId,
    channel: Channel,
    /// The last request's number (the next must be one more).
    last_seq: u32,
    greeted: bool,
    /// Segments whose descriptor it received.
    sent: HashSet<SegmentId>,
    /// Segments it handed back (adoption): its numbers to this exporter's.
    adopted: HashMap<SegmentId, SegmentId>,
    refusals: u32,
    muted: bool,
}

/// An answer to send: the frame and the segments whose descriptors ride beside it.
struct Answer {
    frame: Frame,
    segments: Vec<Arc<dyn ShareableSegment>>,
    refused: bool,
}

impl Answer {
    fn plain(seq: u32, message: Message) -> Answer {
        Answer {
            frame: Frame::new(seq, message),
            segments: Vec::new(),
            refused: false,
        }
    }

    fn refuse(seq: u32, reason: Refusal, detail: impl std::fmt::Display) -> Answer {
        // Refusals carry the peer's words back: printable, and within the limit.
        let mut detail: String = detail
            .to_string()
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        while detail.len() > limits::DETAIL {
            detail.pop();
        }
        Answer {
            frame: Frame::new(seq, Message::Refused { reason, detail }),
            segments: Vec::new(),
            refused: true,
        }
    }
}

/// Serves until the exporter stops.
pub(super) fn run(shared: &Shared, listener: &Listener, wake: &Channel) {
    let mut importers: Vec<Importer> = Vec::new();
    let mut next_id: ImporterId = 0;
    while !shared.stop.load(Ordering::SeqCst) {
        let ready: Vec<PollFlags> = {
            let mut fds = Vec::with_capacity(importers.len() + 2);
            fds.push(PollFd::new(wake, PollFlags::IN));
            fds.push(PollFd::new(listener, PollFlags::IN));
            for imp in &importers {
                let events = if imp.muted {
                    PollFlags::empty()
                } else {
                    PollFlags::IN
                };
                fds.push(PollFd::new(&imp.channel, events));
            }
            match poll(&mut fds, None) {
                Ok(_) => fds.iter().map(PollFd::revents).collect(),
                Err(_) => continue,
            }
        };
        if !ready[0].is_empty() {
            while let Ok(Some(_)) = wake.try_recv() {}
            continue;
        }
        if !ready[1].is_empty() {
            accept(shared, listener, &mut importers, &mut next_id);
        }
        let mut closed = Vec::new();
        for (imp, events) in importers.iter_mut().zip(&ready[2..]) {
            if events.contains(PollFlags::IN) && !imp.muted {
                if !serve_one(shared, imp) {
                    closed.push(imp.id);
                }
            } else if events.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::NVAL) {
                closed.push(imp.id);
            }
        }
        for id in closed {
            importers.retain(|imp| imp.id != id);
            let frees = {
                let mut state = shared.state.lock();
                state.figures.importers = state.figures.importers.saturating_sub(1);
                let freed = state.book.drop_importer(id);
                state.take_frees(&freed)
            };
            run_frees(frees);
        }
    }
}

fn run_frees(frees: Vec<OnFree>) {
    for free in frees {
        free();
    }
}

/// Takes every waiting connection: another user's is closed, one past the limit refused.
fn accept(
    shared: &Shared,
    listener: &Listener,
    importers: &mut Vec<Importer>,
    next_id: &mut ImporterId,
) {
    while let Ok(Some(channel)) = listener.accept() {
        let mut state = shared.state.lock();
        if channel.check_user().is_err() {
            state.figures.other_users += 1;
            continue;
        }
        let busy = if state.paused {
            Some("the exporter's memory sleeps: attach again once it wakes")
        } else if importers.len() >= shared.options.max_importers {
            Some("as many importers as allowed")
        } else {
            None
        };
        if let Some(why) = busy {
            state.figures.busy += 1;
            drop(state);
            let answer = Answer::refuse(0, Refusal::Busy, why);
            if let Ok(bytes) = answer.frame.encode() {
                let _ = channel.send(&bytes, &[], Instant::now() + Duration::from_millis(10));
            }
            continue;
        }
        state.figures.importers += 1;
        *next_id += 1;
        importers.push(Importer {
            id: *next_id,
            channel,
            last_seq: 0,
            greeted: false,
            sent: HashSet::new(),
            adopted: HashMap::new(),
            refusals: 0,
            muted: false,
        });
    }
}

/// Reads and answers one packet of `imp`; false when its socket closed.
fn serve_one(shared: &Shared, imp: &mut Importer) -> bool {
    let answer = match imp.channel.try_recv() {
        Ok(None) => return true,
        Ok(Some(packet)) => answer(shared, imp, packet),
        Err(ShareError::Wire(e)) => Answer::refuse(0, Refusal::Malformed, e),
        Err(_) => return false,
    };
    let mute = {
        let mut state = shared.state.lock();
        if answer.refused {
            state.figures.refused += 1;
            imp.refusals += 1;
        }
        imp.refusals > shared.options.max_refusals
    };
    // A segment that makes its descriptor now (a pool's page, exported at its first need) and
    // cannot: the request is refused with the reason (the leases it took hold until released).
    let fds: Result<Vec<BorrowedFd<'_>>, ShareError> =
        answer.segments.iter().map(|s| s.descriptor()).collect();
    let refusal;
    let (frame, fds) = match fds {
        Ok(fds) => (&answer.frame, fds),
        Err(e) => {
            refusal = Answer::refuse(answer.frame.seq, Refusal::NotAllowed, e).frame;
            (&refusal, Vec::new())
        }
    };
    let sent = frame.encode().map_err(ShareError::from).and_then(|bytes| {
        imp.channel
            .send(&bytes, &fds, Instant::now() + shared.options.send_timeout)
    });
    match sent {
        Ok(()) if !mute => true,
        Err(ShareError::Gone) => false,
        _ => {
            imp.muted = true;
            shared.state.lock().figures.muted += 1;
            true
        }
    }
}

/// The answer to one packet.
fn answer(shared: &Shared, imp: &mut Importer, packet: Packet) -> Answer {
    let frame = match Frame::decode(&packet.bytes) {
        Ok(frame) => frame,
        Err(e) => {
            let seq = Frame::seq_of(&packet.bytes).unwrap_or(0);
            return Answer::refuse(seq, Refusal::Malformed, e);
        }
    };
    let seq = frame.seq;
    if seq != imp.last_seq.wrapping_add(1) {
        return Answer::refuse(
            seq,
            Refusal::OutOfOrder,
            format!("request {seq}, expected {}", imp.last_seq.wrapping_add(1)),
        );
    }
    if packet.fds_cut || packet.fds.len() != frame.message.descriptors() {
        return Answer::refuse(
            seq,
            Refusal::Malformed,
            format!(
                "{} descriptors{} beside a message that carries {}",
                packet.fds.len(),
                if packet.fds_cut { " (cut)" } else { "" },
                frame.message.descriptors()
            ),
        );
    }
    let answer = answer_in_order(shared, imp, seq, frame.message, packet.fds);
    // A request refused leaves the sequence where it was: the next must carry the same number.
    if !answer.refused {
        imp.last_seq = seq;
    }
    answer
}

/// The answer to a request that came in order.
fn answer_in_order(
    shared: &Shared,
    imp: &mut Importer,
    seq: u32,
    message: Message,
    fds: Vec<OwnedFd>,
) -> Answer {
    match (imp.greeted, message) {
        (false, Message::Hello) => {
            imp.greeted = true;
            let (names, range) = {
                let state = shared.state.lock();
                (state.book.figures().names, state.range)
            };
            Answer::plain(
                seq,
                Message::Welcome {
                    pid: std::process::id(),
                    names: u32::try_from(names).unwrap_or(u32::MAX),
                    range,
                },
            )
        }
        (true, Message::Resolve { names }) => resolve(shared, imp, seq, &names),
        (true, Message::Release { names }) => {
            let (count, frees) = {
                let mut state = shared.state.lock();
                let mut count = 0;
                let mut freed = Vec::new();
                for name in &names {
                    let (n, f) = state.book.release(imp.id, name);
                    count += n;
                    freed.extend(f);
                }
                (count, state.take_frees(&freed))
            };
            run_frees(frees);
            Answer::plain(seq, Message::Released { count })
        }
        (true, Message::List { after }) => {
            let (names, more) = shared.state.lock().book.names_after(&after, limits::BATCH);
            Answer::plain(seq, Message::Names { names, more })
        }
        (
            true,
            Message::Adopt {
                range,
                segments,
                buffers,
            },
        ) if shared.options.accept_adoption => {
            let handed = super::adopt::Handed {
                range,
                segments,
                fds,
                buffers,
            };
            let (segments, names) = super::adopt::take(shared, imp.id, &mut imp.adopted, handed);
            imp.sent.extend(segments.iter().map(|&(_, new)| new));
            Answer::plain(seq, Message::Adopted { segments, names })
        }
        (true, Message::Adopt { .. }) => {
            Answer::refuse(seq, Refusal::NotAllowed, "this exporter adopts nothing")
        }
        (_, other) => Answer::refuse(
            seq,
            Refusal::Unexpected,
            format!("{} not answered here", kind_name(&other)),
        ),
    }
}

fn kind_name(m: &Message) -> &'static str {
    match m {
        Message::Hello => "a second greeting",
        Message::Welcome { .. } => "a welcome",
        Message::Resolve { .. } => "a resolve before the greeting",
        Message::Resolved { .. } => "an answer (resolved)",
        Message::Release { .. } => "a release before the greeting",
        Message::Released { .. } => "an answer (released)",
        Message::List { .. } => "a list before the greeting",
        Message::Names { .. } => "an answer (names)",
        Message::Refused { .. } => "a refusal",
        Message::Adopt { .. } => "an adoption before the greeting",
        Message::Adopted { .. } => "an answer (adopted)",
    }
}

/// Resolves the first of `names` that fit one answer: each exported name takes a lease; each
/// segment the importer has not received rides beside, at most [`limits::SEGMENTS`]. A first
/// name in more new segments than that gets an answer of segments only, as many as fit (the
/// importer asks again).
fn resolve(shared: &Shared, imp: &mut Importer, seq: u32, names: &[String]) -> Answer {
    let mut state = shared.state.lock();
    let mut segments: Vec<Arc<dyn ShareableSegment>> = Vec::new();
    let mut infos: Vec<SegmentInfo> = Vec::new();
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        let ids = match state
            .book
            .get(name)
            .map(|(_, spec)| state.segments_of(spec))
        {
            Some(Ok(ids)) => ids,
            // A buffer whose segments are gone: not exported any more.
            Some(Err(_)) => {
                entries.push(Entry::Unknown { name: name.clone() });
                continue;
            }
            None => Vec::new(),
        };
        let new: Vec<SegmentId> = ids
            .into_iter()
            .filter(|id| !imp.sent.contains(id) && !infos.iter().any(|s| s.id == *id))
            .collect();
        let room = limits::SEGMENTS - infos.len();
        if new.len() > room && !(entries.is_empty() && infos.is_empty()) {
            break; // the rest in the next answer
        }
        for &id in new.iter().take(room) {
            if let Some(seg) = state.segments.get(&id).cloned() {
                infos.push(SegmentInfo {
                    id,
                    size: seg.size(),
                    kind: seg.kind(),
                    writable: seg.writable(),
                    at: seg.at(),
                });
                segments.push(seg);
            }
        }
        if new.len() > room {
            break; // segments only: the name in the next answer
        }
        entries.push(match state.book.resolve(imp.id, name) {
            Some(spec) => Entry::Found {
                name: name.clone(),
                spec: spec.clone(),
            },
            None => Entry::Unknown { name: name.clone() },
        });
    }
    imp.sent.extend(infos.iter().map(|s| s.id));
    Answer {
        frame: Frame::new(
            seq,
            Message::Resolved {
                segments: infos,
                entries,
            },
        ),
        segments,
        refused: false,
    }
}
