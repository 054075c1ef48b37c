//! Processes as `/proc` shows them: this process's identity in a ledger (its pid, its pid
//! namespace, when it started), another process's as seen from here, and whether the process of
//! an entry can be seen to have died.
//!
//! Processes in containers that share `/dev/shm` may sit in different pid namespaces: the same
//! pid names different processes there, and `/proc` shows only this namespace's (and those
//! below it). So an identity carries its namespace (the inode of `/proc/<pid>/ns/pid`), and a
//! process is judged dead only where this process can see it: same namespace, and a `/proc`
//! that shows this namespace ([`proc_shows_this_namespace`]).

use std::fs;
use std::os::unix::fs::MetadataExt;

/// A process as a ledger names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Identity {
    /// Its process id inside its own pid namespace.
    pub pid: u32,
    /// Its pid namespace (the inode of `/proc/<pid>/ns/pid`; 0 where `/proc` does not say).
    pub pid_ns: u64,
    /// When it started (clock ticks since boot, field 22 of `/proc/<pid>/stat`): a process
    /// that died and whose id was reused is told apart by it.
    pub started: u64,
}

impl Identity {
    /// Process `pid` of pid namespace `pid_ns`, started at `started`.
    pub const fn new(pid: u32, pid_ns: u64, started: u64) -> Identity {
        Identity {
            pid,
            pid_ns,
            started,
        }
    }
}

/// This process (read through `/proc/self`, right in any namespace).
pub fn this_process() -> Identity {
    Identity {
        pid: std::process::id(),
        pid_ns: namespace_of("self").unwrap_or(0),
        started: started_of("self").unwrap_or(0),
    }
}

/// When process `pid` of this namespace started, or `None` when it is gone or `/proc` does
/// not say.
pub fn process_started(pid: u32) -> Option<u64> {
    started_of(&pid.to_string())
}

fn started_of(who: &str) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{who}/stat")).ok()?;
    start_time(&stat)
}

/// The start time in the text of a `/proc/<pid>/stat`: the name (field 2) may hold spaces and
/// parentheses, so the fields after it follow the last ')'; the start time is field 22, the
/// 20th after the name.
fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn namespace_of(who: &str) -> Option<u64> {
    // `stat` follows the magic link to the namespace's own inode.
    fs::metadata(format!("/proc/{who}/ns/pid"))
        .ok()
        .map(|m| m.ino())
}

/// Whether `/proc` shows this process's pid namespace: a process in a namespace of its own
/// that sees its parent's `/proc` (`unshare --pid` without a new mount) cannot tell from it
/// whether a process of its namespace lives.
pub fn proc_shows_this_namespace() -> bool {
    fs::read_link("/proc/self")
        .ok()
        .and_then(|p| p.to_str()?.parse::<u32>().ok())
        == Some(std::process::id())
}

/// Process `pid` of this namespace (as the kernel names a sender to this process) as it names
/// itself: its pid in its own namespace (the last of `NSpid` in `/proc/<pid>/status`), its
/// namespace and its start; `None` when `/proc` does not show it.
pub fn seen_from_here(pid: u32) -> Option<Identity> {
    if pid == 0 || !proc_shows_this_namespace() {
        return None;
    }
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some(Identity {
        pid: innermost_pid(&status).unwrap_or(pid),
        pid_ns: namespace_of(&pid.to_string())?,
        started: process_started(pid)?,
    })
}

/// The pid in the innermost namespace named by the `NSpid:` line of a `/proc/<pid>/status`.
fn innermost_pid(status: &str) -> Option<u32> {
    let line = status.lines().find(|l| l.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// What a reader can say of the process behind an entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// It runs (same namespace, same start time).
    Alive,
    /// It died: same namespace, and `/proc` shows no process of that id and start time.
    Gone,
    /// This reader cannot tell (another namespace, or a `/proc` of another): the entry's age
    /// decides whether it counts.
    Unseen,
}

/// The fate of process `entry` as `reader` sees it, where `proc_ours` says whether `/proc`
/// shows the reader's namespace and `started` reads a start time from it.
pub fn fate(
    entry: &Identity,
    reader: &Identity,
    proc_ours: bool,
    started: impl FnOnce(u32) -> Option<u64>,
) -> Fate {
    if entry.pid_ns != reader.pid_ns || !proc_ours || reader.pid_ns == 0 {
        return Fate::Unseen;
    }
    if started(entry.pid) == Some(entry.started) {
        Fate::Alive
    } else {
        Fate::Gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_seen_as_itself() {
        let me = this_process();
        assert!(me.pid_ns != 0 && me.started != 0);
        assert_eq!(process_started(me.pid), Some(me.started));
        assert!(proc_shows_this_namespace());
        assert_eq!(seen_from_here(me.pid), Some(me));
        assert_eq!(seen_from_here(0), None);
        assert!(process_started(u32::MAX - 7).is_none());
    }

    #[test]
    fn stat_and_status_lines_are_read_whatever_the_name() {
        let stat = "42 (a) b (c)) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 777 19";
        assert_eq!(start_time(stat), Some(777));
        assert_eq!(start_time("42 (x"), None);
        assert_eq!(innermost_pid("Name:\tx\nNSpid:\t8774\t12\t1\n"), Some(1));
        assert_eq!(innermost_pid("Name:\tx\n"), None);
    }

    #[test]
    fn only_a_process_of_this_namespace_seen_through_its_proc_can_be_gone() {
        let (me, peer) = (Identity::new(10, 5, 100), Identity::new(11, 5, 200));
        assert_eq!(fate(&peer, &me, true, |_| Some(200)), Fate::Alive);
        assert_eq!(
            fate(&peer, &me, true, |_| Some(201)),
            Fate::Gone,
            "id reused"
        );
        assert_eq!(fate(&peer, &me, true, |_| None), Fate::Gone);
        assert_eq!(fate(&peer, &me, false, |_| None), Fate::Unseen);
        let elsewhere = Identity { pid_ns: 6, ..peer };
        assert_eq!(fate(&elsewhere, &me, true, |_| None), Fate::Unseen);
        let blind = Identity { pid_ns: 0, ..me };
        assert_eq!(
            fate(&Identity { pid_ns: 0, ..peer }, &blind, true, |_| None),
            Fate::Unseen
        );
    }
}
