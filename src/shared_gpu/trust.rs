//! Which answers count: pure rules, no I/O (what they judge is read where answers arrive,
//! `pending.rs`).
//!
//! An answer says "I gave N bytes". It counts only when
//! 1. it comes from the process that was asked: the kernel's credentials of its sender, seen
//!    through `/proc` (pid in its own namespace, namespace, start time), are the identity of
//!    the entry asked ([`sender`]);
//! 2. and at most what the answerer's own entry shows it gave: the answerer writes its entry
//!    before it answers, and the asker counts at most the drop in the bytes it holds of the
//!    device (live and cached) between the entry read before the request and the one read when
//!    the answer came; for a sleep, at most what left its cache or went asleep; never more
//!    than the device ([`counted`]).
//!
//! A claim beyond the device is refused outright (recorded); a claim beyond what the entry
//! shows counts what the entry shows.

use super::entry::Entry;
use super::process::Identity;
use super::socket::Credentials;

/// What was asked of the answerer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// Give back what its pools keep free.
    Give,
    /// Sleep (its live data to the host).
    Sleep,
}

/// What an entry shows the process holds, the figures an answer is checked against.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holding {
    /// Bytes in use.
    pub live: u64,
    /// Bytes its pools keep free.
    pub cached: u64,
    /// Bytes of its data asleep on the host.
    pub asleep: u64,
}

impl From<&Entry> for Holding {
    fn from(e: &Entry) -> Holding {
        let h = &e.holder;
        Holding {
            live: h.live,
            cached: h.cached,
            asleep: h.asleep,
        }
    }
}

impl Holding {
    fn held(&self) -> u64 {
        self.live.saturating_add(self.cached)
    }
}

/// Whether the sender of an answer is the process asked: `asked` as its entry names it,
/// `sender` as the kernel names it to `me` (this process), `seen` the sender as `/proc` shows
/// it from here (`None` where it cannot: another view of `/proc`).
///
/// # Errors
/// Why not, in words.
pub fn sender(
    asked: &Identity,
    me: &Identity,
    my_uid: u32,
    sender: Option<Credentials>,
    seen: Option<Identity>,
) -> Result<(), String> {
    let Some(sender) = sender else {
        return Err("the kernel named no sender".into());
    };
    if sender.uid != my_uid {
        return Err(format!(
            "sent by user {}, not this one's {my_uid}",
            sender.uid
        ));
    }
    if sender.pid == 0 {
        return Err("sent by a process this pid namespace cannot see".into());
    }
    match seen {
        Some(seen) if seen == *asked => Ok(()),
        Some(seen) => Err(format!(
            "sent by process {} (pid {} of namespace {}), not by process {} of namespace {} that \
             was asked",
            sender.pid, seen.pid, seen.pid_ns, asked.pid, asked.pid_ns
        )),
        // No /proc to look through: only a process of this namespace can be told by its pid.
        None if asked.pid_ns == me.pid_ns && sender.pid == asked.pid => Ok(()),
        None => Err(format!(
            "sent by process {}, which cannot be told to be process {} of namespace {} that was \
             asked",
            sender.pid, asked.pid, asked.pid_ns
        )),
    }
}

/// An answer's bytes once checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counted {
    /// What counts.
    pub bytes: u64,
    /// Why it is refused outright (to record), or `None`.
    pub refused: Option<String>,
    /// Why less than claimed counts (may be empty).
    pub note: String,
}

/// What an answer claiming `claimed` bytes for `asked` counts on a device of `total` bytes,
/// given the answerer's holding before the request and after its answer (`None`: its entry
/// could not be read then).
pub fn counted(
    asked: Asked,
    claimed: u64,
    before: Holding,
    after: Option<Holding>,
    total: u64,
) -> Counted {
    if claimed > total {
        return Counted {
            bytes: 0,
            refused: Some(format!(
                "claims {claimed} bytes given, more than the device's {total}"
            )),
            note: String::new(),
        };
    }
    let Some(after) = after else {
        return Counted {
            bytes: 0,
            refused: None,
            note: format!("claims {claimed} bytes, but its entry could not be read to show it"),
        };
    };
    let dropped = before.held().saturating_sub(after.held());
    let shown = match asked {
        Asked::Give => dropped,
        Asked::Sleep => dropped.min(
            before
                .cached
                .saturating_sub(after.cached)
                .saturating_add(after.asleep.saturating_sub(before.asleep)),
        ),
    }
    .min(total);
    Counted {
        bytes: claimed.min(shown),
        refused: None,
        note: if claimed > shown {
            format!("claims {claimed} bytes, its entry shows {shown}")
        } else {
            String::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ME: Identity = Identity::new(10, 1, 100);
    const PEER: Identity = Identity::new(11, 1, 200);

    fn creds(pid: u32) -> Option<Credentials> {
        Some(Credentials { pid, uid: 7 })
    }

    #[test]
    fn only_the_process_asked_is_believed() {
        assert!(sender(&PEER, &ME, 7, creds(11), Some(PEER)).is_ok());
        let why = sender(&PEER, &ME, 7, creds(12), Some(Identity { pid: 12, ..PEER })).unwrap_err();
        assert!(why.contains("not by process 11"), "{why}");
        let reused = Identity {
            started: 201,
            ..PEER
        };
        assert!(
            sender(&PEER, &ME, 7, creds(11), Some(reused)).is_err(),
            "pid reused"
        );
        assert!(sender(&PEER, &ME, 7, None, Some(PEER)).is_err());
        assert!(
            sender(&PEER, &ME, 8, creds(11), Some(PEER)).is_err(),
            "another user"
        );
        assert!(sender(&PEER, &ME, 7, creds(0), None).is_err(), "invisible");
        // Without /proc: the pid alone, in this namespace only.
        assert!(sender(&PEER, &ME, 7, creds(11), None).is_ok());
        assert!(sender(&PEER, &ME, 7, creds(12), None).is_err());
        let elsewhere = Identity { pid_ns: 2, ..PEER };
        assert!(sender(&elsewhere, &ME, 7, creds(11), None).is_err());
        // Another namespace seen through /proc: its own pid there, its namespace, its start.
        let inner = Identity {
            pid: 1,
            pid_ns: 2,
            started: 300,
        };
        assert!(sender(&inner, &ME, 7, creds(5000), Some(inner)).is_ok());
    }

    #[test]
    fn an_answer_counts_what_the_entry_shows() {
        let before = Holding {
            live: 100,
            cached: 50,
            asleep: 0,
        };
        let trimmed = Holding {
            cached: 0,
            ..before
        };
        assert_eq!(
            counted(Asked::Give, 50, before, Some(trimmed), 1000).bytes,
            50
        );
        let c = counted(Asked::Give, 80, before, Some(trimmed), 1000);
        assert_eq!((c.bytes, c.refused.is_none()), (50, true));
        assert!(c.note.contains("shows 50"), "{}", c.note);
        assert_eq!(
            counted(Asked::Give, 50, before, Some(before), 1000).bytes,
            0,
            "no drop"
        );
        assert_eq!(
            counted(Asked::Give, 50, before, None, 1000).bytes,
            0,
            "no entry"
        );
        let c = counted(Asked::Give, u64::MAX, before, Some(trimmed), 1000);
        assert_eq!(c.bytes, 0);
        assert!(c.refused.unwrap().contains("more than the device"));
        // A sleep: what left the cache or went asleep.
        let asleep = Holding {
            live: 0,
            cached: 0,
            asleep: 100,
        };
        assert_eq!(
            counted(Asked::Sleep, 150, before, Some(asleep), 1000).bytes,
            150
        );
        let vanished = Holding::default();
        assert_eq!(
            counted(Asked::Sleep, 150, before, Some(vanished), 1000).bytes,
            50,
            "live bytes that went nowhere were not slept: only the trim counts"
        );
    }

    proptest! {
        /// Whatever is claimed and whatever the entries show, what counts is within the claim,
        /// the drop and the device.
        #[test]
        fn nothing_counts_beyond_the_claim_the_drop_or_the_device(
            claimed in any::<u64>(),
            before in (any::<u64>(), any::<u64>(), any::<u64>()),
            after in proptest::option::of((any::<u64>(), any::<u64>(), any::<u64>())),
            total in any::<u64>(),
            sleep in any::<bool>(),
        ) {
            let holding = |(live, cached, asleep)| Holding { live, cached, asleep };
            let before = holding(before);
            let after = after.map(holding);
            let asked = if sleep { Asked::Sleep } else { Asked::Give };
            let c = counted(asked, claimed, before, after, total);
            prop_assert!(c.bytes <= claimed && c.bytes <= total);
            let drop = after.map_or(0, |a| before.held().saturating_sub(a.held()));
            prop_assert!(c.bytes <= drop);
            prop_assert_eq!(c.refused.is_some(), claimed > total);
        }
    }
}
