//! One process's entry in a shared GPU's ledger: a small JSON file it alone writes, read by the
//! others and never trusted blindly ([`Entry::parse`] refuses anything out of shape).

use super::process::Identity;
use super::rules::Holder;
use serde::{Deserialize, Serialize};

/// The entry format's version (2: the writer's pid namespace, in the entry and in its file's
/// name; 3: what it holds as one object, the share rules' [`Holder`]).
pub const VERSION: u32 = 3;
/// The largest entry file read (bytes): a bigger one is refused unread.
pub const MAX_ENTRY_BYTES: u64 = 64 * 1024;
/// The most history events an entry carries (the newest).
pub const HISTORY_IN_ENTRY: usize = 32;
/// The longest process name kept.
pub const MAX_NAME: usize = 64;

/// Seconds since the Unix epoch now (an entry's `updated`, an event's `at`).
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What happened between processes, as one of them records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub at: f64,
    /// `"asked"` (this process asked others), `"gave"` (it trimmed for another), `"slept"`,
    /// `"woke"`, `"refused"` (an allocation refused after asking, or an answer not believed:
    /// from another process than the one asked, to a request never made, beyond the device),
    /// `"declined"` (a request it did not follow, with why: busy, not idle, within its share).
    pub kind: String,
    /// The other process (0 when none).
    pub peer: u32,
    /// Bytes asked for.
    pub bytes: u64,
    /// Bytes given back (trims) or moved to the host (sleeps).
    pub given: u64,
    /// Seconds from the request to the answer.
    pub seconds: f64,
    /// Why, in words (may be empty).
    pub note: String,
}

/// One process on the GPU (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// [`VERSION`].
    pub version: u32,
    /// Its process id in its pid namespace (the file's name), what it holds and asked for, as
    /// the share rules read them.
    pub holder: Holder,
    /// Its pid namespace (the inode of `/proc/self/ns/pid`; the file's name).
    pub pid_ns: u64,
    /// When it started (clock ticks since boot, `/proc/<pid>/stat`): a process that died and
    /// whose id was reused is told apart by it.
    pub started: u64,
    /// A name for people (the program, a Dask worker's name).
    pub name: String,
    /// The device's bytes, as this process sees them.
    pub total: u64,
    /// Where the hard limit comes from: `"user"`, `"mps"` (the MPS pinned memory limit), or
    /// empty.
    pub hard_limit_from: String,
    /// Bytes it is waiting for now (0 when none).
    pub waiting: u64,
    /// When it last wrote the entry (seconds since the Unix epoch).
    pub updated: f64,
    /// Its newest events (at most [`HISTORY_IN_ENTRY`]).
    pub history: Vec<Event>,
}

/// Why an entry was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused(pub String);

impl Entry {
    /// The entry in `text`, read from the file of process `pid` of pid namespace `pid_ns`, on a
    /// device of `total` bytes.
    ///
    /// # Errors
    /// [`Refused`] saying why: not JSON of this shape, another version, another process's id
    /// or namespace, figures beyond the device, a name with control characters, too much
    /// history. `total: None` checks the entry against the device size it names itself (a
    /// reader that does not know the device, such as `rrmm info`).
    pub fn parse(text: &str, pid: u32, pid_ns: u64, total: Option<u64>) -> Result<Entry, Refused> {
        /// The version alone, read first: an entry of another version may have other fields.
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let not_entry = |e: serde_json::Error| Refused(format!("not a ledger entry: {e}"));
        let Versioned { version } = serde_json::from_str(text).map_err(not_entry)?;
        if version != VERSION {
            return Err(Refused(format!(
                "version {version} (this rrmm reads version {VERSION})"
            )));
        }
        let entry: Entry = serde_json::from_str(text).map_err(not_entry)?;
        entry.check(pid, pid_ns, total.unwrap_or(entry.total))?;
        Ok(entry)
    }

    /// Its process id in its pid namespace (the file's name).
    pub fn pid(&self) -> u32 {
        self.holder.pid
    }

    /// The process it names.
    pub fn identity(&self) -> Identity {
        Identity {
            pid: self.pid(),
            pid_ns: self.pid_ns,
            started: self.started,
        }
    }

    /// Seconds since it was written, at `now` (seconds since the Unix epoch); 0 for an entry
    /// from the future (another clock).
    pub fn age(&self, now: f64) -> f64 {
        (now - self.updated).max(0.0)
    }

    fn check(&self, pid: u32, pid_ns: u64, total: u64) -> Result<(), Refused> {
        let refuse = |why: String| Err(Refused(why));
        let holder = &self.holder;
        if holder.pid != pid || pid == 0 || self.pid_ns != pid_ns {
            return refuse(format!(
                "the entry names process {} of pid namespace {} but is the file of process \
                 {pid} of {pid_ns}",
                holder.pid, self.pid_ns
            ));
        }
        if self.total != total {
            return refuse(format!(
                "a device of {} bytes, not this one's {total}",
                self.total
            ));
        }
        // Live and cached memory of the device, and data asleep on the host: at most the
        // device each (memory of the device), the host copy at most 64 times it.
        for (field, value, bound) in [
            ("live", holder.live, total),
            ("cached", holder.cached, total),
            ("waiting", self.waiting, total),
            ("asleep", holder.asleep, total.saturating_mul(64)),
        ] {
            if value > bound {
                return refuse(format!("{field} = {value} bytes, beyond {bound}"));
            }
        }
        if holder.held() > total {
            return refuse(format!(
                "live + cached = {} bytes, beyond the device's {total}",
                holder.held()
            ));
        }
        if self.name.chars().count() > MAX_NAME || self.name.chars().any(char::is_control) {
            return refuse("a name longer than 64 characters or with control characters".into());
        }
        if self.history.len() > HISTORY_IN_ENTRY {
            return refuse(format!(
                "{} history events (at most {HISTORY_IN_ENTRY})",
                self.history.len()
            ));
        }
        if !self.updated.is_finite() || self.updated < 0.0 {
            return refuse(format!("updated = {}", self.updated));
        }
        Ok(())
    }
}

#[cfg(test)]
impl Entry {
    /// An entry of process `who` on a device of `total` bytes holding nothing, written now
    /// (tests; a whole second, which JSON reads back exactly).
    pub(crate) fn of(who: Identity, total: u64) -> Entry {
        Entry {
            version: VERSION,
            holder: Holder {
                pid: who.pid,
                ..Holder::default()
            },
            pid_ns: who.pid_ns,
            started: who.started,
            name: "test".into(),
            total,
            hard_limit_from: String::new(),
            waiting: 0,
            updated: now().round(),
            history: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entry() -> Entry {
        let who = Identity {
            pid: 42,
            pid_ns: 9,
            started: 7,
        };
        let mut e = Entry {
            name: "worker".into(),
            hard_limit_from: "user".into(),
            updated: 1.0,
            ..Entry::of(who, 1000)
        };
        e.holder = Holder {
            live: 300,
            cached: 100,
            hard_limit: Some(900),
            ..e.holder
        };
        e
    }

    #[test]
    fn an_entry_reads_back_and_a_bad_one_says_why() {
        let e = entry();
        let text = serde_json::to_string(&e).unwrap();
        assert_eq!(Entry::parse(&text, 42, 9, Some(1000)).unwrap(), e);
        let why = |text: &str, pid, total| Entry::parse(text, pid, 9, Some(total)).unwrap_err().0;
        assert!(why(&text, 43, 1000).contains("process 42"));
        let other_ns = Entry::parse(&text, 42, 10, Some(1000)).unwrap_err().0;
        assert!(other_ns.contains("namespace 9"), "{other_ns}");
        assert!(why(&text, 42, 999).contains("device"));
        assert!(why("{", 42, 1000).contains("not a ledger entry"));
        let mut big = e.clone();
        big.holder.live = 2000;
        assert!(why(&serde_json::to_string(&big).unwrap(), 42, 1000).contains("live"));
        let extra = text.replacen('{', "{\"owner\":\"root\",", 1);
        assert!(why(&extra, 42, 1000).contains("unknown field"));
        let older = text.replacen("\"version\":3", "\"version\":2", 1);
        assert!(why(&older, 42, 1000).contains("version 2 (this rrmm reads version 3)"));
        let extra_held = text.replacen("\"holder\":{", "\"holder\":{\"owner\":\"root\",", 1);
        assert!(why(&extra_held, 42, 1000).contains("unknown field"));
    }

    proptest! {
        /// Any text, any bytes: parsed or refused, never a panic; what is accepted is within
        /// the device.
        #[test]
        fn any_text_is_parsed_or_refused(text in ".{0,300}", pid in 1u32..100) {
            if let Ok(e) = Entry::parse(&text, pid, 9, Some(1000)) {
                prop_assert!(e.holder.live + e.holder.cached <= 1000);
            }
        }

        #[test]
        fn any_figures_are_checked(live in any::<u64>(), cached in any::<u64>(), asleep in any::<u64>()) {
            let mut e = entry();
            e.holder.live = live;
            e.holder.cached = cached;
            e.holder.asleep = asleep;
            let text = serde_json::to_string(&e).unwrap();
            let ok = live.checked_add(cached).is_some_and(|s| s <= 1000) && asleep <= 64_000;
            prop_assert_eq!(Entry::parse(&text, 42, 9, Some(1000)).is_ok(), ok);
        }
    }
}
