//! GPU tests of the driver layer and the base resources. They need a CUDA GPU and are ignored
//! elsewhere (`cargo test -- --ignored` on a GPU machine; scripts/gpu_run.sh runs them).

use rrmm::cuda::{self, ContextGuard, OwnedStream};
use rrmm::{
    CudaAsyncMemoryResource, CudaMemoryResource, DeviceBuffer, ManagedMemoryResource,
    MemoryResource, PinnedHostMemoryResource, SharedResource, Stream,
};
use std::sync::Arc;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn base_resources() -> Vec<SharedResource> {
    assert!(cuda::driver_available(), "no CUDA driver");
    vec![
        Arc::new(CudaMemoryResource::new().unwrap()),
        Arc::new(ManagedMemoryResource::new().unwrap()),
        Arc::new(CudaAsyncMemoryResource::new(Some(1 << 24), None, Default::default()).unwrap()),
        Arc::new(PinnedHostMemoryResource::new().unwrap()),
    ]
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn data_round_trips_through_every_base_resource() {
    let stream = OwnedStream::new(true).unwrap();
    for mr in base_resources() {
        for &len in &[1usize, 255, 4096, 1 << 20, 3 << 20] {
            for s in [Stream::DEFAULT, Stream::PER_THREAD, stream.stream()] {
                let data = pattern(len, len as u8);
                let buf = DeviceBuffer::from_host(&data, s, mr.clone()).unwrap();
                assert_eq!(buf.ptr() % 256, 0, "{} alignment", mr.name());
                assert_eq!(buf.to_vec().unwrap(), data, "{} len {len}", mr.name());
                // device-to-device copy into a second buffer
                let other = DeviceBuffer::new(len, s, mr.clone()).unwrap();
                // SAFETY: `buf` holds `len` bytes and outlives the synchronous copy.
                unsafe { other.copy_from_device(buf.ptr(), len).unwrap() };
                assert_eq!(other.to_vec().unwrap(), data);
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn resize_and_reserve_keep_contents_on_the_device() {
    let mr: SharedResource = Arc::new(CudaMemoryResource::new().unwrap());
    let data = pattern(1000, 7);
    let mut buf = DeviceBuffer::from_host(&data, Stream::DEFAULT, mr).unwrap();
    buf.reserve(5000).unwrap();
    assert_eq!(buf.capacity(), 5000);
    assert_eq!(buf.to_vec().unwrap(), data);
    buf.resize(10).unwrap();
    assert_eq!(buf.to_vec().unwrap(), &data[..10]);
    buf.resize(20000).unwrap();
    assert_eq!(&buf.to_vec().unwrap()[..10], &data[..10]);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn context_guard_restores_the_callers_context() {
    assert!(cuda::device_count() >= 1);
    let before = cuda::current_device().unwrap();
    {
        let _g = ContextGuard::new(0).unwrap();
        assert_eq!(cuda::current_device().unwrap(), 0);
    }
    assert_eq!(cuda::current_device().unwrap(), before);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn out_of_memory_is_its_own_error() {
    let mr = CudaMemoryResource::new().unwrap();
    let err = mr.allocate(1 << 60, Stream::DEFAULT).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("failed to allocate"), "{err}");
    let asy = CudaAsyncMemoryResource::new(None, None, Default::default()).unwrap();
    assert!(asy
        .allocate(1 << 60, Stream::DEFAULT)
        .unwrap_err()
        .is_out_of_memory());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn raw_stream_handles_work_with_stream_ordered_memory() {
    let owned = OwnedStream::new(false).unwrap();
    // SAFETY: `owned` is a live stream of the current device and outlives every use of `raw`.
    let raw = unsafe { Stream::from_raw(owned.raw()) };
    let mr = CudaAsyncMemoryResource::new(None, Some(0), Default::default()).unwrap();
    let mr: SharedResource = Arc::new(mr);
    let data = pattern(1 << 16, 3);
    let buf = DeviceBuffer::from_host(&data, raw, mr).unwrap();
    assert_eq!(buf.to_vec().unwrap(), data);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn memory_info_and_device_queries_answer() {
    let mr = CudaMemoryResource::new().unwrap();
    let (free, total) = mr.memory_info().unwrap();
    assert!(free > 0 && free <= total);
    assert!(!cuda::device_name(0).unwrap().is_empty());
    assert!(cuda::driver_version().unwrap() >= 12000);
}
