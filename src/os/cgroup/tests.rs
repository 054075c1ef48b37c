//! Fake trees of control groups (v1, v2 or both, limits at random depths, groups hidden above
//! the mount's root, siblings with tighter limits that must not count) written to a temporary
//! directory, read by [`room_under`], and compared with a model: the least room over the
//! process's own group and every ancestor the mount shows.

use super::*;
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A temporary directory, removed on drop.
pub(crate) struct FakeRoot(pub(crate) PathBuf);

impl FakeRoot {
    pub(crate) fn new() -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rrmm-cgroup-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        FakeRoot(dir)
    }

    pub(crate) fn write(&self, path: &str, text: &str) {
        let path = self.0.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A limit file: absent, "no limit" (`max` in v2, 2^63 - 4096 in v1), or bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Limit {
    Absent,
    Unlimited,
    Bytes(usize),
}

impl Limit {
    fn bytes(self) -> Option<usize> {
        match self {
            Limit::Bytes(b) => Some(b),
            _ => None,
        }
    }
}

/// One group on the path: its limits and usage (v2: max, high, current, swap.max, swap.high,
/// swap.current; v1: limit, -, usage, memsw.limit, -, memsw.usage).
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub(crate) max: Limit,
    pub(crate) high: Limit,
    pub(crate) current: usize,
    pub(crate) swap_max: Limit,
    pub(crate) swap_high: Limit,
    pub(crate) swap_current: usize,
}

/// One hierarchy: groups hidden above the mount's root, then the groups the mount shows, its
/// root first and the process's own group last.
#[derive(Clone, Debug)]
pub(crate) struct Hierarchy {
    pub(crate) hidden: usize,
    pub(crate) groups: Vec<Group>,
}

/// A fake machine: a v2 hierarchy, a v1 memory hierarchy, or both (hybrid).
#[derive(Clone, Debug)]
pub(crate) struct Tree {
    pub(crate) v2: Option<Hierarchy>,
    pub(crate) v1: Option<Hierarchy>,
    /// The v1 memory controller shares its hierarchy with another (`memory,hugetlb`).
    pub(crate) v1_shared: bool,
}

const V2_MOUNT: &str = "/sys/fs/cgroup";
const HYBRID_V2_MOUNT: &str = "/sys/fs/cgroup/unified";
/// With a space, written `\040` in mountinfo.
const V1_MOUNT: &str = "/sys/fs/cgroup/mem ory";

impl Tree {
    /// Writes the tree under `root`.
    pub(crate) fn write(&self, root: &FakeRoot) {
        let mut cgroup = String::from("12:cpu,cpuacct:/elsewhere\n11:name=systemd:/user.slice\n");
        let mut mountinfo = String::from(
            "24 1 0:22 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755\n\
             30 24 0:26 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n",
        );
        // A cpu group of the same path with a tight memory-looking file: not a memory mount.
        root.write(
            "/sys/fs/cgroup/cpu,cpuacct/elsewhere/memory.limit_in_bytes",
            "1\n",
        );
        if let Some(v1) = &self.v1 {
            let controllers = if self.v1_shared {
                "memory,hugetlb"
            } else {
                "memory"
            };
            let (path, mount_root) = paths(v1);
            cgroup.push_str(&format!("4:{controllers}:{path}\n"));
            mountinfo.push_str(&format!(
                "35 24 0:32 {mount_root} {} rw,relatime - cgroup cgroup rw,{controllers}\n",
                V1_MOUNT.replace(' ', "\\040")
            ));
            write_groups(root, V1_MOUNT, v1, true);
        }
        if let Some(v2) = &self.v2 {
            let mount = if self.v1.is_some() {
                HYBRID_V2_MOUNT
            } else {
                V2_MOUNT
            };
            let (path, mount_root) = paths(v2);
            cgroup.push_str(&format!("0::{path}\n"));
            mountinfo.push_str(&format!(
                "41 24 0:38 {mount_root} {mount} rw,nosuid - cgroup2 cgroup2 \
                 rw,nsdelegate,memory_recursiveprot\n"
            ));
            write_groups(root, mount, v2, false);
        }
        root.write("/proc/self/cgroup", &cgroup);
        root.write("/proc/self/mountinfo", &mountinfo);
    }

    /// The model: the least room over every group of both hierarchies.
    pub(crate) fn room(&self) -> (Option<usize>, Option<usize>, Option<usize>) {
        let least = |a: Option<usize>, b: Option<usize>| min_of(a, b);
        let (mut memory, mut swap, mut memsw) = (None, None, None);
        for g in self.v2.iter().flat_map(|h| &h.groups) {
            for l in [g.max, g.high] {
                memory = least(memory, l.bytes().map(|b| b.saturating_sub(g.current)));
            }
            for l in [g.swap_max, g.swap_high] {
                swap = least(swap, l.bytes().map(|b| b.saturating_sub(g.swap_current)));
            }
        }
        for g in self.v1.iter().flat_map(|h| &h.groups) {
            memory = least(memory, g.max.bytes().map(|b| b.saturating_sub(g.current)));
            memsw = least(
                memsw,
                g.swap_max.bytes().map(|b| b.saturating_sub(g.swap_current)),
            );
        }
        (memory, swap, memsw)
    }
}

/// The group's path as `/proc/self/cgroup` names it, and the mount's root.
fn paths(h: &Hierarchy) -> (String, String) {
    let hidden: Vec<String> = (0..h.hidden).map(|i| format!("h{i}")).collect();
    let visible: Vec<String> = (1..h.groups.len()).map(|i| format!("g{i}")).collect();
    let all: Vec<&String> = hidden.iter().chain(&visible).collect();
    let join = |parts: &[&String]| {
        format!(
            "/{}",
            parts
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("/")
        )
    };
    (join(&all), join(&hidden.iter().collect::<Vec<_>>()))
}

fn write_groups(root: &FakeRoot, mount: &str, h: &Hierarchy, v1: bool) {
    let mut dir = mount.to_owned();
    let files: [&str; 6] = if v1 {
        [
            "memory.limit_in_bytes",
            "",
            "memory.usage_in_bytes",
            "memory.memsw.limit_in_bytes",
            "",
            "memory.memsw.usage_in_bytes",
        ]
    } else {
        [
            "memory.max",
            "memory.high",
            "memory.current",
            "memory.swap.max",
            "memory.swap.high",
            "memory.swap.current",
        ]
    };
    let unlimited = if v1 { "9223372036854771712" } else { "max" };
    for (depth, g) in h.groups.iter().enumerate() {
        if depth > 0 {
            dir = format!("{dir}/g{depth}");
        }
        let limits = [(0, g.max), (1, g.high), (3, g.swap_max), (4, g.swap_high)];
        for (i, limit) in limits {
            if files[i].is_empty() {
                continue;
            }
            match limit {
                Limit::Absent => {}
                Limit::Unlimited => root.write(&format!("{dir}/{}", files[i]), unlimited),
                Limit::Bytes(b) => root.write(&format!("{dir}/{}", files[i]), &format!("{b}\n")),
            }
        }
        root.write(&format!("{dir}/{}", files[2]), &format!("{}\n", g.current));
        root.write(
            &format!("{dir}/{}", files[5]),
            &format!("{}\n", g.swap_current),
        );
        // A sibling with a tight limit, which does not limit this process.
        root.write(&format!("{dir}/sibling/{}", files[0]), "4096\n");
        root.write(&format!("{dir}/sibling/{}", files[2]), "0\n");
    }
}

fn limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        2 => Just(Limit::Absent),
        2 => Just(Limit::Unlimited),
        3 => (0..1usize << 40).prop_map(Limit::Bytes),
    ]
}

fn group() -> impl Strategy<Value = Group> {
    (
        limit(),
        limit(),
        0..1usize << 40,
        limit(),
        limit(),
        0..1usize << 38,
    )
        .prop_map(
            |(max, high, current, swap_max, swap_high, swap_current)| Group {
                max,
                high,
                current,
                swap_max,
                swap_high,
                swap_current,
            },
        )
}

fn hierarchy() -> impl Strategy<Value = Hierarchy> {
    (0..3usize, proptest::collection::vec(group(), 1..6))
        .prop_map(|(hidden, groups)| Hierarchy { hidden, groups })
}

pub(crate) fn tree() -> impl Strategy<Value = Tree> {
    (
        proptest::option::of(hierarchy()),
        proptest::option::of(hierarchy()),
        any::<bool>(),
    )
        .prop_map(|(v2, v1, v1_shared)| Tree { v2, v1, v1_shared })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Every limit of the own group and its visible ancestors counts, in either hierarchy or
    /// both; the room is the model's least.
    #[test]
    fn the_room_is_the_least_over_every_limiting_group(tree in tree()) {
        let root = FakeRoot::new();
        tree.write(&root);
        let got = room_under(&root.0);
        let (memory, swap, memsw) = tree.room();
        prop_assert_eq!((got.memory, got.swap, got.memory_and_swap), (memory, swap, memsw));
        prop_assert_eq!(got.memory.is_some(), got.memory_limit_file.is_some());
        if let Some(file) = &got.memory_limit_file {
            prop_assert!(root.0.join(file.strip_prefix("/").unwrap()).is_file(), "{:?}", file);
        }
    }
}

/// A group with a memory limit `max` and 1 MiB in use, nothing else.
fn plain(max: Limit) -> Group {
    Group {
        max,
        high: Limit::Absent,
        current: 1 << 20,
        swap_max: Limit::Absent,
        swap_high: Limit::Absent,
        swap_current: 0,
    }
}

/// Issue 39's two cases: a 32 MiB limit on the own v1 group (below a hidden group, beside an
/// empty v2 hierarchy); a 32 MiB `memory.max` on the parent v2 group with the own group
/// unlimited. 1 MiB is in use in each group: 31 MiB of room.
pub(crate) fn issue_cases() -> [Tree; 2] {
    const MIB: usize = 1 << 20;
    let own_v1 = Tree {
        v2: Some(Hierarchy {
            hidden: 0,
            groups: vec![plain(Limit::Absent)],
        }),
        v1: Some(Hierarchy {
            hidden: 1,
            groups: vec![plain(Limit::Unlimited), plain(Limit::Bytes(32 * MIB))],
        }),
        v1_shared: false,
    };
    let parent_v2 = Tree {
        v2: Some(Hierarchy {
            hidden: 0,
            groups: vec![
                plain(Limit::Absent),
                plain(Limit::Bytes(32 * MIB)),
                plain(Limit::Unlimited),
            ],
        }),
        v1: None,
        v1_shared: false,
    };
    [own_v1, parent_v2]
}

#[test]
fn the_own_v1_group_and_a_parent_v2_group_limit() {
    for tree in issue_cases() {
        let root = FakeRoot::new();
        tree.write(&root);
        assert_eq!(room_under(&root.0).memory, Some(31 << 20), "{tree:?}");
    }
}

#[test]
fn no_files_no_limit_and_mountinfo_escapes() {
    let root = FakeRoot::new();
    assert_eq!(room_under(&root.0), CgroupRoom::default());
    assert_eq!(unescape("/a\\040b\\134c"), "/a b\\c");
    assert_eq!(unescape("/x\\04"), "/x\\04", "not an escape");
    // A path not under the mount's root that exists below the mount point is that group.
    root.write("/proc/self/cgroup", "0::/ns/own\n");
    root.write(
        "/proc/self/mountinfo",
        "41 24 0:38 /other /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
    );
    root.write("/sys/fs/cgroup/ns/own/memory.max", "1000\n");
    root.write("/sys/fs/cgroup/ns/own/memory.current", "10\n");
    assert_eq!(room_under(&root.0).memory, Some(990));
}

/// The real tree is read without error (whatever limits this machine has).
#[test]
fn the_real_tree_reads() {
    let real = room();
    assert_eq!(real.memory.is_some(), real.memory_limit_file.is_some());
}
