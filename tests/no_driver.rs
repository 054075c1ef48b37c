//! Without a CUDA driver (CI), rrmm still loads, CPU resources work, and CUDA resources fail
//! with a clear error instead of a panic. On a GPU machine these checks do not apply.

use rrmm::cuda;
use rrmm::{CudaMemoryResource, Error, MemoryResource, Stream, SystemMemoryResource};

#[test]
fn cuda_resources_fail_cleanly_without_a_driver() {
    if cuda::driver_available() {
        eprintln!("a CUDA driver is present: checking that it reports at least one device");
        assert!(cuda::device_count() >= 1);
        return;
    }
    assert_eq!(cuda::device_count(), 0);
    match CudaMemoryResource::new() {
        Err(Error::NoDriver(why)) => assert!(why.contains("libcuda"), "{why}"),
        other => panic!("expected NoDriver, got {other:?}"),
    }
    assert!(matches!(
        Stream::DEFAULT.synchronize(),
        Err(Error::NoDriver(_))
    ));
    let sys = SystemMemoryResource::new();
    let p = sys.allocate(64, Stream::DEFAULT).unwrap();
    // SAFETY: a live allocation of this resource with this size, freed once; nothing uses it.
    unsafe { sys.deallocate(p, 64, Stream::DEFAULT) }.unwrap();
}
