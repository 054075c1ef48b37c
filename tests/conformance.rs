//! The conformance suite: the same checks, instantiated by [`conformance!`] for every Rust
//! resource and adaptor, of what the [`MemoryResource`] contract promises:
//!
//! - round trips: allocations of many sizes are disjoint while live, freeing them succeeds, and
//!   the resource allocates again afterwards (with real memory, each allocation holds the bytes
//!   written into it until it is freed);
//! - alignment: every pointer is a multiple of [`ALLOCATION_ALIGNMENT`] (or the adaptor's own);
//! - zero size: allocating 0 bytes gives the null pointer and freeing it is a no-op;
//! - upstream accessors: an adaptor's `upstream()` is the very resource it was built over;
//! - out of memory: running out is [`Error::OutOfMemory`](rrmm::Error::OutOfMemory) (not a
//!   logic or CUDA error), and the resource works again once memory is freed;
//! - threads: several threads allocating and freeing at once never get overlapping ranges.
//!
//! On the CPU every resource runs over [`SimulatedMemoryResource`] (or the system allocator);
//! the module `gpu` runs the same suite over the CUDA source resources and is ignored without a
//! GPU (`cargo test --test conformance -- --ignored` on a GPU machine).

use rrmm::adaptor::{FailureCallback, Tier};
use rrmm::resource::{CallbackMemoryResource, HostVirtualMemory, SimulatedVirtualMemory};
use rrmm::suballocator::ArenaMemoryResource;
use rrmm::{
    AlignedResourceAdaptor, BinningMemoryResource, CheckedResourceAdaptor,
    ExpandableMemoryResource, ExpandableSizes, FailureCallbackResourceAdaptor,
    FallbackResourceAdaptor, FixedSizeMemoryResource, LimitingResourceAdaptor,
    LoggingResourceAdaptor, ManagedMemoryResource, MemoryKind, MemoryResource, PoolMemoryResource,
    PrefetchResourceAdaptor, SharedResource, SimulatedMemoryResource, StatisticsResourceAdaptor,
    Stream, SystemMemoryResource, TaggedMemoryResource, TieredMemoryResource,
    TrackingResourceAdaptor, ALLOCATION_ALIGNMENT,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// An adaptor's upstream accessor.
pub type UpstreamOf<R> = fn(&R) -> SharedResource;

/// What the suite needs to know about one resource under test.
pub struct Case<R: MemoryResource> {
    /// The resource.
    pub mr: R,
    /// The upstream it was built over and the accessor that should return it, for adaptors.
    pub upstream: Option<(SharedResource, UpstreamOf<R>)>,
    /// The largest request the resource serves (fixed-size: its block size).
    pub max_size: usize,
    /// The alignment the resource promises (at least [`ALLOCATION_ALIGNMENT`]).
    pub alignment: usize,
    /// A request size that, repeated at most `oom_count` times while live, runs out of memory.
    pub oom_size: usize,
    /// See `oom_size`.
    pub oom_count: usize,
}

impl<R: MemoryResource> Case<R> {
    fn new(mr: R) -> Self {
        Case {
            mr,
            upstream: None,
            max_size: 8 * MIB,
            alignment: ALLOCATION_ALIGNMENT,
            oom_size: 1 << 50,
            oom_count: 1,
        }
    }
}

/// Sizes around the alignment and power-of-two boundaries, up to `max`.
fn sizes(max: usize) -> Vec<usize> {
    [
        1,
        7,
        255,
        256,
        257,
        4 * KIB - 1,
        4 * KIB,
        64 * KIB + 3,
        MIB - 1,
        MIB,
        3 * MIB + 17,
        8 * MIB,
    ]
    .into_iter()
    .filter(|&s| s <= max)
    .collect()
}

/// Whether the memory of `mr` can be read and written (not simulated).
fn is_real<R: MemoryResource>(mr: &R) -> bool {
    mr.kind() != MemoryKind::Simulated
}

/// Fills `size` bytes at `ptr` with `value` (host memory directly, device memory through the
/// driver) and waits.
fn fill<R: MemoryResource>(mr: &R, ptr: usize, size: usize, value: u8, stream: Stream) {
    match mr.kind() {
        MemoryKind::Host | MemoryKind::PinnedHost => {
            // SAFETY: `ptr` is a live host allocation of at least `size` bytes.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, value, size) }
        }
        MemoryKind::Simulated => {}
        _ => {
            let _ctx = rrmm::cuda::ContextGuard::new(mr.device().unwrap_or(0)).expect("context");
            // SAFETY: `ptr` is a live device allocation of at least `size` bytes.
            unsafe { rrmm::cuda::memset_async(ptr, value, size, stream) }.expect("memset");
            stream.synchronize().expect("synchronize");
        }
    }
}

/// Whether all `size` bytes at `ptr` are `value`.
fn holds<R: MemoryResource>(mr: &R, ptr: usize, size: usize, value: u8, stream: Stream) -> bool {
    let mut host = vec![0u8; size];
    match mr.kind() {
        MemoryKind::Host | MemoryKind::PinnedHost => {
            // SAFETY: `ptr` is a live host allocation of at least `size` bytes; `host` too.
            unsafe { std::ptr::copy_nonoverlapping(ptr as *const u8, host.as_mut_ptr(), size) }
        }
        MemoryKind::Simulated => return true,
        _ => {
            let _ctx = rrmm::cuda::ContextGuard::new(mr.device().unwrap_or(0)).expect("context");
            // SAFETY: `ptr` is a live allocation of at least `size` bytes, `host` holds `size`.
            unsafe { rrmm::cuda::memcpy_sync(host.as_mut_ptr() as usize, ptr, size, stream) }
                .expect("memcpy");
        }
    }
    host.iter().all(|&b| b == value)
}

/// Asserts that `[ptr, ptr + size)` overlaps no range in `live`, then records it.
fn insert_disjoint(live: &mut BTreeMap<usize, usize>, ptr: usize, size: usize, who: &str) {
    if let Some((&p, &s)) = live.range(..ptr + size).next_back() {
        assert!(
            p + s <= ptr,
            "{who}: [{ptr:#x}, +{size}) overlaps live [{p:#x}, +{s})"
        );
    }
    live.insert(ptr, size);
}

/// Round trips of every size, twice over, with data checks on real memory.
pub fn round_trips<R: MemoryResource>(case: &Case<R>, stream: Stream) {
    let mr = &case.mr;
    let name = mr.name();
    assert!(!name.is_empty());
    for pass in 0..2u8 {
        let mut live = BTreeMap::new();
        let mut held = Vec::new();
        for (i, size) in sizes(case.max_size).into_iter().enumerate() {
            let ptr = mr
                .allocate(size, stream)
                .unwrap_or_else(|e| panic!("{name}: allocate({size}) failed: {e}"));
            assert_ne!(ptr, 0, "{name}: allocate({size}) gave null");
            insert_disjoint(&mut live, ptr, size, name);
            let value = (i as u8).wrapping_mul(37).wrapping_add(pass) | 1;
            if is_real(mr) {
                fill(mr, ptr, size, value, stream);
            }
            held.push((ptr, size, value));
        }
        for &(ptr, size, value) in &held {
            assert!(
                holds(mr, ptr, size, value, stream),
                "{name}: {size} bytes at {ptr:#x} lost their contents"
            );
        }
        // Free in an order different from allocation order.
        held.reverse();
        let half = held.len() / 2;
        held.rotate_left(half);
        for (ptr, size, _) in held {
            // SAFETY: allocated above from `mr` with `size`, freed once, no work pending on it
            // (the data checks synchronised).
            unsafe { mr.deallocate(ptr, size, stream) }
                .unwrap_or_else(|e| panic!("{name}: deallocate({size}) failed: {e}"));
        }
    }
}

/// Every pointer is aligned to the resource's promise.
pub fn alignment<R: MemoryResource>(case: &Case<R>, stream: Stream) {
    let mr = &case.mr;
    assert!(case.alignment >= ALLOCATION_ALIGNMENT && case.alignment.is_power_of_two());
    let mut held = Vec::new();
    for size in sizes(case.max_size) {
        for _ in 0..3 {
            let ptr = mr.allocate(size, stream).expect("allocate");
            assert_eq!(
                ptr % case.alignment,
                0,
                "{}: allocate({size}) = {ptr:#x} is not {}-aligned",
                mr.name(),
                case.alignment
            );
            held.push((ptr, size));
        }
    }
    for (ptr, size) in held {
        // SAFETY: allocated above from `mr` with `size`, freed once, nothing uses it.
        unsafe { mr.deallocate(ptr, size, stream) }.expect("deallocate");
    }
}

/// Zero bytes is the null pointer, and freeing it is a no-op that leaves the resource working.
pub fn zero_size<R: MemoryResource>(case: &Case<R>, stream: Stream) {
    let mr = &case.mr;
    for _ in 0..3 {
        let ptr = mr.allocate(0, stream).expect("allocate(0)");
        assert_eq!(ptr, 0, "{}: allocate(0) is not null", mr.name());
        // SAFETY: the null pointer with 0 bytes is the documented no-op free.
        unsafe { mr.deallocate(ptr, 0, stream) }.expect("deallocate(0, 0)");
    }
    let ptr = mr
        .allocate(256, stream)
        .expect("allocate after zero-size calls");
    assert_ne!(ptr, 0);
    // SAFETY: allocated just above with 256 bytes, freed once.
    unsafe { mr.deallocate(ptr, 256, stream) }.expect("deallocate");
}

/// An adaptor's `upstream()` is the resource it was built over.
pub fn upstream_accessor<R: MemoryResource>(case: &Case<R>) {
    if let Some((given, get)) = &case.upstream {
        let got = get(&case.mr);
        assert!(
            std::ptr::addr_eq(Arc::as_ptr(given), Arc::as_ptr(&got)),
            "{}: upstream() is not the resource it was built over",
            case.mr.name()
        );
        assert_eq!(got.name(), given.name());
    }
}

/// Running out is `OutOfMemory`, and the resource allocates again after the frees.
pub fn out_of_memory<R: MemoryResource>(case: &Case<R>, stream: Stream) {
    let mr = &case.mr;
    let name = mr.name();
    let mut held = Vec::new();
    let mut error = None;
    for _ in 0..case.oom_count {
        match mr.allocate(case.oom_size, stream) {
            Ok(ptr) => held.push(ptr),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    let error = error.unwrap_or_else(|| {
        panic!(
            "{name}: {} allocations of {} bytes did not run out",
            case.oom_count, case.oom_size
        )
    });
    assert!(
        error.is_out_of_memory(),
        "{name}: running out is not OutOfMemory: {error:?}"
    );
    assert!(!error.to_string().is_empty());
    for ptr in held {
        // SAFETY: allocated above from `mr` with `oom_size`, freed once, nothing uses it.
        unsafe { mr.deallocate(ptr, case.oom_size, stream) }.expect("deallocate");
    }
    let size = case.max_size.min(MIB);
    let ptr = mr
        .allocate(size, stream)
        .unwrap_or_else(|e| panic!("{name}: does not allocate after out of memory: {e}"));
    // SAFETY: allocated just above with `size`, freed once.
    unsafe { mr.deallocate(ptr, size, stream) }.expect("deallocate");
}

/// Four threads allocating and freeing at once never hold overlapping ranges.
pub fn threads<R: MemoryResource>(case: &Case<R>, stream: Stream) {
    let mr = &case.mr;
    let live = Mutex::new(BTreeMap::new());
    let sizes = sizes(case.max_size.min(MIB));
    let ops = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for t in 0..4usize {
            let (live, sizes, ops) = (&live, &sizes, &ops);
            scope.spawn(move || {
                // Threads start with no current context; real memory may need one.
                let _ctx = (is_real(mr) && rrmm::cuda::driver_available())
                    .then(|| rrmm::cuda::ContextGuard::new(mr.device().unwrap_or(0)));
                let mut mine = Vec::new();
                for i in 0..150usize {
                    if mine.len() < 8 && (i * 7 + t) % 3 != 0 {
                        let size = sizes[(i * 13 + t * 5) % sizes.len()];
                        let ptr = mr.allocate(size, stream).expect("allocate");
                        insert_disjoint(&mut live.lock().unwrap(), ptr, size, mr.name());
                        mine.push((ptr, size));
                    } else if let Some((ptr, size)) = mine.pop() {
                        live.lock().unwrap().remove(&ptr);
                        // SAFETY: allocated by this thread from `mr` with `size`, freed once.
                        unsafe { mr.deallocate(ptr, size, stream) }.expect("deallocate");
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                for (ptr, size) in mine {
                    live.lock().unwrap().remove(&ptr);
                    // SAFETY: allocated by this thread from `mr` with `size`, freed once.
                    unsafe { mr.deallocate(ptr, size, stream) }.expect("deallocate");
                }
            });
        }
    });
    assert_eq!(ops.load(Ordering::Relaxed), 600);
    assert!(live.lock().unwrap().is_empty());
}

/// Instantiates the suite for one resource: `conformance!(name, [attributes], stream, case)`
/// makes a module `name` with one test per check, each building a fresh `case` (a
/// [`Case`] expression) and running on `stream`.
macro_rules! conformance {
    ($name:ident, $attrs:tt, $stream:expr, $case:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            conformance!(@check $attrs, round_trips, ($case, $stream));
            conformance!(@check $attrs, alignment, ($case, $stream));
            conformance!(@check $attrs, zero_size, ($case, $stream));
            conformance!(@check $attrs, upstream_accessor, ($case));
            conformance!(@check $attrs, out_of_memory, ($case, $stream));
            conformance!(@check $attrs, threads, ($case, $stream));
        }
    };
    // One test: the check `$check` of the module above, on a fresh case (and the stream).
    (@check [$($attr:meta),*], $check:ident, ($case:expr, $stream:expr)) => {
        $(#[$attr])*
        #[test]
        fn $check() {
            let (case, stream) = ($case, $stream);
            super::$check(&case, stream);
        }
    };
    (@check [$($attr:meta),*], $check:ident, ($case:expr)) => {
        $(#[$attr])*
        #[test]
        fn $check() {
            super::$check(&$case);
        }
    };
}

// ---- CPU: every resource and adaptor over simulated memory (or the system allocator) ----

/// A simulated device of 1 GiB.
fn sim() -> SharedResource {
    Arc::new(SimulatedMemoryResource::new(1 << 30))
}

/// An adaptor case over a fresh simulated device.
fn adaptor<R: MemoryResource>(
    make: impl FnOnce(SharedResource) -> R,
    get: fn(&R) -> SharedResource,
) -> Case<R> {
    let up = sim();
    let mut case = Case::new(make(up.clone()));
    case.upstream = Some((up, get));
    case
}

conformance!(
    simulated,
    [],
    Stream::DEFAULT,
    Case::new(SimulatedMemoryResource::new(1 << 30))
);

conformance!(system, [], Stream::DEFAULT, {
    let mut case = Case::new(SystemMemoryResource::new());
    // Beyond what a host can map: the layout is refused or malloc returns null.
    case.oom_size = usize::MAX - 4096;
    case
});

conformance!(pool, [], Stream::DEFAULT, {
    let mut case = adaptor(
        |up| PoolMemoryResource::new(up, Some(64 * MIB), Some(512 * MIB)).unwrap(),
        |r| r.upstream().clone(),
    );
    (case.oom_size, case.oom_count) = (64 * MIB, 16);
    case
});

// The expandable pool over simulated virtual memory (256 MiB of pages, 2 MiB each).
conformance!(expandable, [], Stream::DEFAULT, {
    let vm = SimulatedVirtualMemory::new(256 * MIB, 1024 * MIB, 2 * MIB).unwrap();
    let mut case = Case::new(
        ExpandableMemoryResource::new(
            Arc::new(vm),
            ExpandableSizes {
                maximum_pool_size: Some(128 * MIB),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    (case.oom_size, case.oom_count) = (64 * MIB, 8);
    case
});

// The adaptor Python puts in front of the source resources (every free checked).
conformance!(checked, [], Stream::DEFAULT, {
    adaptor(CheckedResourceAdaptor::new, |r| r.upstream().clone())
});

// The managed-memory cache over a simulated device (its own growth, reuse and give-back; on the
// GPU below over cuMemAllocManaged).
conformance!(managed_cache, [], Stream::DEFAULT, {
    let mut case = adaptor(
        |up| ManagedMemoryResource::over(up, Some(64 * MIB)),
        |r| r.source().clone(),
    );
    (case.oom_size, case.oom_count) = (64 * MIB, 32);
    case
});

conformance!(fixed_size, [], Stream::DEFAULT, {
    let mut case = adaptor(
        |up| FixedSizeMemoryResource::new(up, MIB, 16).unwrap(),
        |r| r.upstream().clone(),
    );
    case.max_size = MIB;
    // 1 GiB of simulated memory holds fewer than 1100 blocks of 1 MiB.
    (case.oom_size, case.oom_count) = (MIB, 1100);
    case
});

conformance!(binning, [], Stream::DEFAULT, {
    let up = sim();
    let pool: SharedResource =
        Arc::new(PoolMemoryResource::new(up, Some(64 * MIB), Some(512 * MIB)).unwrap());
    let mut case = Case::new(BinningMemoryResource::new(pool.clone(), Some(10), Some(20)).unwrap());
    case.upstream = Some((pool, |r: &BinningMemoryResource| r.upstream().clone()));
    (case.oom_size, case.oom_count) = (64 * MIB, 16);
    case
});

conformance!(arena, [], Stream::DEFAULT, {
    let mut case = adaptor(
        |up| ArenaMemoryResource::new(up, Some(512 * MIB), false).unwrap(),
        |r| r.upstream().clone(),
    );
    (case.oom_size, case.oom_count) = (64 * MIB, 16);
    case
});

conformance!(callback, [], Stream::DEFAULT, {
    let up = sim();
    let (a, d) = (up.clone(), up);
    Case::new(CallbackMemoryResource::new(
        Box::new(move |bytes, stream| a.allocate(bytes, stream)),
        Box::new(move |ptr, bytes, stream| {
            // SAFETY: the callback resource passes on the caller's frees, and the suite frees
            // each pointer of `a` once, with its size, with no work pending on it.
            unsafe { d.deallocate(ptr, bytes, stream) }
        }),
        MemoryKind::Simulated,
    ))
});

conformance!(aligned, [], Stream::DEFAULT, {
    let mut case = adaptor(
        |up| AlignedResourceAdaptor::new(up, 4 * KIB, 64 * KIB).unwrap(),
        |r| r.upstream().clone(),
    );
    // Requests of 64 KiB and more are 4 KiB-aligned; smaller ones keep the 256 of the base.
    case.alignment = ALLOCATION_ALIGNMENT;
    case
});

conformance!(failure_callback, [], Stream::DEFAULT, {
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let callback: FailureCallback = Box::new(move |_bytes| {
        // Retry once per failure, then give up.
        Ok(seen.fetch_add(1, Ordering::Relaxed) % 2 == 0)
    });
    adaptor(
        |up| FailureCallbackResourceAdaptor::new(up, callback),
        |r| r.upstream().clone(),
    )
});

conformance!(limiting, [], Stream::DEFAULT, {
    let mut case = adaptor(
        |up| LimitingResourceAdaptor::new(up, 128 * MIB),
        |r| r.upstream().clone(),
    );
    (case.oom_size, case.oom_count) = (32 * MIB, 8);
    case
});

conformance!(logging, [], Stream::DEFAULT, {
    let path = std::env::temp_dir().join(format!(
        "rrmm_conformance_{}_{:?}.csv",
        std::process::id(),
        std::thread::current().id()
    ));
    adaptor(
        |up| LoggingResourceAdaptor::new(up, path.to_str().unwrap(), false).unwrap(),
        |r| r.upstream().clone(),
    )
});

conformance!(prefetch, [], Stream::DEFAULT, {
    adaptor(PrefetchResourceAdaptor::new, |r| r.upstream().clone())
});

conformance!(statistics, [], Stream::DEFAULT, {
    adaptor(StatisticsResourceAdaptor::new, |r| r.upstream().clone())
});

// The fallback over two simulated devices: the primary first, the alternate when it is full.
conformance!(fallback, [], Stream::DEFAULT, {
    let alternate: SharedResource = Arc::new(SimulatedMemoryResource::new(256 * MIB));
    let mut case = adaptor(
        |up| FallbackResourceAdaptor::new(up, alternate),
        |r| r.upstream().clone(),
    );
    (case.oom_size, case.oom_count) = (256 * MIB, 8);
    case
});

// Three tiers of simulated memory (the device, a peer, the host in the plans).
conformance!(tiered, [], Stream::DEFAULT, {
    let up = sim();
    let tiers = vec![
        Tier::new("device", up.clone()),
        Tier::new("peer", Arc::new(SimulatedMemoryResource::new(256 * MIB))),
        Tier::new("host", Arc::new(SimulatedMemoryResource::new(256 * MIB))),
    ];
    let mut case = Case::new(TieredMemoryResource::new(tiers).unwrap());
    case.upstream = Some((up, |r: &TieredMemoryResource| {
        r.tiers().next().map(|t| t.resource.clone()).unwrap()
    }));
    (case.oom_size, case.oom_count) = (256 * MIB, 8);
    case
});

// Two tags, each an expandable pool over host virtual memory (reservations of their own); the
// calling thread's tag is none (the first tag's pool).
conformance!(tagged, [], Stream::DEFAULT, {
    let pool = || {
        let vm = HostVirtualMemory::new(256 * MIB, Some(2 * MIB), false, None).unwrap();
        ExpandableMemoryResource::new(
            Arc::new(vm),
            ExpandableSizes {
                maximum_pool_size: Some(128 * MIB),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let mr = TaggedMemoryResource::new("weights", pool());
    mr.add_tag("kv_cache", pool()).unwrap();
    let mut case = Case::new(mr);
    (case.oom_size, case.oom_count) = (64 * MIB, 4);
    case
});

conformance!(tracking, [], Stream::DEFAULT, {
    adaptor(
        |up| TrackingResourceAdaptor::new(up, false),
        |r| r.upstream().clone(),
    )
});

/// The statistics and tracking adaptors count back to zero after the suite's round trips, and
/// the failure callback ran on out of memory.
#[test]
fn adaptor_counters_return_to_zero_and_callbacks_run() {
    let stats = Case::new(StatisticsResourceAdaptor::new(sim()));
    round_trips(&stats, Stream::DEFAULT);
    let counts = stats.mr.allocation_counts();
    assert_eq!(counts.current_bytes, 0, "{counts:?}");
    assert_eq!(counts.current_count, 0, "{counts:?}");
    assert!(counts.peak_bytes >= 8 * MIB as i64, "{counts:?}");
    assert_eq!(
        counts.total_count,
        2 * sizes(8 * MIB).len() as i64,
        "{counts:?}"
    );

    let tracking = Case::new(TrackingResourceAdaptor::new(sim(), false));
    round_trips(&tracking, Stream::DEFAULT);
    assert_eq!(tracking.mr.allocated_bytes(), 0);
    assert!(tracking.mr.outstanding_allocations().is_empty());

    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let failing = FailureCallbackResourceAdaptor::new(
        sim(),
        Box::new(move |_| {
            seen.fetch_add(1, Ordering::Relaxed);
            Ok(false)
        }),
    );
    out_of_memory(&Case::new(failing), Stream::DEFAULT);
    assert_eq!(calls.load(Ordering::Relaxed), 1);
}

// ---- The suite itself fails on resources that break the contract ----

/// A resource that breaks one promise: `shift` added to every pointer of a simulated device,
/// every request served at the same address (`overlap`), or failures as logic errors.
/// A resource that breaks the contract on purpose (shifted or overlapping pointers, logic errors
/// where out of memory is due), to check that the suite catches it. (Not a
/// `CallbackMemoryResource`: that one refuses misaligned pointers itself.)
struct Broken {
    up: SimulatedMemoryResource,
    fixed: usize,
    shift: usize,
    overlap: bool,
    logic_errors: bool,
}

impl MemoryResource for Broken {
    fn allocate(&self, bytes: usize, stream: Stream) -> rrmm::Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        if self.logic_errors && bytes > 64 * MIB {
            return Err(rrmm::Error::Logic("refused".into()));
        }
        if self.overlap {
            return Ok(self.fixed);
        }
        self.up.allocate(bytes, stream).map(|p| p + self.shift)
    }

    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> rrmm::Result<()> {
        if self.overlap || ptr == 0 {
            return Ok(());
        }
        // SAFETY: the pointer came from `up` shifted by `shift`, freed once with its size.
        unsafe { self.up.deallocate(ptr - self.shift, bytes, stream) }
    }

    fn kind(&self) -> MemoryKind {
        MemoryKind::Simulated
    }

    fn name(&self) -> &'static str {
        "broken"
    }
}

fn broken(shift: usize, overlap: bool, logic_errors: bool) -> Case<Broken> {
    let up = SimulatedMemoryResource::new(1 << 30);
    let fixed = up.allocate(16 * MIB, Stream::DEFAULT).unwrap();
    Case::new(Broken {
        up,
        fixed,
        shift,
        overlap,
        logic_errors,
    })
}

#[test]
#[should_panic(expected = "overlaps live")]
fn the_suite_catches_overlapping_allocations() {
    round_trips(&broken(0, true, false), Stream::DEFAULT);
}

#[test]
#[should_panic(expected = "is not 256-aligned")]
fn the_suite_catches_misaligned_allocations() {
    alignment(&broken(64, false, false), Stream::DEFAULT);
}

#[test]
#[should_panic(expected = "running out is not OutOfMemory")]
fn the_suite_catches_out_of_memory_of_the_wrong_type() {
    out_of_memory(&broken(0, false, true), Stream::DEFAULT);
}

// ---- GPU: the CUDA source resources, on the default stream and on an owned stream ----

mod gpu {
    use super::*;
    use rrmm::cuda::OwnedStream;
    use rrmm::resource::UncachedManagedMemoryResource;
    use rrmm::{
        CudaAsyncManagedMemoryResource, CudaAsyncMemoryResource, CudaAsyncViewMemoryResource,
        CudaMemoryResource, ManagedMemoryResource, PinnedHostMemoryResource,
    };

    /// `stream`, with device 0's context made current on the test's thread (the data checks'
    /// copies and stream synchronisations need one).
    fn on(stream: Stream) -> Stream {
        rrmm::cuda::set_current_device(0).expect("a CUDA device");
        stream
    }

    /// A non-blocking stream that lives for the rest of the test process (the suite's
    /// functions take a plain [`Stream`]).
    fn owned_stream() -> Stream {
        rrmm::cuda::set_current_device(0).expect("a CUDA device");
        let owned: &'static OwnedStream =
            Box::leak(Box::new(OwnedStream::new(true).expect("a CUDA stream")));
        owned.stream()
    }

    conformance!(cuda, [ignore = "needs a CUDA GPU"], on(Stream::DEFAULT), {
        Case::new(CudaMemoryResource::new().expect("a CUDA device"))
    });
    conformance!(
        cuda_on_stream,
        [ignore = "needs a CUDA GPU"],
        owned_stream(),
        { Case::new(CudaMemoryResource::new().expect("a CUDA device")) }
    );
    conformance!(
        managed,
        [ignore = "needs a CUDA GPU"],
        on(Stream::DEFAULT),
        { Case::new(ManagedMemoryResource::new().expect("a CUDA device")) }
    );
    conformance!(
        cuda_async,
        [ignore = "needs a CUDA GPU"],
        on(Stream::DEFAULT),
        {
            Case::new(CudaAsyncMemoryResource::new(None, None, Default::default()).expect("a pool"))
        }
    );
    conformance!(
        cuda_async_on_stream,
        [ignore = "needs a CUDA GPU"],
        owned_stream(),
        {
            Case::new(CudaAsyncMemoryResource::new(None, None, Default::default()).expect("a pool"))
        }
    );
    conformance!(
        cuda_async_per_thread,
        [ignore = "needs a CUDA GPU"],
        on(Stream::PER_THREAD),
        {
            Case::new(CudaAsyncMemoryResource::new(None, None, Default::default()).expect("a pool"))
        }
    );
    conformance!(
        cuda_async_view,
        [ignore = "needs a CUDA GPU"],
        owned_stream(),
        {
            // The pool the view uses lives as long as the test process.
            let owner: &'static CudaAsyncMemoryResource = Box::leak(Box::new(
                CudaAsyncMemoryResource::new(None, None, Default::default()).expect("a pool"),
            ));
            // SAFETY: the handle is the live pool of `owner`, which is never dropped.
            Case::new(unsafe { CudaAsyncViewMemoryResource::new(owner.pool_handle()) }.unwrap())
        }
    );
    conformance!(
        uncached_managed,
        [ignore = "needs a CUDA GPU"],
        on(Stream::DEFAULT),
        { Case::new(UncachedManagedMemoryResource::new().expect("a CUDA device")) }
    );
    conformance!(
        arena_over_cuda,
        [ignore = "needs a CUDA GPU"],
        owned_stream(),
        {
            let up: SharedResource = Arc::new(CudaMemoryResource::new().expect("a CUDA device"));
            let arena = ArenaMemoryResource::new(up.clone(), Some(512 * MIB), false).unwrap();
            let mut case = Case::new(arena);
            case.upstream = Some((up, |r: &ArenaMemoryResource| r.upstream().clone()));
            (case.oom_size, case.oom_count) = (64 * MIB, 16);
            case
        }
    );
    conformance!(
        arena_per_thread,
        [ignore = "needs a CUDA GPU"],
        on(Stream::PER_THREAD),
        {
            let up: SharedResource = Arc::new(CudaMemoryResource::new().expect("a CUDA device"));
            let mut case = Case::new(ArenaMemoryResource::new(up, Some(512 * MIB), false).unwrap());
            (case.oom_size, case.oom_count) = (64 * MIB, 16);
            case
        }
    );
    conformance!(
        cuda_async_managed,
        [ignore = "needs a CUDA GPU"],
        on(Stream::DEFAULT),
        { Case::new(CudaAsyncManagedMemoryResource::new().expect("a managed pool")) }
    );
    conformance!(
        pinned,
        [ignore = "needs a CUDA GPU"],
        on(Stream::DEFAULT),
        {
            let mut case = Case::new(PinnedHostMemoryResource::new().expect("a CUDA device"));
            // 4 PiB of pinned host memory cannot be had.
            case.oom_size = 1 << 52;
            case
        }
    );
    conformance!(
        system_on_stream,
        [ignore = "needs a CUDA GPU"],
        owned_stream(),
        {
            let mut case = Case::new(SystemMemoryResource::new());
            case.oom_size = usize::MAX - 4096;
            case
        }
    );
    conformance!(
        pool_over_cuda,
        [ignore = "needs a CUDA GPU"],
        owned_stream(),
        {
            let up: SharedResource = Arc::new(CudaMemoryResource::new().expect("a CUDA device"));
            let mut case = Case::new(
                PoolMemoryResource::new(up.clone(), Some(64 * MIB), Some(512 * MIB)).unwrap(),
            );
            case.upstream = Some((up, |r: &PoolMemoryResource| r.upstream().clone()));
            (case.oom_size, case.oom_count) = (64 * MIB, 16);
            case
        }
    );
}
