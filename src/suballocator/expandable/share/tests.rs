//! The pool side of sharing, on host memory with a memory file per page (the CPU stand-in):
//! names across pages, frees that wait for importers, trims and sleeps that keep exported pages,
//! refusals; and the lifetimes of a pool's blocks against a model (`lifetimes`).

use super::*;
use crate::resource::{HostVirtualMemory, MemoryResource};
use crate::shared_memory::{AttachOptions, Attachment, Exporter};
use crate::suballocator::ExpandableSizes;
use std::path::PathBuf;
use std::time::Duration;

mod lifetimes;

const PAGE: usize = 2 << 20;

/// A shareable pool over `pages` pages of host memory, with an unshared view of its memory.
fn pool(pages: usize) -> (ExpandableMemoryResource, Arc<HostVirtualMemory>) {
    let vm = Arc::new(
        HostVirtualMemory::new(pages * PAGE, Some(PAGE), false, None)
            .unwrap()
            .shareable()
            .unwrap(),
    );
    let pool = ExpandableMemoryResource::new(vm.clone(), ExpandableSizes::default()).unwrap();
    (pool, vm)
}

/// A socket path of its own, its directory removed when dropped.
struct TempSocket(PathBuf);

impl TempSocket {
    fn new(tag: &str) -> TempSocket {
        let dir =
            std::env::temp_dir().join(format!("rrmm-pool-share-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempSocket(dir)
    }

    fn path(&self) -> PathBuf {
        self.0.join("pool.sock")
    }
}

impl Drop for TempSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `len` bytes that depend on `seed` and each byte's place (modulo 251, a prime: a block moved
/// by anything but a multiple of it reads wrong). Made by copies of one cycle: a byte at a time
/// in the unoptimized test build was most of the lifetimes model's time (12 s of 32).
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    const CYCLE: usize = 251;
    let cycle: Vec<u8> = (0..CYCLE as u64)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed.wrapping_mul(131)) >> 3) as u8 ^ seed as u8)
        .collect();
    let mut out = Vec::with_capacity(len + CYCLE);
    while out.len() < len {
        out.extend_from_slice(&cycle);
    }
    out.truncate(len);
    out
}

/// Writes `bytes` at `ptr`, a host block of the pool.
#[allow(unsafe_code)]
fn fill(ptr: usize, bytes: &[u8]) {
    // SAFETY: `ptr .. ptr + len` is a live block of a host pool, mapped writable, that nothing
    // else writes meanwhile (the tests own it).
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr as *mut u8, bytes.len()) };
}

/// The bytes at `ptr .. ptr + len`, a live host block of the pool.
#[allow(unsafe_code)]
fn peek(ptr: usize, len: usize) -> Vec<u8> {
    // SAFETY: a live block of a host pool, mapped readable; plain bytes.
    unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec()
}

#[allow(unsafe_code)]
fn free(pool: &ExpandableMemoryResource, ptr: usize, size: usize) {
    // SAFETY: a block this pool handed out, freed once, on the stream it was allocated on; no
    // work uses it (host memory, no streams).
    unsafe { pool.deallocate(ptr, size, Stream::DEFAULT) }.unwrap();
}

/// Bytes the pool counts allocated now.
fn allocated(pool: &ExpandableMemoryResource) -> u64 {
    pool.report()
        .and_then(|r| r.memory_stats())
        .map_or(0, |s| s.allocated_bytes.current)
}

fn attach(path: &Path) -> Attachment {
    Attachment::attach(
        path,
        AttachOptions {
            timeout: Duration::from_secs(10),
        },
    )
    .unwrap()
}

fn wait(pool: &ExpandableMemoryResource, done: impl Fn(&PoolShareFigures) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !done(&pool.share_figures().unwrap()) {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            pool.share_figures()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_buffer_across_pages_reads_bit_exact_and_its_pages_lie_side_by_side() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("across");
    let size = 2 * PAGE + 12345;
    let ptr = pool.allocate(size, Stream::DEFAULT).unwrap();
    let bytes = pattern(7, size);
    fill(ptr, &bytes);
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    publication
        .name("big", ptr, size, "|u1", &[size as u64], true)
        .unwrap();
    let small = pool.allocate(4096, Stream::DEFAULT).unwrap();
    fill(small, b"small");
    publication
        .name("small", small, 5, "|u1", &[5], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    let big = imp.resolve("big").unwrap();
    assert_eq!(imp.read(&big).unwrap(), bytes, "bit-exact across pages");
    let s = imp.resolve("small").unwrap();
    assert_eq!(imp.read(&s).unwrap(), b"small");
    // One base difference translates every pointer: the pages are mapped side by side.
    assert_eq!(big.addr.wrapping_sub(ptr), s.addr.wrapping_sub(small));
    assert!(big.readonly && !s.readonly && big.host);
    let f = publication.figures();
    assert_eq!(f.export.segments, f.kept_pages);
    assert!(f.kept_pages >= 3, "{f:?}");
    // A write by the importer lands in the exporter's block.
    imp.write(&s, 0, b"SMALL").unwrap();
    assert_eq!(peek(small, 5), b"SMALL");
    // A name lies in a live block (from its start or inside it: a view), ends in it, and is
    // new.
    let mid = PAGE + 100;
    publication
        .name("mid", ptr + mid, 4096, "|u1", &[4096], false)
        .unwrap();
    let m = imp.resolve("mid").unwrap();
    assert_eq!(
        m.addr,
        big.addr + mid,
        "a view lies where it lies in its block"
    );
    assert_eq!(imp.read(&m).unwrap(), bytes[mid..mid + 4096]);
    assert!(publication
        .name("past", ptr + size - 8, PAGE, "|u1", &[PAGE as u64], false)
        .is_err());
    assert!(publication
        .name("outside", ptr + (1 << 40), 8, "|u1", &[8], false)
        .is_err());
    assert!(publication
        .name("long", small, 8192 + 1, "|u1", &[1], false)
        .is_err());
    assert!(publication.name("big", ptr, 8, "|u1", &[8], false).is_err());
    drop(imp);
    free(&pool, ptr, size);
    free(&pool, small, 4096);
    wait(&pool, |f| {
        f.export.importers == 0 && f.deferred_free_blocks == 0
    });
}

#[test]
fn a_free_of_a_held_block_waits_for_the_importer_and_is_counted() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("deferred");
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    let size = PAGE / 2;
    let ptr = pool.allocate(size, Stream::DEFAULT).unwrap();
    fill(ptr, &pattern(3, size));
    publication
        .name("a", ptr, size, "|u1", &[size as u64], false)
        .unwrap();
    publication
        .name("a2", ptr, 64, "|u1", &[64], false)
        .unwrap();
    // A view into the block: the block's free waits for its holders too.
    publication
        .name("a3", ptr + 4096, 64, "|u1", &[64], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    let a = imp.resolve("a").unwrap();
    let a3 = imp.resolve("a3").unwrap();
    let used = allocated(&pool);
    free(&pool, ptr, size);
    let f = pool.share_figures().unwrap();
    assert_eq!(
        (f.deferred_free_blocks, f.deferred_free_bytes),
        (1, size as u64)
    );
    assert_eq!(f.export.deferred_frees, 2, "the names held: {f:?}");
    assert_eq!(allocated(&pool), used, "still allocated");
    assert!(
        publication.names().unwrap().is_empty(),
        "both names withdrawn"
    );
    // Blocks made meanwhile never overlap the held one, and it keeps its bytes.
    let others: Vec<usize> = (0..6)
        .map(|_| pool.allocate(size, Stream::DEFAULT).unwrap())
        .collect();
    for &o in &others {
        assert!(o + size <= ptr || o >= ptr + size, "reused a held block");
        fill(o, &pattern(99, size));
    }
    assert_eq!(imp.read(&a).unwrap(), pattern(3, size));
    assert_eq!(imp.release(&["a"]).unwrap(), 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(
        pool.share_figures().unwrap().deferred_free_blocks,
        1,
        "the view is still held"
    );
    assert_eq!(imp.read(&a3).unwrap(), pattern(3, size)[4096..4096 + 64]);
    assert_eq!(imp.release(&["a3"]).unwrap(), 1);
    wait(&pool, |f| f.deferred_free_blocks == 0);
    let f = pool.share_figures().unwrap();
    assert_eq!(
        (f.export.frees_after_wait, f.deferred_free_bytes),
        (2, 0),
        "a name each"
    );
    assert!(allocated(&pool) < used + 6 * size as u64);
    for o in others {
        free(&pool, o, size);
    }
}

#[test]
fn trim_keeps_the_pages_an_importer_maps_and_a_sleep_is_refused_while_published() {
    let (pool, vm) = pool(32);
    let sock = TempSocket::new("trim");
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    let a = pool.allocate(3 * PAGE, Stream::DEFAULT).unwrap();
    let b = pool.allocate(3 * PAGE, Stream::DEFAULT).unwrap();
    fill(a, &pattern(1, 3 * PAGE));
    publication
        .name("a", a, 3 * PAGE, "|u1", &[3 * PAGE as u64], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    let held = imp.resolve("a").unwrap();
    free(&pool, b, 3 * PAGE);
    free(&pool, a, 3 * PAGE); // waits for the importer
    pool.trim(0).unwrap();
    let kept = publication.figures().kept_bytes as usize;
    assert_eq!(kept, 3 * PAGE);
    assert_eq!(pool.mapped_bytes(), kept, "every other page unmapped");
    for page in (a..a + 3 * PAGE).step_by(PAGE) {
        assert!(
            vm.runs()
                .iter()
                .any(|&(s, l)| s <= page && page + PAGE <= s + l),
            "an exported page was unmapped"
        );
    }
    assert!(
        pool.offload().is_err(),
        "a sleep would unmap exported pages"
    );
    assert_eq!(imp.read(&held).unwrap(), pattern(1, 3 * PAGE));
    imp.release(&["a"]).unwrap();
    wait(&pool, |f| f.deferred_free_blocks == 0);
    // Freed, but still published: the pages stay (a later name may lie on them).
    pool.trim(0).unwrap();
    assert_eq!(pool.mapped_bytes(), kept);
    publication.close();
    pool.trim(0).unwrap();
    assert_eq!(pool.mapped_bytes(), 0, "closed: the trim's again");
    assert!(publication.names().is_err(), "closed");
    pool.offload().unwrap();
    pool.restore().unwrap();
}

#[test]
fn a_published_pool_sleeps_with_no_importer_and_importers_attach_again_after_the_wake() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("sleep");
    let size = 2 * PAGE + 777;
    let ptr = pool.allocate(size, Stream::DEFAULT).unwrap();
    let bytes = pattern(5, size);
    fill(ptr, &bytes);
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    publication
        .name("w", ptr, size, "|u1", &[size as u64], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    let held = imp.resolve("w").unwrap();
    assert_eq!(imp.read(&held).unwrap(), bytes);
    let refused = pool.offload().unwrap_err().to_string();
    assert!(refused.contains("importers are attached"), "{refused}");
    assert_eq!(peek(ptr, size), bytes, "a refused sleep moves nothing");
    drop(imp);
    wait(&pool, |f| f.export.importers == 0);
    pool.offload().unwrap();
    let asleep = Attachment::attach(
        &sock.path(),
        AttachOptions {
            timeout: Duration::from_secs(5),
        },
    );
    assert!(
        asleep.is_err_and(|e| e.to_string().contains("sleeps")),
        "no importer while the pages sleep"
    );
    assert!(
        publication
            .name("late", ptr, 8, "|u1", &[8], false)
            .is_err(),
        "no name while asleep"
    );
    pool.restore().unwrap();
    assert_eq!(peek(ptr, size), bytes, "same address, same bytes");
    let mut imp = attach(&sock.path());
    let again = imp.resolve("w").unwrap();
    assert_eq!(
        imp.read(&again).unwrap(),
        bytes,
        "the same name, the new pages"
    );
    imp.write(&again, 0, b"AWAKE").unwrap();
    assert_eq!(
        peek(ptr, 5),
        b"AWAKE",
        "the importer maps the pool's new page"
    );
    drop(imp);
    free(&pool, ptr, size);
    wait(&pool, |f| f.export.importers == 0);
}

#[test]
fn a_page_exported_once_serves_the_same_memory_after_a_free_and_a_trim() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("again");
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    let a = pool.allocate(PAGE, Stream::DEFAULT).unwrap();
    publication
        .name("a", a, PAGE, "|u1", &[PAGE as u64], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    imp.resolve("a").unwrap();
    imp.release(&["a"]).unwrap();
    free(&pool, a, PAGE);
    // Were the page unmapped here and made again, the importer (and every later one) would
    // map the old memory under the new block's name.
    pool.trim(0).unwrap();
    let b = pool.allocate(PAGE, Stream::DEFAULT).unwrap();
    fill(b, &pattern(5, PAGE));
    publication
        .name("b", b, PAGE, "|u1", &[PAGE as u64], false)
        .unwrap();
    let r = imp.resolve("b").unwrap();
    assert_eq!(imp.read(&r).unwrap(), pattern(5, PAGE), "the same importer");
    let mut other = attach(&sock.path());
    let r = other.resolve("b").unwrap();
    assert_eq!(other.read(&r).unwrap(), pattern(5, PAGE), "a new importer");
}

#[test]
fn close_keeps_held_blocks_out_of_use_for_good() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("close");
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    let held = pool.allocate(PAGE, Stream::DEFAULT).unwrap();
    let waiting = pool.allocate(PAGE, Stream::DEFAULT).unwrap();
    let loose = pool.allocate(PAGE, Stream::DEFAULT).unwrap();
    for (name, ptr) in [("held", held), ("waiting", waiting), ("loose", loose)] {
        publication
            .name(name, ptr, PAGE, "|u1", &[PAGE as u64], false)
            .unwrap();
    }
    let mut imp = attach(&sock.path());
    imp.resolve_many(&["held", "waiting"]).unwrap();
    free(&pool, waiting, PAGE);
    assert!(
        pool.publish(&sock.path(), ExportOptions::default())
            .is_err(),
        "one publication at a time"
    );
    publication.close();
    publication.close();
    let f = pool.share_figures().unwrap();
    assert_eq!(
        (f.held_out_of_use_bytes, f.deferred_free_blocks),
        (PAGE as u64, 0)
    );
    free(&pool, held, PAGE);
    free(&pool, loose, PAGE);
    let f = pool.share_figures().unwrap();
    assert_eq!(
        f.held_out_of_use_bytes,
        2 * PAGE as u64,
        "held: never freed"
    );
    assert_eq!(allocated(&pool), 2 * PAGE as u64);
    // Published again: a new exporter, the old handle reaches it not.
    let again = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    assert!(publication.names().is_err());
    assert!(again.names().unwrap().is_empty());
}

#[test]
fn memory_that_cannot_be_shared_is_refused_with_the_reason() {
    use crate::suballocator::ExpandableOptions;
    let options = ExpandableOptions {
        shareable: true,
        ..ExpandableOptions::default()
    };
    let e = ExpandableMemoryResource::on_simulated(1 << 30, options).unwrap_err();
    assert!(e.to_string().contains("no bytes"), "{e}");
    let spilling = HostVirtualMemory::pretend_device(64 << 20, Some(PAGE), 32 << 20, 8 << 20)
        .unwrap()
        .shareable()
        .unwrap_err();
    assert!(spilling.to_string().contains("spill"), "{spilling}");
    let pretend = HostVirtualMemory::pretend_device(64 << 20, Some(PAGE), 32 << 20, 0).unwrap();
    assert!(
        pretend.shareable().is_ok(),
        "a pretend device that never spills"
    );
    let plain = ExpandableMemoryResource::new(
        Arc::new(HostVirtualMemory::new(16 * PAGE, Some(PAGE), false, None).unwrap()),
        ExpandableSizes::default(),
    )
    .unwrap();
    assert!(!plain.is_shareable() && plain.share_figures().is_none());
    let sock = TempSocket::new("refused");
    let e = plain
        .publish(&sock.path(), ExportOptions::default())
        .unwrap_err();
    assert!(e.to_string().contains("shareable=True"), "{e}");
}

#[test]
fn a_name_on_pages_larger_than_the_reservations_alignment_finds_its_page() {
    // 32 MiB pages in a host reservation aligned to the system's pages only: a page's place
    // is counted from the reservation's base, not from address zero.
    let big = 32 << 20;
    let vm = Arc::new(
        HostVirtualMemory::new(4 * big, Some(big), false, None)
            .unwrap()
            .shareable()
            .unwrap(),
    );
    let pool = ExpandableMemoryResource::new(vm, ExpandableSizes::default()).unwrap();
    let sock = TempSocket::new("aligned");
    let ptr = pool.allocate(3 << 20, Stream::DEFAULT).unwrap();
    let bytes = pattern(9, 3 << 20);
    fill(ptr, &bytes);
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    publication
        .name("x", ptr, 3 << 20, "|u1", &[3 << 20], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    let held = imp.resolve("x").unwrap();
    assert_eq!(imp.read(&held).unwrap(), bytes);
    drop(imp);
    free(&pool, ptr, 3 << 20);
    wait(&pool, |f| f.export.importers == 0);
}

#[test]
fn a_new_exporter_adopts_a_buffer_across_pages_and_keeps_it_contiguous() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("adopt-across");
    let size = 2 * PAGE + 4321;
    let ptr = pool.allocate(size, Stream::DEFAULT).unwrap();
    let bytes = pattern(11, size);
    fill(ptr, &bytes);
    let small = pool.allocate(4096, Stream::DEFAULT).unwrap();
    fill(small, b"one page");
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    publication
        .name("across", ptr, size, "|u1", &[size as u64], true)
        .unwrap();
    publication
        .name("small", small, 8, "|u1", &[8], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    let before = imp.resolve_many(&["across", "small"]).unwrap();
    let mut second = attach(&sock.path());
    second.resolve("across").unwrap();
    // The exporter goes (as if killed): the importers map on.
    publication.close();
    let adopter_sock = TempSocket::new("adopter");
    let adopter = Exporter::start(
        &adopter_sock.path(),
        ExportOptions {
            accept_adoption: true,
            ..ExportOptions::default()
        },
    )
    .unwrap();
    // An importer that attached before the adoption was told of no pool's pages: it is told
    // to attach again for them.
    let mut early = attach(&adopter_sock.path());
    let (segments, names) = imp.hand_back(&adopter_sock.path()).unwrap();
    let e = early.resolve("across").unwrap_err().to_string();
    assert!(e.contains("attach again"), "{e}");
    drop(early);
    assert!(segments >= 3, "every page the names lie on: {segments}");
    assert_eq!(names, 2, "the name across pages too");
    let f = adopter.figures();
    assert_eq!((f.adopted_names, f.names), (2, 2));
    // The importer reads on from the same map.
    let again = imp.resolve("across").unwrap();
    assert_eq!(again.addr, before[0].addr);
    assert_eq!(imp.read(&again).unwrap(), bytes);
    // A new importer of the adopter places the pages side by side: bit-exact across them.
    let mut third = attach(&adopter_sock.path());
    let got = third.resolve_many(&["across", "small"]).unwrap();
    assert_eq!(
        third.read(&got[0]).unwrap(),
        bytes,
        "contiguous in a new importer"
    );
    assert_eq!(third.read(&got[1]).unwrap(), b"one page");
    assert!(got[0].readonly && !got[1].readonly);
    assert_eq!(
        got[0].addr.wrapping_sub(ptr),
        got[1].addr.wrapping_sub(small),
        "the pages at their places"
    );
    // The same memory: a write by the new importer shows in the pool and the first importer.
    third.write(&got[1], 0, b"ADOPTED!").unwrap();
    assert_eq!(peek(small, 8), b"ADOPTED!");
    assert_eq!(imp.read(&before[1]).unwrap(), b"ADOPTED!");
    // A second importer handing back the same pages: they are the pages adopted already, and
    // it holds a lease on the name it handed back.
    assert_eq!(second.hand_back(&adopter_sock.path()).unwrap().1, 1);
    let f = adopter.figures();
    assert_eq!(
        (f.segments, f.adopted_segments),
        (segments as u64, segments as u64)
    );
    assert_eq!(
        (f.adopted_names, f.leases),
        (2, 5),
        "2 + 2 (the third importer) + 1"
    );
    let held = second.resolve("across").unwrap();
    assert_eq!(second.read(&held).unwrap(), bytes);
    drop(third);
    drop(imp);
    drop(second);
    free(&pool, ptr, size);
    free(&pool, small, 4096);
}

#[test]
fn an_importer_maps_a_page_read_only_until_it_resolves_a_writable_name_on_it() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("read-only");
    let ro = pool.allocate(4096, Stream::DEFAULT).unwrap();
    let rw = pool.allocate(4096, Stream::DEFAULT).unwrap();
    fill(ro, b"weights");
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    publication.name("ro", ro, 7, "|u1", &[7], true).unwrap();
    publication.name("rw", rw, 8, "|u1", &[8], false).unwrap();
    assert_eq!(publication.figures().export.segments, 1, "one page");
    let mut imp = attach(&sock.path());
    let r = imp.resolve("ro").unwrap();
    assert_eq!(imp.read_only_segments(), 1, "only read-only names on it");
    assert!(imp.write(&r, 0, b"W").is_err());
    assert_eq!(imp.read(&r).unwrap(), b"weights");
    let w = imp.resolve("rw").unwrap();
    assert_eq!(imp.read_only_segments(), 0, "a writable name on the page");
    imp.write(&w, 0, b"written!").unwrap();
    assert_eq!(peek(rw, 8), b"written!");
    // Another importer that resolves the read-only name only maps the page read-only.
    let mut other = attach(&sock.path());
    other.resolve("ro").unwrap();
    assert_eq!(other.read_only_segments(), 1);
    drop((imp, other));
    free(&pool, ro, 4096);
    free(&pool, rw, 4096);
}

#[test]
fn an_importer_lists_the_runs_of_pages_it_maps_side_by_side() {
    let (pool, _vm) = pool(16);
    let sock = TempSocket::new("runs");
    let a = pool.allocate(2 * PAGE, Stream::DEFAULT).unwrap();
    let gap = pool.allocate(3 * PAGE, Stream::DEFAULT).unwrap();
    let b = pool.allocate(PAGE, Stream::DEFAULT).unwrap();
    let publication = pool
        .publish(&sock.path(), ExportOptions::default())
        .unwrap();
    publication
        .name("a", a, 2 * PAGE, "|u1", &[2 * PAGE as u64], false)
        .unwrap();
    publication
        .name("b", b, PAGE, "|u1", &[PAGE as u64], false)
        .unwrap();
    let mut imp = attach(&sock.path());
    assert!(imp.placed_runs().is_empty(), "nothing mapped yet");
    let got = imp.resolve_many(&["a", "b"]).unwrap();
    let runs = imp.placed_runs();
    assert_eq!(
        runs.len(),
        2,
        "the pages between are not mapped here: {runs:?}"
    );
    for (r, want) in got.iter().zip([2 * PAGE, PAGE]) {
        assert!(
            runs.iter()
                .any(|&(s, l)| s <= r.addr && r.addr + r.size as usize <= s + l),
            "{r:?} in no run {runs:?}"
        );
        assert!(runs.iter().any(|&(_, l)| l >= want));
    }
    drop(imp);
    for (p, size) in [(a, 2 * PAGE), (gap, 3 * PAGE), (b, PAGE)] {
        free(&pool, p, size);
    }
}
