//! GPU tests of sleep and wake (issue 32) on real virtual memory: the bytes of live blocks
//! survive an offload and a restore at the same addresses, the driver sees the memory given
//! back, discarded blocks read zeros when asked, and a stack forwards the sleep. They need a
//! CUDA GPU and are ignored elsewhere (`cargo test --test gpu_sleep -- --ignored`).

use rrmm::cuda::{self, Stream};
use rrmm::suballocator::{
    sleep, DiscardFill, ExpandableMemoryResource, ExpandableOptions, SleepTag,
};
use rrmm::{MemoryResource, SharedResource, StatisticsResourceAdaptor};
use std::sync::Arc;

const MIB: usize = 1 << 20;

fn fill(ptr: usize, size: usize, value: u8) {
    // SAFETY: a live block of `size` bytes, nothing else uses it.
    unsafe { cuda::memset_async(ptr, value, size, Stream::DEFAULT).unwrap() };
    Stream::DEFAULT.synchronize().unwrap();
}

fn all_equal(ptr: usize, size: usize, value: u8) -> bool {
    let mut host = vec![0u8; size];
    // SAFETY: a live block of `size` bytes.
    unsafe { cuda::memcpy_sync(host.as_mut_ptr() as usize, ptr, size, Stream::DEFAULT).unwrap() };
    host.iter().all(|&b| b == value)
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_bytes_survive_a_sleep_at_the_same_addresses() {
    let _ctx = cuda::ContextGuard::new(0).expect("a CUDA device");
    let pool = ExpandableMemoryResource::on_device(0, ExpandableOptions::default()).unwrap();
    let top: SharedResource = Arc::new(StatisticsResourceAdaptor::new(Arc::new(pool.clone())));
    let sizes = [1000, 64 * MIB + 3, 300 * MIB, 256];
    let ptrs: Vec<usize> = sizes
        .iter()
        .map(|&s| top.allocate(s, Stream::DEFAULT).unwrap())
        .collect();
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        fill(p, s, i as u8 + 1);
    }
    pool.tag(ptrs[2] + 5, SleepTag::Discard).unwrap();
    let (free_before, _) = cuda::mem_get_info().unwrap();
    let did = sleep::offload(&top, DiscardFill::Zero).unwrap();
    let (free_asleep, _) = cuda::mem_get_info().unwrap();
    assert!(pool.asleep() && pool.mapped_bytes() == 0);
    assert!(
        free_asleep >= free_before + did.released_bytes - 64 * MIB,
        "the driver sees the memory back: {free_before} -> {free_asleep}, {did:?}"
    );
    assert!(top.allocate(10, Stream::DEFAULT).is_err());
    let report = pool.last_sleep().unwrap();
    assert!(report.host_pinned);
    sleep::restore(&top).unwrap();
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        let want = if i == 2 { 0 } else { i as u8 + 1 };
        assert!(all_equal(p, s, want), "block {i}");
    }
    for (&p, &s) in ptrs.iter().zip(&sizes) {
        // SAFETY: allocated above with this size, freed once, no work pending.
        unsafe { top.deallocate(p, s, Stream::DEFAULT).unwrap() };
    }
}
