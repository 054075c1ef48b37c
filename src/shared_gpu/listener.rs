//! The listener thread: receives datagrams on the member's socket and routes them, and keeps
//! the entry written.

use super::answering::mark_answering_thread;
use super::member::Member;
use super::message::MAX_MESSAGE;
use super::publishing::PUBLISH_EVERY;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Instant;

/// The listener: answers requests and routes answers until the member leaves or drops;
/// writes the entry when something changed, and every [`PUBLISH_EVERY`] regardless.
pub(super) fn listen(member: &Weak<Member>) {
    mark_answering_thread();
    let mut buf = vec![0u8; MAX_MESSAGE + 1];
    let mut last = Instant::now();
    loop {
        let Some(m) = member.upgrade() else {
            return;
        };
        if m.stop.load(Ordering::Acquire) {
            return;
        }
        if let Ok((n, _)) = m.socket.recv_from(&mut buf) {
            m.handle(&buf[..n]);
        }
        if m.dirty.load(Ordering::Acquire) || last.elapsed() >= PUBLISH_EVERY {
            m.publish();
            m.read_others();
            last = Instant::now();
        }
    }
}
