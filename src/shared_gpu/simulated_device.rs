//! A simulated device that several processes share by a name, so that they compete for one
//! device's bytes on any machine and the ledger's asks (trims, sleeps) can be watched without a
//! GPU ([`SimulatedMemoryResource::shared`](crate::SimulatedMemoryResource::shared)).
//!
//! Each process keeps its own addresses (as processes on one GPU do); what they share is the
//! capacity: one small table in the ledger's directory of the name (`<ledger base>/shared-<name>/
//! simulated-device`, the directory the processes join, [`ledger_key`]) of the bytes each
//! device instance of each process charges. Every charge is a read-modify-write of the table
//! under an exclusive `flock` ([`crate::os::file_lock`]), so two processes never both take the
//! last bytes. The table is checked as the ledger checks its entries: the directory must be this
//! user's alone ([`LedgerDir::open`]), the file a regular file of this user (never a link) of at
//! most [`MAX_TABLE_BYTES`], each line in shape; a row whose process is seen dead is dropped at
//! the next charge (its bytes return, as a dead process's memory returns to a GPU), a row of
//! another pid namespace counts.
//!
//! # Time Complexity
//! Each charge and each read of the free bytes is a lock, a read and a write of the table: O(rows),
//! a few microseconds; meant for tests and demonstrations of sharing, not for replays.

use super::ledger_dir::{self, LedgerDir};
use super::process::{self, Fate, Identity};
use crate::error::{Error, Result};
use crate::os::file_lock::FileLock;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The largest table read (a row is under 80 bytes: hundreds of processes).
pub const MAX_TABLE_BYTES: u64 = 64 * 1024;

/// The first line of a table, with its version.
const HEADER: &str = "rrmm shared simulated device v1";

/// The file of the table in the ledger's directory.
const FILE_NAME: &str = "simulated-device";

/// The ledger key (the directory) of the shared device called `name`: the processes over it
/// join this ledger.
pub fn ledger_key(name: &str) -> String {
    format!("shared-{name}")
}

/// Whether `name` can name a shared device: 1 to 57 of `[A-Za-z0-9._-]` (its ledger key is a
/// directory's name).
pub fn valid_name(name: &str) -> bool {
    ledger_dir::valid_key(&ledger_key(name)) && !name.is_empty()
}

/// Distinguishes two devices of one name in one process (each has its own row).
// Why process-wide: the instances of this process, across every device it makes.
static INSTANCES: AtomicU64 = AtomicU64::new(1);

/// One row of the table: the bytes one device instance of one process charges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Row {
    who: Identity,
    instance: u64,
    bytes: u64,
}

/// The table: the device's size and every row.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Table {
    size: u64,
    rows: Vec<Row>,
}

impl Table {
    fn parse(text: &str) -> std::result::Result<Option<Table>, String> {
        let mut lines = text.lines();
        let Some(header) = lines.next() else {
            return Ok(None);
        };
        let size = header
            .strip_prefix(HEADER)
            .and_then(|rest| rest.trim().parse::<u64>().ok())
            .ok_or_else(|| format!("its first line is not {HEADER:?} and a size: {header:?}"))?;
        let rows = lines
            .map(|line| {
                let fields: Vec<u64> = line
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|_| format!("a row is not five numbers: {line:?}"))?;
                let [pid, pid_ns, started, instance, bytes] = fields[..] else {
                    return Err(format!("a row is not five numbers: {line:?}"));
                };
                let pid = u32::try_from(pid).map_err(|_| format!("no process id: {line:?}"))?;
                if bytes > size {
                    return Err(format!("a row charges more than the device: {line:?}"));
                }
                Ok(Row {
                    who: Identity::new(pid, pid_ns, started),
                    instance,
                    bytes,
                })
            })
            .collect::<std::result::Result<_, _>>()?;
        Ok(Some(Table { size, rows }))
    }

    fn render(&self) -> String {
        let mut out = format!("{HEADER} {}\n", self.size);
        for r in &self.rows {
            out.push_str(&format!(
                "{} {} {} {} {}\n",
                r.who.pid, r.who.pid_ns, r.who.started, r.instance, r.bytes
            ));
        }
        out
    }
}

/// This process's part of a shared simulated device: its row in the table (see the module
/// docs). Dropping it removes the row.
#[derive(Debug)]
pub struct SharedDevice {
    name: String,
    size: u64,
    path: PathBuf,
    file: File,
    me: Identity,
    instance: u64,
    /// Held around each read-modify-write: `flock` excludes other open files of the table, not
    /// this process's threads on this one.
    updating: parking_lot::Mutex<()>,
}

/// What a charge found when the device had no room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoRoom {
    /// Bytes the other processes (and this process's other devices of the name) charge.
    pub others: u64,
}

impl SharedDevice {
    /// This process's part of the device `name` of `size` bytes, in the ledger base of
    /// `RRMM_LEDGER_DIR` (default `/dev/shm/rrmm-ledger-<uid>`).
    ///
    /// # Errors
    /// As [`SharedDevice::open_in`].
    pub fn open(name: &str, size: usize) -> Result<SharedDevice> {
        Self::open_in(&ledger_dir::default_base(), name, size)
    }

    /// As [`SharedDevice::open`], under `base`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name that cannot name a directory, or a size other than
    /// the one the processes on the device now made it with; [`Error::Logic`] for a directory
    /// or file refused (another user's, writable by others, a link, too big, out of shape).
    pub fn open_in(base: &Path, name: &str, size: usize) -> Result<SharedDevice> {
        if !valid_name(name) {
            return Err(Error::invalid(
                "shared",
                format!("{name:?} cannot name a shared device: use 1 to 57 of A-Z a-z 0-9 . _ -"),
            ));
        }
        let dir = LedgerDir::open(base, &ledger_key(name))?;
        let path = dir.path().join(FILE_NAME);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| refused(&path, format!("cannot be opened ({e})")))?;
        let device = SharedDevice {
            name: name.to_string(),
            size: size as u64,
            path,
            file,
            me: process::this_process(),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            updating: parking_lot::Mutex::new(()),
        };
        device.update(|table| {
            let others = table.rows.iter().any(|r| r.bytes > 0);
            if table.size != device.size && others {
                return Err(Error::invalid(
                    "size",
                    format!(
                        "the shared simulated device {name:?} is {} bytes (as the processes on \
                         it made it), not {size}: give the same size, or another name",
                        table.size
                    ),
                ));
            }
            table.size = device.size;
            Ok(())
        })?;
        Ok(device)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The table's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets this device's charge from `before` to `after` bytes: refused (nothing changes) when
    /// it grows and the device has no room for it beside what the others charge.
    ///
    /// # Errors
    /// `Ok(Err(NoRoom))` when there is no room; `Err` for a table that cannot be read or
    /// written.
    pub fn charge(&self, before: u64, after: u64) -> Result<std::result::Result<(), NoRoom>> {
        self.update(|table| {
            let others = self.others_in(table);
            if after > before && others.saturating_add(after) > table.size {
                return Ok(Err(NoRoom { others }));
            }
            self.set_mine(table, after);
            Ok(Ok(()))
        })
    }

    /// Bytes the others charge now (other processes, and this process's other devices of the
    /// name).
    ///
    /// # Errors
    /// A table that cannot be read or written.
    pub fn others(&self) -> Result<u64> {
        self.update(|table| Ok(self.others_in(table)))
    }

    fn others_in(&self, table: &Table) -> u64 {
        table
            .rows
            .iter()
            .filter(|r| !self.is_mine(r))
            .map(|r| r.bytes)
            .fold(0u64, u64::saturating_add)
    }

    fn is_mine(&self, row: &Row) -> bool {
        row.who == self.me && row.instance == self.instance
    }

    fn set_mine(&self, table: &mut Table, bytes: u64) {
        table.rows.retain(|r| !self.is_mine(r));
        if bytes > 0 {
            table.rows.push(Row {
                who: self.me,
                instance: self.instance,
                bytes,
            });
        }
    }

    /// Reads the table under the lock, drops the rows of processes seen dead, runs `change` on
    /// it and writes it back.
    fn update<T>(&self, change: impl FnOnce(&mut Table) -> Result<T>) -> Result<T> {
        let io = |e: std::io::Error| refused(&self.path, e);
        let _ours = self.updating.lock();
        let _lock = FileLock::exclusive(&self.file).map_err(io)?;
        let meta = self.file.metadata().map_err(io)?;
        if !meta.is_file() || meta.uid() != rustix::process::getuid().as_raw() {
            return Err(refused(&self.path, "not a regular file of this user"));
        }
        if meta.len() > MAX_TABLE_BYTES {
            return Err(refused(
                &self.path,
                format!(
                    "{} bytes (a table has at most {MAX_TABLE_BYTES})",
                    meta.len()
                ),
            ));
        }
        let mut text = String::new();
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        file.take(MAX_TABLE_BYTES)
            .read_to_string(&mut text)
            .map_err(io)?;
        let mut table = Table::parse(&text)
            .map_err(|why| refused(&self.path, why))?
            .unwrap_or(Table {
                size: self.size,
                rows: Vec::new(),
            });
        let proc_ours = process::proc_shows_this_namespace();
        table.rows.retain(|r| {
            process::fate(&r.who, &self.me, proc_ours, process::process_started) != Fate::Gone
        });
        let out = change(&mut table)?;
        let text = table.render();
        file.seek(SeekFrom::Start(0)).map_err(io)?;
        self.file.set_len(0).map_err(io)?;
        file.write_all(text.as_bytes()).map_err(io)?;
        Ok(out)
    }
}

impl Drop for SharedDevice {
    fn drop(&mut self) {
        let _ = self.update(|table| {
            self.set_mine(table, 0);
            Ok(())
        });
    }
}

fn refused(path: &Path, why: impl std::fmt::Display) -> Error {
    Error::Logic(format!(
        "shared simulated device: {} refused: {why}",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("rrmm-shared-sim-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn two_devices_of_one_name_share_its_bytes() {
        let base = base("share");
        let a = SharedDevice::open_in(&base, "t", 1000).unwrap();
        let b = SharedDevice::open_in(&base, "t", 1000).unwrap();
        assert_eq!(a.charge(0, 700).unwrap(), Ok(()));
        assert_eq!(b.charge(0, 400).unwrap(), Err(NoRoom { others: 700 }));
        assert_eq!(b.others().unwrap(), 700);
        assert_eq!(a.charge(700, 500).unwrap(), Ok(()), "a free always passes");
        assert_eq!(b.charge(0, 400).unwrap(), Ok(()));
        drop(a);
        assert_eq!(b.others().unwrap(), 0, "a dropped device's row goes");
        let e = SharedDevice::open_in(&base, "t", 2000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("is 1000 bytes"), "{e}");
        let e = SharedDevice::open_in(&base, "a/b", 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot name a shared device"), "{e}");
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn a_dead_process_row_returns_its_bytes_and_a_bad_table_is_refused() {
        let base = base("dead");
        let a = SharedDevice::open_in(&base, "t", 1000).unwrap();
        let me = process::this_process();
        // A process of this namespace that is not running (its start time is not its pid's).
        let dead = Table {
            size: 1000,
            rows: vec![Row {
                who: Identity::new(me.pid, me.pid_ns, me.started + 1),
                instance: 9,
                bytes: 900,
            }],
        };
        std::fs::write(a.path(), dead.render()).unwrap();
        assert_eq!(a.charge(0, 1000).unwrap(), Ok(()));
        std::fs::write(a.path(), "not a table\n").unwrap();
        let e = a.others().unwrap_err().to_string();
        assert!(e.contains("first line"), "{e}");
        std::fs::write(a.path(), vec![b'x'; MAX_TABLE_BYTES as usize + 1]).unwrap();
        let e = a.others().unwrap_err().to_string();
        assert!(e.contains("at most"), "{e}");
        std::fs::write(a.path(), format!("{HEADER} 1000\n1 2 3\n")).unwrap();
        assert!(a.others().unwrap_err().to_string().contains("five numbers"));
        let _ = std::fs::remove_dir_all(&base);
    }
}
