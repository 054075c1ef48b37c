//! GPU test of the cudarc interop (issue 23): rrmm vectors as cudarc copy endpoints on a cudarc
//! stream, on the context both share. Needs a CUDA GPU; ignored elsewhere.

use rrmm::container::stream_of;
use rrmm::suballocator::PoolMemoryResource;
use rrmm::{CudaMemoryResource, DeviceUVector, SharedResource};
use std::sync::Arc;

#[test]
#[ignore = "needs a CUDA GPU"]
fn rrmm_vectors_are_cudarc_copy_endpoints_on_a_shared_context() {
    let ctx = cudarc::driver::CudaContext::new(0).unwrap(); // the primary context, as rrmm's
    let stream = ctx.new_stream().unwrap();
    // SAFETY: the cudarc stream outlives every use of the handle in this test.
    let rrmm_stream = unsafe { stream_of(&stream) };
    let device: SharedResource = Arc::new(CudaMemoryResource::new().unwrap());
    let pool: SharedResource =
        Arc::new(PoolMemoryResource::new(device, Some(64 << 20), None).unwrap());
    let data: Vec<u32> = (0..100_000).collect();
    let mut v = DeviceUVector::from_host(&data, rrmm_stream, pool.clone()).unwrap();

    // cudarc reads rrmm memory.
    let mut back = vec![0u32; data.len()];
    stream
        .memcpy_dtoh(&v.on_cudarc(&stream).unwrap(), &mut back)
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(back, data);

    // cudarc writes rrmm memory, on another cudarc stream than the vector's.
    let other = ctx.new_stream().unwrap();
    let twice: Vec<u32> = data.iter().map(|x| x * 2).collect();
    other
        .memcpy_htod(&twice, &mut v.on_cudarc_mut(&other).unwrap())
        .unwrap();
    assert_eq!(v.to_vec().unwrap(), twice);

    // Device to device between a cudarc slice and an rrmm vector.
    let cudarc_slice = stream.clone_htod(&data).unwrap();
    stream
        .memcpy_dtod(&cudarc_slice, &mut v.on_cudarc_mut(&stream).unwrap())
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(v.to_vec().unwrap(), data);
}
