//! The ledger's directory: one per device, only its user may write it; in it each process's
//! entry (`<pid>-<pid namespace>.json`, written whole by a rename) and its socket
//! (`<pid>-<pid namespace>.sock`): processes of different pid namespaces (containers sharing
//! `/dev/shm`) never share a name.
//!
//! Nothing here is trusted blindly: a directory another user owns or can write is refused when
//! a process joins; an entry that is not a regular file of this user, too big or out of shape is
//! left out of the listing, which says why. An entry is removed only by a member that sees its
//! process die ([`process::fate`]); one whose process cannot be seen from here (another pid
//! namespace) counts until it is [`STALE_AFTER`] old, then is listed as stale, never removed.
//! A reader that only reads ([`LedgerDir::read`], `rrmm info`) removes nothing.

use super::entry::{Entry, Refused, MAX_ENTRY_BYTES};
use super::process::{self, Fate, Identity};
use crate::error::{Error, Result};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The directory of ledgers when `RRMM_LEDGER_DIR` does not name one: in shared memory where
/// the machine has it (no disk writes), per user.
pub fn default_base() -> PathBuf {
    if let Some(dir) = std::env::var_os("RRMM_LEDGER_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let uid = rustix::process::getuid().as_raw();
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    root.join(format!("rrmm-ledger-{uid}"))
}

/// Whether `key` can name a device's directory: 1 to 64 of `[A-Za-z0-9._-]`, not `.` or `..`.
pub fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= 64
        && key != "."
        && key != ".."
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// How long an entry whose process cannot be seen from here (another pid namespace) counts
/// without being written again (seconds): a member writes its entry every quarter second.
pub const STALE_AFTER: f64 = 60.0;

/// The ledger directory of one device.
#[derive(Debug, Clone)]
pub struct LedgerDir {
    path: PathBuf,
    uid: u32,
    /// This process, the reader.
    reader: Identity,
    /// Where the sockets are when the directory's own path is too long for one (a socket's
    /// path has at most 107 bytes): a short directory of this user's, with a name per ledger.
    sockets: Option<(PathBuf, u64)>,
}

/// The longest socket path this code makes (the kernel's limit is 107 bytes and a NUL).
const MAX_SOCKET_PATH: usize = 100;

/// The longest name of a shared-memory exporter: `<name>.share` is no longer than the longest
/// process socket's name, whose fit the directory checks.
pub const MAX_EXPORTER_NAME: usize = 30;

/// FNV-1a of `bytes`: the same in every process (a ledger's short socket names).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The ledger as one read found it.
#[derive(Debug, Default)]
pub struct Listing {
    /// The entries of live processes (and of processes this reader cannot see, while fresh).
    pub entries: Vec<Entry>,
    /// Entries of processes this reader cannot see (another pid namespace) not written for
    /// [`STALE_AFTER`]: left out of every figure, never removed from here.
    pub stale: Vec<Entry>,
    /// Files left out, and why.
    pub refused: Vec<(String, String)>,
}

/// The process named by an entry's file name, `<pid>-<pid namespace>.json`.
fn named(name: &str) -> Option<(u32, u64)> {
    let (pid, ns) = name.strip_suffix(".json")?.split_once('-')?;
    Some((pid.parse().ok()?, ns.parse().ok()?))
}

/// Checks, without making anything, that `base` can hold ledgers: a directory of this user's
/// that nobody else can write, or one that can be made (its parent is a directory).
///
/// # Errors
/// As [`LedgerDir::open`].
pub fn check_base(base: &Path) -> Result<()> {
    let uid = rustix::process::getuid().as_raw();
    match fs::symlink_metadata(base) {
        Ok(_) => check_dir(base, uid),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = base
                .parent()
                .filter(|p| !p.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if parent.is_dir() {
                Ok(())
            } else {
                Err(refuse(
                    base,
                    "it does not exist and cannot be made (no parent directory)",
                ))
            }
        }
        Err(e) => Err(refuse(base, e)),
    }
}

fn refuse(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Logic(format!(
        "shared GPU ledger: {} refused: {why} (set RRMM_LEDGER_DIR to a directory only you can \
         write)",
        path.display()
    ))
}

/// Checks that `path` is a directory (not a link) of user `uid` that nobody else can write.
fn check_dir(path: &Path, uid: u32) -> Result<()> {
    let meta = fs::symlink_metadata(path).map_err(|e| refuse(path, e))?;
    if meta.file_type().is_symlink() {
        return Err(refuse(path, "it is a symbolic link"));
    }
    if !meta.is_dir() {
        return Err(refuse(path, "it is not a directory"));
    }
    if meta.uid() != uid {
        return Err(refuse(
            path,
            format!(
                "it belongs to user {}, not to this process's user {uid}",
                meta.uid()
            ),
        ));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(refuse(
            path,
            format!("other users can write it (mode {mode:#o})"),
        ));
    }
    Ok(())
}

fn make_dir(path: &Path) -> Result<()> {
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(refuse(path, e)),
    }
}

impl LedgerDir {
    /// The directory of device `key` under `base` (made, only its user may write it).
    ///
    /// # Errors
    /// [`Error::Logic`] saying why: a key that cannot name a directory, a directory that is a
    /// link, another user's, or writable by others, or one that cannot be made.
    pub fn open(base: &Path, key: &str) -> Result<LedgerDir> {
        if !valid_key(key) {
            return Err(Error::invalid(
                "device_key",
                format!("{key:?} cannot name a ledger: use 1 to 64 of A-Z a-z 0-9 . _ -"),
            ));
        }
        let uid = rustix::process::getuid().as_raw();
        make_dir(base)?;
        check_dir(base, uid)?;
        let path = base.join(key);
        make_dir(&path)?;
        LedgerDir::at(path, uid, true)
    }

    /// A ledger directory that exists already (read it without joining: `rrmm info`).
    ///
    /// # Errors
    /// As [`LedgerDir::open`], for the directory itself.
    pub fn existing(path: &Path) -> Result<LedgerDir> {
        LedgerDir::at(
            path.to_path_buf(),
            rustix::process::getuid().as_raw(),
            false,
        )
    }

    /// The directory at `path` once checked; where its sockets' paths would be too long for
    /// one, a short directory of user `uid`'s under the temporary directory (made when
    /// `make_short`).
    fn at(path: PathBuf, uid: u32, make_short: bool) -> Result<LedgerDir> {
        check_dir(&path, uid)?;
        // The most digits a process id and a namespace's inode have.
        let longest = path.join(format!("{}-{}.sock", u32::MAX, u64::MAX));
        let sockets = if longest.as_os_str().len() <= MAX_SOCKET_PATH {
            None
        } else {
            let short = std::env::temp_dir().join(format!("rrmm-sockets-{uid}"));
            if make_short {
                make_dir(&short)?;
                check_dir(&short, uid)?;
            }
            let tag = fnv1a(path.as_os_str().as_encoded_bytes());
            if short
                .join(format!("{tag:016x}-{}-{}.sock", u32::MAX, u64::MAX))
                .as_os_str()
                .len()
                > MAX_SOCKET_PATH
            {
                return Err(refuse(
                    &short,
                    "the temporary directory's path is too long for a socket",
                ));
            }
            Some((short, tag))
        };
        Ok(LedgerDir {
            path,
            uid,
            reader: process::this_process(),
            sockets,
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry file of process `pid` of pid namespace `pid_ns`.
    pub fn entry_path(&self, pid: u32, pid_ns: u64) -> PathBuf {
        self.path.join(format!("{pid}-{pid_ns}.json"))
    }

    /// The socket of process `pid` of pid namespace `pid_ns`: in the directory, or where its
    /// path would be too long, in a short directory of this user's under the temporary
    /// directory, named by the ledger and the process.
    pub fn socket_path(&self, pid: u32, pid_ns: u64) -> PathBuf {
        match &self.sockets {
            None => self.path.join(format!("{pid}-{pid_ns}.sock")),
            Some((short, tag)) => short.join(format!("{tag:016x}-{pid}-{pid_ns}.sock")),
        }
    }

    /// The socket of the shared-memory exporter named `name` ([`crate::shared_memory`]): beside
    /// the process sockets, `<name>.share` (in the short directory where theirs are).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name that is not 1 to [`MAX_EXPORTER_NAME`] of
    /// `[A-Za-z0-9._-]` (a longer one would not fit a socket's path).
    pub fn share_path(&self, name: &str) -> Result<PathBuf> {
        if !valid_key(name) || name.len() > MAX_EXPORTER_NAME {
            return Err(Error::invalid(
                "name",
                format!(
                    "{name:?} cannot name an exporter: use 1 to {MAX_EXPORTER_NAME} of A-Z a-z \
                     0-9 . _ -"
                ),
            ));
        }
        Ok(match &self.sockets {
            None => self.path.join(format!("{name}.share")),
            Some((short, tag)) => short.join(format!("{tag:016x}-{name}.share")),
        })
    }

    /// Writes `entry` whole (a temporary file renamed over the old one).
    ///
    /// # Errors
    /// The I/O error.
    pub fn write(&self, entry: &Entry) -> std::io::Result<()> {
        let tmp = self
            .path
            .join(format!(".{}-{}.json.tmp", entry.pid(), entry.pid_ns));
        let text = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        let _ = fs::remove_file(&tmp);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&text)?;
        drop(file);
        fs::rename(&tmp, self.entry_path(entry.pid(), entry.pid_ns))
    }

    /// Removes the entry and socket of process `pid` of pid namespace `pid_ns`.
    pub fn remove(&self, pid: u32, pid_ns: u64) {
        let _ = fs::remove_file(self.entry_path(pid, pid_ns));
        let _ = fs::remove_file(self.socket_path(pid, pid_ns));
    }

    /// The entry of process `pid` of pid namespace `pid_ns` now, checked against a device of
    /// `total` bytes.
    ///
    /// # Errors
    /// [`Refused`] saying why it was not read.
    pub fn entry_of(
        &self,
        pid: u32,
        pid_ns: u64,
        total: u64,
    ) -> std::result::Result<Entry, Refused> {
        self.read_entry(&self.entry_path(pid, pid_ns), pid, pid_ns, Some(total))
    }

    /// Reads one entry file, refusing what is not a regular file of this user within the size.
    fn read_entry(
        &self,
        path: &Path,
        pid: u32,
        pid_ns: u64,
        total: Option<u64>,
    ) -> std::result::Result<Entry, Refused> {
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Refused(format!("cannot be opened ({e})")))?;
        let meta = file
            .metadata()
            .map_err(|e| Refused(format!("cannot be read ({e})")))?;
        if !meta.is_file() {
            return Err(Refused("not a regular file".into()));
        }
        if meta.uid() != self.uid {
            return Err(Refused(format!("belongs to user {}", meta.uid())));
        }
        if meta.len() > MAX_ENTRY_BYTES {
            return Err(Refused(format!(
                "{} bytes (an entry has at most {MAX_ENTRY_BYTES})",
                meta.len()
            )));
        }
        let mut text = String::new();
        file.take(MAX_ENTRY_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| Refused(format!("not text ({e})")))?;
        Entry::parse(&text, pid, pid_ns, total)
    }

    /// The ledger as a member reads it, on a device of `total` bytes: every entry of a live
    /// process (see [`Listing`]); the entries of processes it sees dead are removed with their
    /// sockets.
    pub fn list(&self, total: u64) -> Listing {
        self.scan(Some(total), true)
    }

    /// The ledger as a reader that does not join reads it (`rrmm info`): as [`LedgerDir::list`],
    /// each entry checked against `total` (`None`: the device size it names itself), but
    /// nothing is removed; entries of processes seen dead are listed as refused, saying so.
    pub fn read(&self, total: Option<u64>) -> Listing {
        self.scan(total, false)
    }

    fn scan(&self, total: Option<u64>, remove_gone: bool) -> Listing {
        let mut listing = Listing::default();
        let Ok(dir) = fs::read_dir(&self.path) else {
            return listing;
        };
        let proc_ours = process::proc_shows_this_namespace();
        let now = super::entry::now();
        for item in dir.flatten() {
            let name = item.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let Some((pid, pid_ns)) = named(&name) else {
                let why = if name
                    .strip_suffix(".json")
                    .is_some_and(|s| s.parse::<u32>().is_ok())
                {
                    "named as by an older rrmm (ledger version 1, <process id>.json): not read"
                } else {
                    "not named <process id>-<pid namespace>.json"
                };
                listing.refused.push((name, why.into()));
                continue;
            };
            let entry = match self.read_entry(&item.path(), pid, pid_ns, total) {
                Ok(entry) => entry,
                Err(Refused(why)) => {
                    listing.refused.push((name, why));
                    continue;
                }
            };
            match process::fate(
                &entry.identity(),
                &self.reader,
                proc_ours,
                process::process_started,
            ) {
                Fate::Alive => listing.entries.push(entry),
                Fate::Gone if remove_gone => self.remove(entry.pid(), entry.pid_ns),
                Fate::Gone => listing.refused.push((
                    name,
                    format!(
                        "process {} is gone (a member of the ledger removes its entry)",
                        entry.pid()
                    ),
                )),
                Fate::Unseen if entry.age(now) > STALE_AFTER => listing.stale.push(entry),
                Fate::Unseen => listing.entries.push(entry),
            }
        }
        listing.entries.sort_by_key(|e| (e.pid(), e.pid_ns));
        listing.stale.sort_by_key(|e| (e.pid(), e.pid_ns));
        listing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_base(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rrmm-ledger-test-{}-{tag}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn keys_name_only_plain_directories() {
        assert!(valid_key("GPU-0a1b") && valid_key("sim.test_1"));
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_key(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_long_directory_keeps_its_sockets_in_a_short_one() {
        let base = temp_base(&"long".repeat(30));
        let dir = LedgerDir::open(&base, "dev").unwrap();
        let socket = dir.socket_path(u32::MAX, u64::MAX);
        assert!(
            socket.as_os_str().len() <= MAX_SOCKET_PATH,
            "{}",
            socket.display()
        );
        assert_ne!(socket.parent(), Some(dir.path()));
        let other = LedgerDir::open(&base, "other").unwrap();
        assert_ne!(
            other.socket_path(1, 2),
            dir.socket_path(1, 2),
            "one name per ledger"
        );
        let _ = std::os::unix::net::UnixDatagram::bind(&socket).unwrap();
        let _ = fs::remove_file(&socket);
        // An exporter's socket fits too, at the longest name; a longer or odd name is refused.
        let share = dir.share_path(&"e".repeat(MAX_EXPORTER_NAME)).unwrap();
        assert!(
            share.as_os_str().len() <= MAX_SOCKET_PATH,
            "{}",
            share.display()
        );
        assert_eq!(share.parent(), socket.parent());
        assert!(dir.share_path(&"e".repeat(MAX_EXPORTER_NAME + 1)).is_err());
        assert!(dir.share_path("../x").is_err());
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn a_directory_others_can_write_or_a_link_is_refused() {
        let base = temp_base("mode");
        let dir = LedgerDir::open(&base, "dev").unwrap();
        assert!(dir.path().is_dir());
        fs::set_permissions(&base, fs::Permissions::from_mode(0o777)).unwrap();
        let e = LedgerDir::open(&base, "dev").unwrap_err().to_string();
        assert!(e.contains("other users can write"), "{e}");
        fs::set_permissions(&base, fs::Permissions::from_mode(0o700)).unwrap();
        let link = temp_base("link");
        std::os::unix::fs::symlink(&base, &link).unwrap();
        let e = LedgerDir::open(&link, "dev").unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let _ = fs::remove_file(&link);
        let _ = fs::remove_dir_all(&base);
    }

    fn entry_of(me: Identity) -> Entry {
        let mut e = Entry {
            name: "me".into(),
            ..Entry::of(me, 1000)
        };
        (e.holder.live, e.holder.cached) = (1, 2);
        e
    }

    #[test]
    fn hostile_files_are_listed_as_refused_and_dead_entries_removed() {
        let base = temp_base("files");
        let dir = LedgerDir::open(&base, "dev").unwrap();
        let me = entry_of(process::this_process());
        dir.write(&me).unwrap();
        // A dead process (started at another time).
        let mut dead = me.clone();
        dead.holder.pid = 1;
        dead.started = 0;
        dir.write(&dead).unwrap();
        let ns = me.pid_ns;
        fs::write(dir.path().join(format!("77-{ns}.json")), b"{garbage").unwrap();
        fs::write(dir.path().join(format!("78-{ns}.json")), vec![b' '; 70_000]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join(format!("79-{ns}.json")))
            .unwrap();
        fs::write(dir.path().join("notes.json"), b"{}").unwrap();
        fs::write(dir.path().join("80.json"), b"{}").unwrap();
        // What `rrmm info` reads: nothing removed, the dead one said to be gone.
        let read = dir.read(Some(1000));
        assert_eq!(read.entries, vec![me.clone()]);
        assert!(read
            .refused
            .iter()
            .any(|(n, w)| n == &format!("1-{ns}.json") && w.contains("gone")));
        assert!(
            dir.entry_path(1, ns).exists(),
            "a reader that does not join removes nothing"
        );
        let listing = dir.list(1000);
        assert_eq!(listing.entries, vec![me]);
        let why = |name: &str| {
            listing
                .refused
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, w)| w.clone())
                .unwrap_or_default()
        };
        assert!(why(&format!("77-{ns}.json")).contains("not a ledger entry"));
        assert!(why(&format!("78-{ns}.json")).contains("at most"));
        assert!(why(&format!("79-{ns}.json")).contains("cannot be opened"));
        assert!(why("notes.json").contains("not named"));
        assert!(why("80.json").contains("older rrmm"));
        assert!(
            !dir.entry_path(1, ns).exists(),
            "the dead process's entry is removed"
        );
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn another_namespace_counts_while_fresh_then_is_stale_and_never_removed() {
        let base = temp_base("namespaces");
        let dir = LedgerDir::open(&base, "dev").unwrap();
        let me = process::this_process();
        // Process 1 of another namespace: here process 1 is another process (init), which
        // would have made it look dead.
        let mut fresh = entry_of(Identity {
            pid: 1,
            pid_ns: me.pid_ns + 1,
            started: 5,
        });
        let mut old = entry_of(Identity {
            pid: 2,
            pid_ns: me.pid_ns + 1,
            started: 5,
        });
        old.updated -= STALE_AFTER + 1.0;
        dir.write(&fresh).unwrap();
        dir.write(&old).unwrap();
        let listing = dir.list(1000);
        assert_eq!(listing.entries, vec![fresh.clone()]);
        assert_eq!(listing.stale, vec![old.clone()]);
        assert!(dir.entry_path(1, fresh.pid_ns).exists() && dir.entry_path(2, old.pid_ns).exists());
        fresh.updated -= STALE_AFTER + 1.0;
        dir.write(&fresh).unwrap();
        assert_eq!(dir.list(1000).stale.len(), 2);
        assert!(
            dir.entry_path(1, fresh.pid_ns).exists(),
            "stale, still never removed"
        );
        let _ = fs::remove_dir_all(&base);
    }

    #[test]
    fn a_base_is_checked_without_being_made() {
        let base = temp_base("check");
        check_base(&base).unwrap();
        assert!(!base.exists(), "nothing made");
        let e = check_base(&base.join("a/b")).unwrap_err().to_string();
        assert!(e.contains("cannot be made"), "{e}");
        LedgerDir::open(&base, "dev").unwrap();
        fs::set_permissions(&base, fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_base(&base).unwrap_err().to_string();
        assert!(e.contains("other users can write"), "{e}");
        let _ = fs::remove_dir_all(&base);
    }
}
