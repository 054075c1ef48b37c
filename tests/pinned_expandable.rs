//! The expandable pool on host memory (the pinned expandable pool without its registration, so
//! it runs without a GPU): patterns that change do not grow the footprint, memory written
//! survives growth, and `trim` gives pages back.

use proptest::prelude::*;
use rrmm::cuda::Stream;
use rrmm::resource::{HostVirtualMemory, MemoryResource};
use rrmm::suballocator::{ExpandableMemoryResource, ExpandableSizes};
use std::sync::Arc;

const MIB: usize = 1 << 20;
const PAGE: usize = 2 * MIB;

fn pool(reserve: usize) -> ExpandableMemoryResource {
    let vm = HostVirtualMemory::new(reserve, Some(PAGE), false, None).unwrap();
    ExpandableMemoryResource::new(
        Arc::new(vm),
        ExpandableSizes {
            initial_pool_size: Some(0),
            ..Default::default()
        },
    )
    .unwrap()
}

fn free(mr: &ExpandableMemoryResource, ptrs: Vec<usize>, bytes: usize) {
    for p in ptrs {
        // SAFETY: allocated by `mr` with `bytes`, freed once.
        unsafe { mr.deallocate(p, bytes, Stream::DEFAULT) }.unwrap();
    }
}

/// The pattern at 1/64 scale: 10 x 16 MiB, then 20 x 8 MiB, then 5 x 32 MiB (10 x 1 GiB,
/// 20 x 512 MiB, 5 x 2 GiB on a real machine): the footprint stays at the first phase's.
#[test]
fn changing_patterns_reuse_the_same_pages() {
    let mr = pool(1024 * MIB);
    let phases = [(10, 16 * MIB), (20, 8 * MIB), (5, 32 * MIB), (10, 16 * MIB)];
    let mut footprints = Vec::new();
    for (count, bytes) in phases {
        let ptrs: Vec<usize> = (0..count)
            .map(|_| mr.allocate(bytes, Stream::DEFAULT).unwrap())
            .collect();
        footprints.push(mr.mapped_bytes());
        free(&mr, ptrs, bytes);
    }
    // The first phase maps what it needs (160 MiB and at most a page of growth rounding); the
    // later ones map nothing more.
    assert!(
        (160 * MIB..=160 * MIB + PAGE).contains(&footprints[0]),
        "{footprints:?}"
    );
    assert_eq!(footprints, vec![footprints[0]; 4]);
    assert_eq!(mr.trim(0).unwrap(), footprints[0]);
    assert_eq!(mr.mapped_bytes(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random allocations: each buffer's bytes (written on the host) survive every later
    /// growth, free and trim, and the pool never maps more than twice what is live plus a page
    /// per allocation once trimmed.
    #[test]
    fn bytes_survive_growth_and_trim(sizes in prop::collection::vec(1usize..6 * MIB, 1..24),
                                     frees in prop::collection::vec(any::<bool>(), 24)) {
        let mr = pool(512 * MIB);
        let mut live: Vec<(usize, usize, u8)> = Vec::new();
        for (i, &bytes) in sizes.iter().enumerate() {
            let p = mr.allocate(bytes, Stream::DEFAULT).unwrap();
            let tag = i as u8 + 1;
            // SAFETY: `p` holds `bytes` bytes of host memory, live.
            unsafe { std::ptr::write_bytes(p as *mut u8, tag, bytes) };
            live.push((p, bytes, tag));
            if frees[i] {
                let (q, b, _) = live.remove(live.len() / 2);
                // SAFETY: allocated above, freed once.
                unsafe { mr.deallocate(q, b, Stream::DEFAULT) }.unwrap();
                mr.trim(0).unwrap();
            }
            for &(q, b, t) in &live {
                // SAFETY: live allocations of host memory.
                let s = unsafe { std::slice::from_raw_parts(q as *const u8, b) };
                prop_assert!(s[0] == t && s[b - 1] == t && s[b / 2] == t);
            }
        }
        mr.trim(0).unwrap();
        let in_use: usize = live.iter().map(|&(_, b, _)| b.next_multiple_of(PAGE) + PAGE).sum();
        prop_assert!(mr.mapped_bytes() <= in_use);
        for (q, b, _) in live {
            // SAFETY: allocated above, freed once.
            unsafe { mr.deallocate(q, b, Stream::DEFAULT) }.unwrap();
        }
        mr.trim(0).unwrap();
        prop_assert_eq!(mr.mapped_bytes(), 0);
    }
}
