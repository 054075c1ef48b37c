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
