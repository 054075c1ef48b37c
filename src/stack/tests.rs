//! Tests of the builder: every kind on simulated memory, options, rounding.

use super::*;
use crate::MemoryResource;

fn build(name: &str, simulate: Option<usize>, options: &StackOptions) -> Result<BuiltStack> {
    super::build(name, Target::from_simulate(simulate), options)
}

fn build_resource(
    name: &str,
    simulate: Option<usize>,
    initial_pool_size: Option<usize>,
    maximum_pool_size: Option<usize>,
) -> Result<SharedResource> {
    let options = StackOptions {
        initial_pool_size,
        maximum_pool_size,
        ..StackOptions::default()
    };
    Ok(build(name, simulate, &options)?.resource)
}

fn build_resource_sized(
    name: &str,
    simulate: Option<usize>,
    arena_size: Option<usize>,
) -> Result<SharedResource> {
    let options = StackOptions {
        arena_size,
        ..StackOptions::default()
    };
    Ok(build(name, simulate, &options)?.resource)
}

#[test]
fn builds_simulated_resources_and_rejects_bad_names() {
    for name in ["cuda", "cuda_async", "simulated", "CUDA-Async"] {
        let built = build(name, Some(1 << 20), &StackOptions::default()).unwrap();
        assert_eq!(built.resource.name(), "simulated");
        assert!(built.simulated_device);
        assert!(built.setup.contains("charged in 2 MiB pages"));
    }
    // Managed memory is the device with host memory beyond it: its own row.
    let managed = build("managed", Some(1 << 20), &StackOptions::default()).unwrap();
    assert_eq!(managed.resource.name(), "simulated_managed");
    assert!(!managed.simulated_device);
    assert!(managed.setup.contains("unlimited host memory beyond it"));
    let err = build("nope", Some(1), &StackOptions::default()).unwrap_err();
    assert!(err.to_string().contains("unknown resource \"nope\""));
    // Resources without a pool ignore the pool sizes, so one command line compares all.
    assert!(build_resource("cuda", Some(1 << 20), Some(1), None).is_ok());
    assert!(build_resource("simulated", None, None, None).is_err());
    assert_eq!(kind_names()[..3], ["pool", "expandable", "binning"]);
    assert!(kind_names().contains(&"fixed_size"));
}

#[test]
fn builds_suballocators_over_simulated_memory_with_their_setup() {
    let options = StackOptions {
        initial_pool_size: Some(1 << 20),
        maximum_pool_size: Some(1 << 29),
        ..StackOptions::default()
    };
    let pool = build("pool", Some(1 << 30), &options).unwrap();
    assert_eq!(pool.resource.name(), "pool");
    assert_eq!(
        pool.resource.report().unwrap().footprint().held_bytes,
        1 << 20
    );
    assert_eq!(pool.pool_sizes, Some((1 << 20, Some(1 << 29))));
    assert!(pool.setup.contains("initial 1.00 MiB, maximum 512.00 MiB"));
    let default_pool = build("pool", Some(1 << 30), &StackOptions::default()).unwrap();
    assert!(default_pool
        .setup
        .contains("512.00 MiB (half the free memory)"));
    // Five bins of 128 blocks preallocate 992 MiB: more than a 512 MiB pool may hold.
    let err = build("binning", Some(1 << 30), &options).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let binning = build("binning", Some(1 << 30), &StackOptions::default()).unwrap();
    assert_eq!(binning.resource.name(), "binning");
    assert!(binning
        .setup
        .starts_with("bins 2^18..2^22 (256.00 KiB..4.00 MiB) x 128"));
    let arena = build("arena", Some(1 << 30), &options).unwrap();
    assert_eq!(arena.resource.name(), "arena");
    assert_eq!(
        arena.resource.report().unwrap().footprint().held_bytes,
        1 << 29,
        "pool sizes ignored"
    );
    assert!(arena
        .setup
        .starts_with("global arena of 512.00 MiB (half the free memory)"));
    let sized = build_resource_sized("arena", Some(1 << 30), Some(1 << 24));
    assert_eq!(
        sized.unwrap().report().unwrap().footprint().held_bytes,
        1 << 24
    );
    assert!(build_resource_sized("arena", Some(1 << 30), Some(4096)).is_err());
    let fixed = build("fixed_size", Some(1 << 30), &StackOptions::default()).unwrap();
    assert_eq!(fixed.resource.name(), "fixed_size");
    assert_eq!(fixed.largest_request, Some(1 << 20));
    assert!(fixed.setup.contains("cannot serve requests above 1.00 MiB"));
    // RMM's validation of pool sizes comes through.
    assert!(build_resource("pool", Some(1 << 30), Some(1000), None).is_err());
    assert!(build_resource("binning", Some(1 << 30), Some(1000), None).is_err());
    assert!(build_resource("fixed_size", Some(1 << 30), Some(1000), None).is_ok());
}

#[test]
fn options_shape_the_resources_and_bad_ones_are_named() {
    let options = StackOptions {
        bins: Some((10, 12)),
        block_size: Some(4096),
        blocks: Some(4),
        ..StackOptions::default()
    };
    let binning = build("binning", Some(1 << 30), &options).unwrap();
    assert_eq!(
        binning.rounding,
        BlockRounding::Bins(vec![1024, 2048, 4096])
    );
    assert!(binning
        .setup
        .starts_with("bins 2^10..2^12 (1.00 KiB..4.00 KiB) x 4 blocks"));
    let fixed = build("fixed_size", Some(1 << 30), &options).unwrap();
    assert_eq!(fixed.rounding, BlockRounding::Fixed(4096));
    // 4 blocks of 4 KiB preallocated.
    assert_eq!(
        fixed.resource.report().unwrap().footprint().held_bytes,
        16384
    );
    let bad = StackOptions {
        bins: Some((22, 18)),
        ..StackOptions::default()
    };
    assert!(build("binning", Some(1 << 30), &bad)
        .unwrap_err()
        .to_string()
        .contains("bins"));
    let zero = StackOptions {
        block_size: Some(0),
        ..StackOptions::default()
    };
    assert!(build("fixed_size", Some(1 << 30), &zero).is_err());
}

#[test]
fn block_rounding_of_each_resource() {
    assert_eq!(BlockRounding::Align(256).block(1000), 1024);
    assert_eq!(BlockRounding::Pages.block(1000), 1024);
    assert_eq!(BlockRounding::Pages.block(3 << 20), 4 << 20);
    let bins = BlockRounding::Bins(vec![1 << 18, 1 << 19]);
    assert_eq!(bins.block(1000), 1 << 18);
    assert_eq!(bins.block((1 << 18) + 1), 1 << 19);
    assert_eq!(bins.block((1 << 19) + 1), (1 << 19) + 256);
    assert_eq!(BlockRounding::Fixed(1 << 20).block(10), 1 << 20);
    assert_eq!(BlockRounding::Fixed(1 << 20).block(0), 0);
}

#[test]
fn every_kind_builds_one_handle_per_layer_and_the_top_is_the_resource() {
    for name in kind_names() {
        let target = Target::Simulated(1 << 30);
        let options = StackOptions {
            statistics: true,
            tracking: true,
            allocation_limit: Some(1 << 29),
            ..StackOptions::default()
        };
        let plan = plan(name, target, &options).unwrap();
        let built = build(name, Some(1 << 30), &options).unwrap();
        assert_eq!(built.handles.len(), plan.layers.len(), "{name}");
        let top = built.handles.last().unwrap().resource();
        assert_eq!(top.identity(), built.resource.identity(), "{name}");
        // Adaptors on top in their order: limit, counts, tracking.
        let tail: Vec<_> = plan.layers.iter().rev().take(3).cloned().collect();
        assert_eq!(
            tail,
            vec![
                Layer::Tracking,
                Layer::Statistics,
                Layer::Limit {
                    allocation_limit: 1 << 29
                }
            ],
            "{name}"
        );
        // Only the bottom layer (and a fallback's alternate) is a source resource.
        assert!(!plan.layers[0].needs_upstream(), "{name}");
        assert!(plan.layers[1..].iter().all(Layer::needs_upstream), "{name}");
    }
}

#[test]
fn a_layer_is_built_only_where_it_fits_in_a_stack() {
    let sim = Layer::Simulated {
        size: 1 << 30,
        host_memory: 0,
    };
    let device = sim.build(None, Sources::Raw).unwrap().resource();
    // A source resource over another, an adaptor over nothing: refused with the layer named.
    let err = sim.build(Some(&device), Sources::Raw).unwrap_err();
    assert!(err.to_string().contains("source resource"), "{err}");
    let err = Layer::Statistics.build(None, Sources::Raw).unwrap_err();
    assert!(
        err.to_string()
            .contains("Statistics needs a resource below it"),
        "{err}"
    );
    // A fallback's alternate is a source resource.
    let fallback = Layer::Fallback {
        alternate: Box::new(Layer::Tracking),
    };
    let err = fallback.build(Some(&device), Sources::Raw).unwrap_err();
    assert!(err.to_string().contains("alternate"), "{err}");
    // A simulated device beyond what one can be is a bad argument, not a smaller device.
    let huge = Layer::Simulated {
        size: crate::resource::MAX_SIMULATED_SIZE,
        host_memory: 1,
    };
    let err = huge.build(None, Sources::Raw).unwrap_err();
    assert!(
        err.to_string().contains("larger than a simulated device"),
        "{err}"
    );
    // The handle keeps the concrete type the bindings and reports read.
    let pool = Layer::Pool {
        initial_pool_size: Some(1 << 20),
        maximum_pool_size: None,
    }
    .build(Some(&device), Sources::Raw)
    .unwrap();
    assert!(matches!(pool, Handle::Pool(_, made) if made == 1 << 20));
}

/// `tiered` on a simulated device: a pool over the device, then a simulated peer GPU, then
/// host memory; an allocation beyond the device lands on the peer, beyond both on the host.
#[test]
fn tiered_fills_the_device_then_the_peer_then_the_host() {
    const MIB: usize = 1 << 20;
    let options = StackOptions {
        initial_pool_size: Some(8 * MIB),
        maximum_pool_size: Some(8 * MIB),
        peer_memory: Some(8 * MIB),
        host_memory: Some(64 * MIB),
        ..StackOptions::default()
    };
    let built = build("tiered", Some(8 * MIB), &options).unwrap();
    assert!(
        built.setup.contains("simulated peer GPU of 8.00 MiB"),
        "{}",
        built.setup
    );
    let tiered = built
        .handles
        .iter()
        .find_map(|h| match h {
            Handle::Tiered(t, _) => Some(t.clone()),
            _ => None,
        })
        .expect("a tiered resource");
    assert_eq!(tiered.tier_names(), ["device", "peer", "host"]);
    let mr = &built.resource;
    let ptrs: Vec<usize> = (0..3)
        .map(|_| mr.allocate(6 * MIB, crate::Stream::DEFAULT).unwrap())
        .collect();
    let tiers: Vec<_> = ptrs.iter().map(|&p| tiered.tier_of(p)).collect();
    assert_eq!(tiers, [Some(0), Some(1), Some(2)]);
    for p in ptrs {
        crate::test_support::free(&**mr, p, 6 * MIB).unwrap();
    }
    let counts = tiered.tier_counts();
    assert!(counts
        .iter()
        .all(|c| c.peak_bytes == 6 * MIB && c.current_bytes == 0));
    // The same counters through the top resource's link (what a replay reads), and through a
    // pool built over the stack by hand, which knows nothing of tiers.
    let through_link = mr.link().tiers.expect("the link carries the tiers");
    assert_eq!(through_link.tier_counts(), counts);
    let pool = crate::suballocator::PoolMemoryResource::new(mr.clone(), Some(0), None).unwrap();
    let over = crate::resource::MemoryResource::link(&pool)
        .tiers
        .expect("a pool over it carries them");
    assert_eq!(over.tier_counts(), counts);
    assert!(built.managed_device().is_none());
    // A tier after the first must be a source resource.
    let below = Layer::Simulated {
        size: MIB,
        host_memory: 0,
    }
    .build(None, Sources::Raw)
    .unwrap()
    .resource();
    let bad = Layer::Tiered {
        tiers: vec![("peer".into(), Layer::Statistics)],
    };
    assert!(bad.build(Some(&below), Sources::Raw).is_err());
}

/// The process's figures of a place (what a shared GPU's ledger publishes) through every kind
/// the builder makes, with no resource knowing of them: what is held is counted by the source,
/// what a pool keeps free is counted as cached, and a relief gives every cached byte back. What a
/// resource cannot give back by design counts as live: the arena's one allocation, the chunks
/// of fixed_size (and of binning's bins), kept until they drop as in RMM.
#[test]
fn every_kind_counts_what_it_holds_and_gives_its_cache_back() {
    use crate::cuda::Stream;
    const MIB: usize = 1 << 20;
    for name in kind_names() {
        let options = StackOptions {
            initial_pool_size: Some(0),
            arena_size: Some(256 * MIB),
            ..StackOptions::default()
        };
        let built = build(name, Some(1 << 30), &options).unwrap();
        let mr = &built.resource;
        let place = mr.link().place;
        let blocks: Vec<usize> = (0..8)
            .map(|_| mr.allocate(MIB, Stream::DEFAULT).unwrap())
            .collect();
        let busy = crate::pressure::figures(place);
        assert!(busy.live() >= 8 * MIB, "{name}: {busy:?}");
        for b in blocks {
            // SAFETY: allocated above from this resource with this size, freed once.
            unsafe { mr.deallocate(b, MIB, Stream::DEFAULT) }.unwrap();
        }
        let idle = crate::pressure::figures(place);
        crate::pressure::relieve(place);
        let relieved = crate::pressure::figures(place);
        assert_eq!(relieved.cached, 0, "{name}: every cached byte given back");
        if matches!(name, "arena" | "fixed_size" | "binning") {
            assert!(idle.live() > 0, "{name}");
            assert_eq!(
                relieved.held,
                idle.live(),
                "{name}: what it keeps by design stays"
            );
        } else {
            assert_eq!(
                idle.live(),
                0,
                "{name}: nothing live after the frees ({idle:?})"
            );
            assert_eq!(relieved.held, 0, "{name}: nothing held once relieved");
        }
    }
}
