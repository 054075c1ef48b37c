use super::*;
use crate::resource::SimulatedMemoryResource;
use crate::test_support::free;
use proptest::prelude::*;
use std::sync::Arc;

const MIB: usize = 1 << 20;

/// Three simulated devices standing for the device, a peer GPU and host memory.
fn three(
    device: usize,
    peer: usize,
    host: usize,
) -> (Vec<Arc<SimulatedMemoryResource>>, TieredMemoryResource) {
    let sims: Vec<_> = [device, peer, host]
        .iter()
        .map(|&s| Arc::new(SimulatedMemoryResource::new(s)))
        .collect();
    let tiers = ["device", "peer", "host"]
        .iter()
        .zip(&sims)
        .map(|(n, s)| Tier::new(*n, s.clone() as SharedResource))
        .collect();
    (sims.clone(), TieredMemoryResource::new(tiers).unwrap())
}

#[test]
fn fills_the_tiers_in_order_and_frees_each_where_it_came_from() {
    let (sims, mr) = three(8 * MIB, 4 * MIB, 16 * MIB);
    let a = mr.allocate(6 * MIB, Stream::DEFAULT).unwrap();
    let b = mr.allocate(4 * MIB, Stream::DEFAULT).unwrap(); // device full: the peer
    let c = mr.allocate(4 * MIB, Stream::DEFAULT).unwrap(); // both full: host
    let d = mr.allocate(MIB, Stream::DEFAULT).unwrap(); // fits the device again
    assert_eq!(
        [a, b, c, d].map(|p| mr.tier_of(p)),
        [Some(0), Some(1), Some(2), Some(0)]
    );
    assert!(sims[1].owns(b) && sims[2].owns(c));
    let counts = mr.tier_counts();
    assert_eq!(counts[0].current_bytes, 7 * MIB);
    assert_eq!((counts[1].current_bytes, counts[1].refused), (4 * MIB, 1));
    assert_eq!(
        (counts[2].current_allocations, counts[2].name.as_str()),
        (1, "host")
    );
    assert_eq!(counts[0].refused, 2);
    // Checked frees: wrong size, unknown pointer.
    assert!(matches!(free(&mr, b, MIB), Err(Error::Logic(_))));
    assert!(matches!(free(&mr, b + 256, 4 * MIB), Err(Error::Logic(_))));
    for (p, n) in [(a, 6 * MIB), (b, 4 * MIB), (c, 4 * MIB), (d, MIB)] {
        free(&mr, p, n).unwrap();
    }
    assert!(matches!(free(&mr, a, 6 * MIB), Err(Error::Logic(_))));
    assert!(sims.iter().all(|s| s.bytes_in_use() == 0));
    let counts = mr.tier_counts();
    assert_eq!(counts[1].peak_bytes, 4 * MIB);
    assert_eq!(counts[0].total_allocations, 2);
    // All full: out of memory naming every tier, counted.
    let err = mr.allocate(64 * MIB, Stream::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory());
    assert!(err.to_string().contains("peer (simulated):"), "{err}");
    assert_eq!(mr.failures(), 1);
    assert_eq!(mr.allocate(0, Stream::DEFAULT).unwrap(), 0);
    free(&mr, 0, 0).unwrap();
    assert_eq!(mr.upstreams().len(), 3);
    assert_eq!(mr.call_profile(), CallProfile::QUICK);
}

#[test]
fn bad_tier_lists_are_refused() {
    assert!(TieredMemoryResource::new(Vec::new()).is_err());
    let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(MIB));
    let twice = vec![Tier::new("a", sim.clone()), Tier::new("a", sim)];
    assert!(matches!(
        TieredMemoryResource::new(twice),
        Err(Error::InvalidArgument { .. })
    ));
}

#[test]
fn the_snapshot_tags_every_segment_with_its_tier() {
    let device: SharedResource = Arc::new(
        crate::PoolMemoryResource::new(
            Arc::new(SimulatedMemoryResource::new(8 * MIB)),
            Some(4 * MIB),
            Some(4 * MIB),
        )
        .unwrap(),
    );
    let peer: SharedResource = Arc::new(SimulatedMemoryResource::new(8 * MIB));
    let mr = TieredMemoryResource::new(vec![Tier::new("device", device), Tier::new("peer", peer)])
        .unwrap();
    let a = mr.allocate(3 * MIB, Stream::DEFAULT).unwrap();
    let b = mr.allocate(3 * MIB, Stream::DEFAULT).unwrap();
    let segments = mr.memory_snapshot().unwrap();
    let tiers: Vec<_> = segments.iter().map(|s| s.tier.clone().unwrap()).collect();
    assert_eq!(tiers, ["device", "peer"]);
    assert_eq!(segments[1].address, b);
    assert_eq!(segments[1].allocated_size(), 3 * MIB);
    let f = mr.footprint();
    assert_eq!(f.held_bytes, 4 * MIB + 3 * MIB);
    assert_eq!(f.free_bytes, MIB);
    free(&mr, a, 3 * MIB).unwrap();
    free(&mr, b, 3 * MIB).unwrap();
}

#[derive(Clone, Debug)]
enum Op {
    Alloc(usize),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => prop_oneof![1usize..4096, MIB..5 * MIB].prop_map(Op::Alloc),
        2 => any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    /// Generated allocations and frees against a model of the tiers: each allocation lands on
    /// the first tier with room (a full tier falls to the next), each free goes back to its
    /// tier, and the counters match the model's at every step.
    #[test]
    fn tiers_match_a_model(
        caps in prop::collection::vec(0usize..12, 3),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let (sims, mr) = three(caps[0] * MIB, caps[1] * MIB, caps[2] * MIB);
        let caps: Vec<usize> = sims.iter().map(|s| s.size()).collect();
        let mut used = [0usize; 3];
        let mut model = vec![TierCounts::default(); 3];
        let mut live: Vec<(usize, usize, usize)> = Vec::new();
        let mut failures = 0u64;
        for op in ops {
            match op {
                Op::Alloc(bytes) => {
                    let charge = SimulatedMemoryResource::charged_bytes(bytes);
                    let fits = (0..3).find(|&i| used[i] + charge <= caps[i]);
                    let got = mr.allocate(bytes, Stream::DEFAULT);
                    let refused_until = fits.unwrap_or(3);
                    for m in &mut model[..refused_until] { m.refused += 1; }
                    match fits {
                        Some(t) => {
                            let ptr = got.unwrap();
                            prop_assert_eq!(mr.tier_of(ptr), Some(t));
                            prop_assert!(sims[t].owns(ptr));
                            used[t] += charge;
                            let m = &mut model[t];
                            m.current_bytes += bytes;
                            m.peak_bytes = m.peak_bytes.max(m.current_bytes);
                            m.total_bytes += bytes as u128;
                            m.current_allocations += 1;
                            m.peak_allocations = m.peak_allocations.max(m.current_allocations);
                            m.total_allocations += 1;
                            live.push((ptr, bytes, t));
                        }
                        None => {
                            prop_assert!(got.unwrap_err().is_out_of_memory());
                            failures += 1;
                        }
                    }
                }
                Op::Free(i) if !live.is_empty() => {
                    let (ptr, bytes, t) = live.swap_remove(i % live.len());
                    free(&mr, ptr, bytes).unwrap();
                    used[t] -= SimulatedMemoryResource::charged_bytes(bytes);
                    model[t].current_bytes -= bytes;
                    model[t].current_allocations -= 1;
                    prop_assert!(matches!(free(&mr, ptr, bytes), Err(Error::Logic(_))));
                }
                Op::Free(_) => {}
            }
            let counts = mr.tier_counts();
            for t in 0..3 {
                let c = &counts[t];
                let m = &model[t];
                prop_assert_eq!(
                    (c.current_bytes, c.peak_bytes, c.total_bytes, c.current_allocations,
                     c.peak_allocations, c.total_allocations, c.refused),
                    (m.current_bytes, m.peak_bytes, m.total_bytes, m.current_allocations,
                     m.peak_allocations, m.total_allocations, m.refused)
                );
                prop_assert_eq!(sims[t].bytes_in_use(), used[t]);
            }
            prop_assert_eq!(mr.failures(), failures);
        }
        for (ptr, bytes, _) in live {
            free(&mr, ptr, bytes).unwrap();
        }
        prop_assert!(sims.iter().all(|s| s.bytes_in_use() == 0));
        prop_assert!(mr.tier_counts().iter().all(|c| c.current_bytes == 0));
    }
}

#[test]
fn held_bytes_is_the_footprints_without_its_walk() {
    // A pool on the first tier (its footprint walks its free lists; its held bytes are a
    // counter), plain simulated tiers after it, and a tier named twice (counted once).
    let device: SharedResource = Arc::new(SimulatedMemoryResource::new(64 * MIB));
    let pool: SharedResource = Arc::new(
        crate::suballocator::PoolMemoryResource::new(device, Some(8 * MIB), None).unwrap(),
    );
    let host: SharedResource = Arc::new(SimulatedMemoryResource::new(64 * MIB));
    let mr = TieredMemoryResource::new(vec![
        Tier::new("device", pool),
        Tier::new("host", host.clone()),
        Tier::new("again", host),
    ])
    .unwrap();
    let report = mr.report().unwrap();
    let mut live = Vec::new();
    for (i, size) in [3 * MIB, 70 * MIB, MIB, 5 * MIB, 20 * MIB]
        .into_iter()
        .enumerate()
    {
        if let Ok(p) = mr.allocate(size, Stream::DEFAULT) {
            live.push((p, size));
        }
        if i % 2 == 1 {
            let (p, size) = live.remove(0);
            free(&mr, p, size).unwrap();
        }
        assert_eq!(report.held_bytes(), report.footprint().held_bytes);
    }
    assert!(report.held_bytes() > 0);
    for (p, size) in live {
        free(&mr, p, size).unwrap();
    }
    assert_eq!(report.held_bytes(), report.footprint().held_bytes);
}
