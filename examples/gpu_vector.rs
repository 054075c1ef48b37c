//! On a GPU: a typed vector in device memory from a pool, copied both ways, and a kernel
//! (rrmm's own spin kernel) launched on rrmm memory, its output checked. Without a GPU it says
//! so and exits 0.
//!
//! `cargo run --example gpu_vector`

use rrmm::cuda::{self, SpinKernel};
use rrmm::suballocator::PoolMemoryResource;
use rrmm::{CudaMemoryResource, DeviceBuffer, DeviceUVector, SharedResource, Stream};
use std::sync::Arc;

fn main() -> rrmm::Result<()> {
    if !cuda::driver_available() || cuda::device_count() == 0 {
        println!("gpu_vector needs a CUDA GPU; none here, nothing to do");
        return Ok(());
    }
    let device: SharedResource = Arc::new(CudaMemoryResource::new()?);
    let pool: SharedResource = Arc::new(PoolMemoryResource::new(device, Some(256 << 20), None)?);
    let data: Vec<u64> = (0..1_000_000).collect();
    let mut v = DeviceUVector::from_host(&data, Stream::DEFAULT, pool.clone())?;
    v.set_element(999_999, 7)?;
    let back = v.to_vec()?;
    assert_eq!(&back[..999_999], &data[..999_999]);
    assert_eq!(back[999_999], 7);
    println!(
        "1,000,000 u64 round-tripped through a pool; element 999,999 = {}",
        v.element(999_999)?
    );

    let kernel = SpinKernel::new(cuda::current_device()?)?;
    let out = DeviceBuffer::new(8, Stream::DEFAULT, pool)?;
    kernel.launch(1_000, &out)?;
    let mut clock = [0u8; 8];
    out.copy_to_host(&mut clock)?;
    let start = u64::from_le_bytes(clock);
    assert_ne!(start, 0, "the kernel wrote its start clock");
    println!("kernel on rrmm memory wrote its start clock: {start}");
    Ok(())
}
