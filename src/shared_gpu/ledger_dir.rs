//! The ledger's directory: one per device, only its user may write it; in it each process's
//! entry (`<pid>.json`, written whole by a rename) and its socket (`<pid>.sock`).
//!
//! Nothing here is trusted blindly: a directory another user owns or can write is refused when
//! a process joins; an entry that is not a regular file of this user, too big, out of shape or
//! of a process that is gone is left out of the listing (the dead ones are removed), and the
//! listing says why.

use super::entry::{Entry, Refused, MAX_ENTRY_BYTES};
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

/// The ledger directory of one device.
#[derive(Debug, Clone)]
pub struct LedgerDir {
    path: PathBuf,
    uid: u32,
    /// Where the sockets are when the directory's own path is too long for one (a socket's
    /// path has at most 107 bytes): a short directory of this user's, with a name per ledger.
    sockets: Option<(PathBuf, u64)>,
}

/// The longest socket path this code makes (the kernel's limit is 107 bytes and a NUL).
const MAX_SOCKET_PATH: usize = 100;

/// FNV-1a of `bytes`: the same in every process (a ledger's short socket names).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The ledger as one read found it.
#[derive(Debug, Default)]
pub struct Listing {
    /// The entries of live processes.
    pub entries: Vec<Entry>,
    /// Files left out, and why.
    pub refused: Vec<(String, String)>,
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

/// When process `pid` started (clock ticks since boot), or `None` when it is gone or `/proc`
/// does not say.
pub fn process_started(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: the fields after it follow the last
    // ')'; the start time is field 22, the 20th after the name.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process of `entry` still runs (and is the same process). Without `/proc` every
/// entry is taken as alive (a dead process's socket then refuses its messages).
fn alive(entry: &Entry) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return true;
    }
    process_started(entry.pid) == Some(entry.started)
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
        // u32::MAX has the most digits a process id has.
        let longest = path.join(format!("{}.sock", u32::MAX));
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
                .join(format!("{tag:016x}-{}.sock", u32::MAX))
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
        Ok(LedgerDir { path, uid, sockets })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The entry file of `pid`.
    pub fn entry_path(&self, pid: u32) -> PathBuf {
        self.path.join(format!("{pid}.json"))
    }

    /// The socket of `pid`: in the directory, or where its path would be too long, in a short
    /// directory of this user's under the temporary directory, named by the ledger and `pid`.
    pub fn socket_path(&self, pid: u32) -> PathBuf {
        match &self.sockets {
            None => self.path.join(format!("{pid}.sock")),
            Some((short, tag)) => short.join(format!("{tag:016x}-{pid}.sock")),
        }
    }

    /// Writes `entry` whole (a temporary file renamed over the old one).
    ///
    /// # Errors
    /// The I/O error.
    pub fn write(&self, entry: &Entry) -> std::io::Result<()> {
        let tmp = self.path.join(format!(".{}.json.tmp", entry.pid));
        let text = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        let _ = fs::remove_file(&tmp);
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(&text)?;
        drop(file);
        fs::rename(&tmp, self.entry_path(entry.pid))
    }

    /// Removes the entry and socket of `pid`.
    pub fn remove(&self, pid: u32) {
        let _ = fs::remove_file(self.entry_path(pid));
        let _ = fs::remove_file(self.socket_path(pid));
    }

    /// Reads one entry file, refusing what is not a regular file of this user within the size.
    fn read_entry(
        &self,
        path: &Path,
        pid: u32,
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
        Entry::parse(&text, pid, total)
    }

    /// Every entry of a live process on a device of `total` bytes (`None`: each entry's own
    /// figure, for a reader that does not know the device); dead processes' files are removed,
    /// and files that are not entries are listed as refused.
    pub fn list(&self, total: Option<u64>) -> Listing {
        let mut listing = Listing::default();
        let Ok(dir) = fs::read_dir(&self.path) else {
            return listing;
        };
        for item in dir.flatten() {
            let name = item.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let Ok(pid) = stem.parse::<u32>() else {
                if !name.starts_with('.') {
                    listing
                        .refused
                        .push((name, "not named <process id>.json".into()));
                }
                continue;
            };
            match self.read_entry(&item.path(), pid, total) {
                Ok(entry) if alive(&entry) => listing.entries.push(entry),
                Ok(entry) => self.remove(entry.pid),
                Err(Refused(why)) => listing.refused.push((name, why)),
            }
        }
        listing.entries.sort_by_key(|e| e.pid);
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
    fn this_process_started_and_a_made_up_one_did_not() {
        assert!(process_started(std::process::id()).is_some());
        assert!(process_started(u32::MAX - 7).is_none());
    }

    #[test]
    fn a_long_directory_keeps_its_sockets_in_a_short_one() {
        let base = temp_base(&"long".repeat(30));
        let dir = LedgerDir::open(&base, "dev").unwrap();
        let socket = dir.socket_path(u32::MAX);
        assert!(
            socket.as_os_str().len() <= MAX_SOCKET_PATH,
            "{}",
            socket.display()
        );
        assert_ne!(socket.parent(), Some(dir.path()));
        let other = LedgerDir::open(&base, "other").unwrap();
        assert_ne!(
            other.socket_path(1),
            dir.socket_path(1),
            "one name per ledger"
        );
        let _ = std::os::unix::net::UnixDatagram::bind(&socket).unwrap();
        let _ = fs::remove_file(&socket);
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

    #[test]
    fn hostile_files_are_listed_as_refused_and_dead_entries_removed() {
        let base = temp_base("files");
        let dir = LedgerDir::open(&base, "dev").unwrap();
        let me = Entry {
            version: super::super::entry::VERSION,
            pid: std::process::id(),
            started: process_started(std::process::id()).unwrap(),
            name: "me".into(),
            total: 1000,
            live: 1,
            cached: 2,
            soft_share: None,
            hard_limit: None,
            hard_limit_from: String::new(),
            idle: false,
            asleep: 0,
            waiting: 0,
            updated: 0.0,
            history: Vec::new(),
        };
        dir.write(&me).unwrap();
        // A dead process (started at another time).
        let mut dead = me.clone();
        dead.pid = 1;
        dead.started = 0;
        dir.write(&dead).unwrap();
        fs::write(dir.path().join("77.json"), b"{garbage").unwrap();
        fs::write(dir.path().join("78.json"), vec![b' '; 70_000]).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("79.json")).unwrap();
        fs::write(dir.path().join("notes.json"), b"{}").unwrap();
        let listing = dir.list(Some(1000));
        assert_eq!(listing.entries, vec![me]);
        let why = |name: &str| {
            listing
                .refused
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, w)| w.clone())
                .unwrap_or_default()
        };
        assert!(why("77.json").contains("not a ledger entry"));
        assert!(why("78.json").contains("at most"));
        assert!(why("79.json").contains("cannot be opened"));
        assert!(why("notes.json").contains("not named"));
        assert!(
            !dir.entry_path(1).exists(),
            "the dead process's entry is removed"
        );
        let _ = fs::remove_dir_all(&base);
    }
}
