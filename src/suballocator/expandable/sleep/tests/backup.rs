//! What a sleep keeps and where (`expandable/backup.rs`), on host virtual memory with real
//! bytes: the bytes of a range in the host copy, the copy kept with the pool or given back at the
//! wake, plain pages instead of pinned ones, disk backups (real files in a temporary
//! directory, a full disk injected, a file that vanished or shrank), and the count and watcher of
//! backing changes.

use super::*;
use crate::resource::host_pages::disk::DiskTarget;
use crate::resource::host_pages::registered::PageKind;
use crate::resource::sleep::{AfterWake, BackingChange};
use std::path::PathBuf;
use std::sync::Mutex;

/// The bytes of `ptr .. ptr + size` of an awake host pool.
fn bytes_at(ptr: usize, size: usize) -> Vec<u8> {
    // SAFETY: a live block of an awake host pool (the callers').
    unsafe { std::slice::from_raw_parts(ptr as *const u8, size) }.to_vec()
}

/// The bytes of a host copy's spans.
fn bytes_of(spans: &[(usize, usize)]) -> Vec<u8> {
    spans.iter().flat_map(|&(a, n)| bytes_at(a, n)).collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rrmm-backup-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn files_in(dir: &PathBuf) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    out.sort();
    out
}

fn to_disk(target: DiskTarget) -> SleepPlan {
    SleepPlan {
        disk: Some(target),
        ..SleepPlan::default()
    }
}

#[test]
fn the_host_copy_of_a_range_holds_its_bytes_while_asleep_only() {
    let (_vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[1000, 3 * PAGE + 5], 3);
    let (p, size, _) = blocks[1];
    let want = bytes_at(p + 17, size - 17);
    assert_eq!(mr.host_copy_of(p, 8), None, "awake: no copy");
    mr.offload().unwrap();
    let spans = mr.host_copy_of(p + 17, size - 17).expect("in the copy");
    assert_eq!(bytes_of(&spans), want);
    let mut out = vec![0u8; size - 17];
    assert!(mr.read_host_copy(p + 17, &mut out));
    assert_eq!(out, want);
    assert_eq!(mr.host_copy_of(p, 8 * PAGE), None, "past the kept range");
    assert_eq!(
        mr.host_copy_of(mr.virtual_memory().base() + 60 * PAGE, 1),
        None
    );
    mr.restore().unwrap();
    assert_eq!(
        mr.host_copy_of(p, 8),
        None,
        "the copy went back to the supply"
    );
    assert!(!mr.read_host_copy(p, &mut out));
    assert_intact(&blocks);
}

#[test]
fn a_copy_kept_with_the_pool_stays_readable_and_serves_the_next_sleep_at_the_same_address() {
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[2 * PAGE], 4);
    let (p, size, _) = blocks[0];
    mr.set_host_copy_after_wake(AfterWake::Keep);
    assert_eq!(mr.host_copy_after_wake(), AfterWake::Keep);
    mr.offload().unwrap();
    let first = mr.host_copy_of(p, size).unwrap();
    mr.restore().unwrap();
    assert_eq!(
        mr.host_copy_of(p, size),
        Some(first.clone()),
        "kept: readable after the wake"
    );
    write(p, size, 40);
    let old: Vec<u8> = (0..size).map(|i| pattern(4, i)).collect();
    assert_eq!(bytes_of(&first), old, "as of the sleep");
    // The next sleep copies into it: same host addresses, the new bytes; its pages were ready.
    mr.set_host_copy_after_wake(AfterWake::GiveBack);
    assert_eq!(
        mr.host_copy_of(p, size),
        Some(first.clone()),
        "a policy change frees nothing"
    );
    mr.offload().unwrap();
    assert!(mr.last_sleep().unwrap().host_reused);
    assert_eq!(mr.host_copy_of(p, size), Some(first.clone()));
    let free_before = vm.supply.figures().free_bytes;
    mr.restore().unwrap();
    assert_eq!(mismatch(p, size, 40), None);
    assert_eq!(mr.host_copy_of(p, size), None, "given back at the wake");
    assert_eq!(
        vm.supply.figures().free_bytes,
        free_before,
        "to the OS, not the supply"
    );
    // Kept again, then dropped on request.
    mr.set_host_copy_after_wake(AfterWake::Keep);
    mr.offload().unwrap();
    mr.restore().unwrap();
    assert!(mr.drop_host_copy() >= size);
    assert_eq!(mr.host_copy_of(p, size), None);
    free(&mr, p, size).unwrap();
}

/// Host virtual memory that claims its sleeps need pinned pages (as a device's do): a sleep
/// works on the CPU only where the pool asks for plain pages.
#[derive(Debug)]
struct ClaimsPinned(FlakyVm);

impl VirtualMemory for ClaimsPinned {
    fn page_size(&self) -> usize {
        self.0.page_size()
    }
    fn base(&self) -> usize {
        self.0.base()
    }
    fn reserved_bytes(&self) -> usize {
        self.0.reserved_bytes()
    }
    fn mapped_bytes(&self) -> usize {
        self.0.mapped_bytes()
    }
    fn memory_info(&self) -> Option<(usize, usize)> {
        self.0.memory_info()
    }
    fn kind(&self) -> MemoryKind {
        self.0.kind()
    }
    fn map(&self, addr: usize, bytes: usize) -> Result<()> {
        self.0.map(addr, bytes)
    }
    unsafe fn unmap(&self, addr: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's precondition, passed on.
        unsafe { self.0.unmap(addr, bytes) }
    }
    fn host_pages(&self) -> Result<Option<PageSpec>> {
        Ok(Some(PageSpec {
            kind: PageKind::Pinned,
            numa_node: None,
            device: Some(0),
        }))
    }
    fn host_supply(&self) -> &'static HostPageSupply {
        self.0.supply
    }
    unsafe fn copy_out(&self, addr: usize, dst: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's preconditions, passed on.
        unsafe { self.0.copy_out(addr, dst, bytes) }
    }
    unsafe fn copy_in(&self, addr: usize, src: usize, bytes: usize) -> Result<()> {
        // SAFETY: the caller's preconditions, passed on.
        unsafe { self.0.copy_in(addr, src, bytes) }
    }
}

#[test]
fn a_pool_that_asks_for_pageable_pages_copies_to_plain_ones() {
    let vm = Arc::new(ClaimsPinned(
        Arc::try_unwrap(FlakyVm::new(32 * PAGE)).unwrap(),
    ));
    let mr = ExpandableMemoryResource::new(vm.clone(), ExpandableSizes::default()).unwrap();
    mr.set_pageable_host_copy(true);
    let blocks = written_blocks(&mr, &[PAGE + 9], 6);
    mr.prepare_sleep().unwrap();
    vm.0.supply.wait_prepared();
    let ready = vm.0.supply.figures();
    assert!(
        ready.free_bytes >= PAGE + 9,
        "plain pages made ready: {ready:?}"
    );
    mr.offload().unwrap();
    let report = mr.last_sleep().unwrap();
    assert!(!report.host_pinned && report.host_reused, "{report:?}");
    mr.restore().unwrap();
    assert_intact(&blocks);
}

#[test]
fn a_sleep_to_disk_writes_one_file_per_block_and_holds_no_host_memory() {
    let dir = temp_dir("round-trip");
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[3 * PAGE, 7, PAGE + 1], 7);
    let target = DiskTarget::new(&dir, Some(300_000)).unwrap();
    let before = mr.backing_changes();
    let did = mr.offload_plan(&to_disk(target)).unwrap();
    assert_eq!(vm.mapped_bytes(), 0, "every page given back");
    let report = mr.last_sleep().unwrap();
    assert_eq!(report.disk_bytes, did.copied_bytes);
    assert_eq!(
        (report.host_bytes, mr.host_copy_bytes()),
        (0, 0),
        "no host memory held"
    );
    let files = files_in(&dir);
    assert_eq!(
        files.len(),
        2,
        "the 7 bytes share the first block's file: {files:?}"
    );
    let on_disk: u64 = files
        .iter()
        .map(|f| std::fs::metadata(f).unwrap().len())
        .sum();
    assert_eq!(on_disk as usize, did.copied_bytes);
    assert_eq!(mr.host_copy_of(blocks[0].0, 8), None, "not in host memory");
    assert_eq!(mr.movement().offloaded_bytes, did.copied_bytes);
    mr.restore().unwrap();
    assert_intact(&blocks);
    assert!(files_in(&dir).is_empty(), "removed once back");
    assert_eq!(mr.backing_changes(), before + 2, "a sleep and a wake");
    // Again: the same files' worth, the bytes still right.
    mr.offload_plan(&to_disk(DiskTarget::new(&dir, None).unwrap()))
        .unwrap();
    mr.restore().unwrap();
    assert_intact(&blocks);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_full_disk_or_a_missing_directory_refuses_the_sleep_and_changes_nothing() {
    let dir = temp_dir("refused");
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[3 * PAGE, 5 * PAGE], 8);
    let mapped = vm.mapped_bytes();
    let changes = mr.backing_changes();
    // A full disk after the first chunks (the map chunk is 2 pages: some were unmapped).
    let failing = DiskTarget::new(&dir, Some(PAGE))
        .unwrap()
        .failing_after(5 * PAGE);
    let e = mr.offload_plan(&to_disk(failing)).unwrap_err();
    assert!(
        e.is_out_of_memory() && e.to_string().contains("no room"),
        "{e}"
    );
    assert!(!mr.asleep());
    assert_eq!(vm.mapped_bytes(), mapped);
    assert_intact(&blocks);
    assert!(files_in(&dir).is_empty(), "nothing left behind");
    let missing = DiskTarget::new(dir.join("gone"), None).unwrap();
    let e = mr.offload_plan(&to_disk(missing)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                argument: "disk_dir",
                ..
            }
        ),
        "{e}"
    );
    assert!(!mr.asleep());
    assert_intact(&blocks);
    assert_eq!(
        mr.backing_changes(),
        changes + 1,
        "only the undone half-sleep remapped pages"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_backup_file_that_vanished_or_shrank_keeps_the_pool_asleep_with_its_files() {
    let dir = temp_dir("vanished");
    let (vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[2 * PAGE, 2 * PAGE], 9);
    mr.offload_plan(&to_disk(DiskTarget::new(&dir, None).unwrap()))
        .unwrap();
    let files = files_in(&dir);
    assert_eq!(files.len(), 2);
    let saved = std::fs::read(&files[1]).unwrap();
    std::fs::remove_file(&files[1]).unwrap();
    let e = mr.restore().unwrap_err().to_string();
    assert!(e.contains("is gone") && e.contains("still asleep"), "{e}");
    assert!(mr.asleep() && vm.mapped_bytes() == 0, "nothing mapped");
    assert!(files[0].exists(), "the other files are kept");
    std::fs::write(&files[1], &saved[..saved.len() - 1]).unwrap();
    let e = mr.restore().unwrap_err().to_string();
    assert!(e.contains("were written"), "{e}");
    std::fs::write(&files[1], &saved).unwrap();
    mr.restore().unwrap();
    assert_intact(&blocks);
    assert!(files_in(&dir).is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_watcher_hears_the_users_sleeps_and_wakes_outside_the_lock() {
    let (_vm, mr) = host_pool(64 * PAGE);
    let blocks = written_blocks(&mr, &[PAGE], 10);
    let heard: Arc<Mutex<Vec<(BackingChange, bool)>>> = Arc::default();
    let (h, pool) = (heard.clone(), mr.clone());
    mr.set_backing_watcher(Some(Arc::new(move |change, base, bytes| {
        assert_eq!(
            (base, bytes),
            (pool.virtual_memory().base(), pool.reserved_bytes())
        );
        // It may call into rrmm: the pool's figures need its transition lock.
        let _ = pool.host_copy_bytes();
        h.lock().unwrap().push((change, pool.asleep()));
    })));
    let before = mr.movement().backing_changes;
    mr.offload().unwrap();
    mr.restore().unwrap();
    assert_eq!(mr.movement().backing_changes, before + 2);
    // A refused sleep is told as a wake (the pages unchanged).
    let dir = temp_dir("watcher");
    let missing = DiskTarget::new(dir.join("gone"), None).unwrap();
    mr.offload_plan(&to_disk(missing)).unwrap_err();
    // A sleep for the ledger and its wake at first use are counted, not told.
    let ledger = SleepPlan::for_ledger(Arc::new(|| true));
    mr.offload_plan(&ledger).unwrap();
    assert!(mr.wake_for_use());
    assert_eq!(mr.backing_changes(), before + 4);
    assert_eq!(
        *heard.lock().unwrap(),
        vec![
            (BackingChange::Sleep, false),
            (BackingChange::Wake, false),
            (BackingChange::Sleep, false),
            (BackingChange::Wake, false),
        ]
    );
    mr.set_backing_watcher(None);
    mr.offload().unwrap();
    mr.restore().unwrap();
    assert_eq!(heard.lock().unwrap().len(), 4);
    assert_intact(&blocks);
    std::fs::remove_dir_all(&dir).unwrap();
}
