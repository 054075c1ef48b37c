//! The memory limits the kernel applies to this process through its control groups, read from
//! the files the kernel shows: the room left under each, the least of them counting.
//!
//! Every limit on the path from the process's own group up to the top of the hierarchy applies
//! (a parent's limit counts its children's memory), in both hierarchies a machine may mount:
//!
//! - cgroup v2 (`0::/path` in `/proc/self/cgroup`, a `cgroup2` mount): each group's
//!   `memory.max` and `memory.high` against its `memory.current`; `memory.swap.max` and
//!   `memory.swap.high` against `memory.swap.current`.
//! - cgroup v1 (`N:memory:/path`, a `cgroup` mount whose options name `memory`): each group's
//!   `memory.limit_in_bytes` against `memory.usage_in_bytes`, and `memory.memsw.limit_in_bytes`
//!   (memory and swap together) against `memory.memsw.usage_in_bytes`.
//!
//! The group's directory is the mount point followed by the group's path below the mount's
//! root (`/proc/self/mountinfo`: a container's mount of `/docker/id` shows that group at the
//! mount point); groups above the mount's root are not visible and cannot be read.
//!
//! `memory.high` counts as a limit: past it the kernel reclaims the group's memory and then
//! throttles the allocating task (sleeps of up to seconds per allocation), and pinned memory
//! cannot be reclaimed, so a commit past it stalls the process where one past `memory.max` kills
//! it. Protections (`memory.low`, `memory.min`) and v1's `memory.soft_limit_in_bytes` (a reclaim
//! target under global pressure) limit nothing and are not read. A v1 limit of 2^62 bytes or
//! more is the kernel's "unlimited" (9223372036854771712 with 4 KiB pages).
//!
//! The reader takes the root of the file system as a path, so tests build fake trees of groups
//! in a temporary directory; [`room`] reads the real `/proc` and `/sys`.

#![deny(unsafe_code)]

use std::path::{Path, PathBuf};

/// A v1 limit at or above this is the kernel's "no limit".
const V1_UNLIMITED: usize = 1 << 62;

/// The room under the control groups' limits (the least over every group that limits the
/// process); `None` where no group sets that kind of limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupRoom {
    /// Bytes of memory (RAM) the process may still add: v2 `memory.max` and `memory.high`, v1
    /// `memory.limit_in_bytes`, each less the group's usage.
    pub memory: Option<usize>,
    /// Bytes of swap it may still add: v2 `memory.swap.max` and `memory.swap.high` less
    /// `memory.swap.current`.
    pub swap: Option<usize>,
    /// Bytes of memory and swap together: v1 `memory.memsw.limit_in_bytes` less
    /// `memory.memsw.usage_in_bytes`.
    pub memory_and_swap: Option<usize>,
    /// The limit file behind [`memory`](Self::memory) (for messages), relative to the root read.
    pub memory_limit_file: Option<PathBuf>,
}

impl CgroupRoom {
    /// The room for memory that must stay resident (pinned): under the memory limits and under
    /// the memory-and-swap limits (their usage counts memory too).
    pub fn resident(&self) -> Option<usize> {
        min_of(self.memory, self.memory_and_swap)
    }

    fn note(&mut self, kind: Kind, room: usize, file: &Path) {
        let slot = match kind {
            Kind::Memory => &mut self.memory,
            Kind::Swap => &mut self.swap,
            Kind::MemoryAndSwap => &mut self.memory_and_swap,
        };
        if slot.map_or(true, |r| room < r) {
            *slot = Some(room);
            if kind == Kind::Memory {
                self.memory_limit_file = Some(file.to_path_buf());
            }
        }
    }
}

fn min_of(a: Option<usize>, b: Option<usize>) -> Option<usize> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Memory,
    Swap,
    MemoryAndSwap,
}

/// One limit a group's directory may hold: (limit files, usage file, what it limits).
type LimitFiles = (&'static [&'static str], &'static str, Kind);

/// The limits of a v2 group.
const V2_LIMITS: [LimitFiles; 2] = [
    (
        &["memory.max", "memory.high"],
        "memory.current",
        Kind::Memory,
    ),
    (
        &["memory.swap.max", "memory.swap.high"],
        "memory.swap.current",
        Kind::Swap,
    ),
];

/// The limits of a v1 memory group.
const V1_LIMITS: [LimitFiles; 2] = [
    (
        &["memory.limit_in_bytes"],
        "memory.usage_in_bytes",
        Kind::Memory,
    ),
    (
        &["memory.memsw.limit_in_bytes"],
        "memory.memsw.usage_in_bytes",
        Kind::MemoryAndSwap,
    ),
];

/// The room under the limits of the real control groups of this process.
pub fn room() -> CgroupRoom {
    room_under(Path::new("/"))
}

/// The room under the limits of this process's control groups as the tree under `root` shows
/// them (`root/proc/self/cgroup`, `root/proc/self/mountinfo`, and the mount points below
/// `root`). Files that cannot be read limit nothing.
///
/// # Time Complexity
/// O(lines of the two files + groups on the path × limit files).
pub fn room_under(root: &Path) -> CgroupRoom {
    let mut room = CgroupRoom::default();
    let Ok(groups) = std::fs::read_to_string(root.join("proc/self/cgroup")) else {
        return room;
    };
    let mounts = std::fs::read_to_string(root.join("proc/self/mountinfo")).unwrap_or_default();
    let mounts: Vec<Mount> = mounts.lines().filter_map(Mount::parse).collect();
    for line in groups.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let (mount, limits) = if id == "0" && controllers.is_empty() {
            (mounts.iter().find(|m| m.fs_type == "cgroup2"), &V2_LIMITS)
        } else if controllers.split(',').any(|c| c == "memory") {
            let memory = |m: &&Mount| m.fs_type == "cgroup" && m.options.contains("memory");
            (mounts.iter().find(memory), &V1_LIMITS)
        } else {
            continue;
        };
        let Some(mount) = mount else {
            continue;
        };
        for dir in mount.group_dirs(root, path) {
            for (limit_files, usage_file, kind) in limits {
                let usage = read_bytes(&dir.join(usage_file)).unwrap_or(0);
                for file in *limit_files {
                    let path = dir.join(file);
                    if let Some(limit) = read_bytes(&path).filter(|&l| l < V1_UNLIMITED) {
                        let shown = path.strip_prefix(root).unwrap_or(&path);
                        room.note(
                            *kind,
                            limit.saturating_sub(usage),
                            &Path::new("/").join(shown),
                        );
                    }
                }
            }
        }
    }
    room
}

/// A file holding a byte count; `None` for "max", a missing file or anything else.
fn read_bytes(path: &Path) -> Option<usize> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// One line of `/proc/self/mountinfo`, the fields read here.
#[derive(Debug)]
struct Mount {
    /// The directory of the file system mounted there (a group's path, for cgroup mounts).
    root: String,
    mount_point: String,
    fs_type: String,
    /// The super block's options, for a v1 cgroup mount its controllers (`rw,memory`).
    options: std::collections::HashSet<String>,
}

impl Mount {
    /// `id parent major:minor root mount-point options [optional...] - type source super-options`
    fn parse(line: &str) -> Option<Mount> {
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let fs_type = right.next()?.to_owned();
        let _source = right.next();
        let options = right
            .next()
            .unwrap_or("")
            .split(',')
            .map(str::to_owned)
            .collect();
        Some(Mount {
            root: unescape(left.get(3)?),
            mount_point: unescape(left.get(4)?),
            fs_type,
            options,
        })
    }

    /// The directories of the group at `path` (as `/proc/self/cgroup` names it) and of every
    /// ancestor visible in this mount, the group's own first, the mount point last.
    fn group_dirs(&self, root: &Path, path: &str) -> Vec<PathBuf> {
        let top = root.join(self.mount_point.trim_start_matches('/'));
        let below = components(path);
        let mount_root = components(&self.root);
        let visible: &[&str] = if below.starts_with(&mount_root) {
            &below[mount_root.len()..]
        } else if top.join(below.join("/")).is_dir() {
            // A path not under the mount's root (a group namespace seen through another
            // mount): where it exists below the mount point, that is the group.
            &below
        } else {
            &[]
        };
        (0..=visible.len())
            .rev()
            .map(|depth| top.join(visible[..depth].join("/")))
            .collect()
    }
}

/// The components of an absolute path, without empty ones (`/` has none).
fn components(path: &str) -> Vec<&str> {
    path.split('/').filter(|c| !c.is_empty()).collect()
}

/// A mountinfo field with its octal escapes (`\040` for a space) decoded.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
pub(crate) mod tests;
