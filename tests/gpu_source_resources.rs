//! GPU tests of the driver layer and the source resources. They need a CUDA GPU and are ignored
//! elsewhere (`cargo test -- --ignored` on a GPU machine; scripts/gpu_run.sh runs them).

use rrmm::cuda::{self, ContextGuard, OwnedStream};
use rrmm::{
    CheckedResourceAdaptor, CudaAsyncMemoryResource, CudaMemoryResource, DeviceBuffer, Error,
    ManagedMemoryResource, MemoryResource, PinnedHostMemoryResource, SharedResource, Stream,
};
use std::sync::Arc;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn source_resources() -> Vec<SharedResource> {
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
fn data_round_trips_through_every_source_resource() {
    let stream = OwnedStream::new(true).unwrap();
    for mr in source_resources() {
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
fn a_thread_without_a_context_keeps_the_primary_context_bound() {
    assert!(cuda::device_count() >= 1);
    std::thread::spawn(|| {
        // A fresh thread has no current context; after a guard it keeps device 0's primary
        // context (as the CUDA runtime binds one), so later calls need no context switch.
        {
            let _g = ContextGuard::new(0).unwrap();
        }
        let mr = CudaAsyncMemoryResource::new(None, None, Default::default()).unwrap();
        let p = mr.allocate(1 << 20, Stream::DEFAULT).unwrap();
        // SAFETY: allocated above with this size on this stream, freed once.
        unsafe { mr.deallocate(p, 1 << 20, Stream::DEFAULT) }.unwrap();
        assert_eq!(cuda::current_device().unwrap(), 0);
        cuda::context_synchronize().unwrap();
    })
    .join()
    .unwrap();
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

/// Every source resource behind the checking adaptor (as the Python layer drives them): a bogus,
/// double or wrong-size free is a logic error that never reaches CUDA, and the resource and the
/// data of a live buffer are intact afterwards.
#[test]
#[ignore = "needs a CUDA GPU"]
fn checked_source_resources_refuse_bad_frees_and_keep_working() {
    let stream = OwnedStream::new(true).unwrap();
    for base in source_resources() {
        let name = base.name();
        let mr: SharedResource = Arc::new(CheckedResourceAdaptor::new(base));
        let data = pattern(1 << 16, 9);
        let buf = DeviceBuffer::from_host(&data, stream.stream(), mr.clone()).unwrap();
        let p = mr.allocate(4096, stream.stream()).unwrap();
        // SAFETY: the adaptor checks 1 and 2, so these bad frees never reach CUDA; the stream
        // is live.
        let bad = unsafe {
            [
                mr.deallocate(p + 256, 4096, stream.stream()),
                mr.deallocate(p, 8192, stream.stream()),
                mr.deallocate(0xdead_0000, 256, stream.stream()),
            ]
        };
        for r in bad {
            assert!(matches!(r, Err(Error::Logic(_))), "{name}: {r:?}");
        }
        // SAFETY: `p` is live with 4096 bytes; nothing uses it.
        unsafe { mr.deallocate(p, 4096, stream.stream()) }.unwrap();
        // SAFETY: checked, as above.
        let double = unsafe { mr.deallocate(p, 4096, stream.stream()) };
        assert!(matches!(double, Err(Error::Logic(_))), "{name}: {double:?}");
        assert_eq!(buf.to_vec().unwrap(), data, "{name}: data intact");
        let q = mr.allocate(1 << 20, stream.stream()).unwrap();
        // SAFETY: `q` is live with 1 MiB; nothing uses it.
        unsafe { mr.deallocate(q, 1 << 20, stream.stream()) }.unwrap();
    }
}
