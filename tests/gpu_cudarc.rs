//! GPU tests of the containers with cudarc and on streams (issue 23): rrmm vectors as cudarc
//! copy endpoints and kernel arguments on a cudarc stream, on the context both share, and the
//! asynchronous host copies' stream ordering. They need a CUDA GPU: ignored by default
//! (`cargo test --test gpu_cudarc -- --ignored` on a GPU machine; scripts/gpu_run.sh runs
//! them), and each returns early, saying so, where there is no driver or no device.

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use rrmm::container::stream_of;
use rrmm::cuda::{self, OwnedStream, SpinKernel};
use rrmm::suballocator::PoolMemoryResource;
use rrmm::{
    CudaMemoryResource, DeviceBuffer, DeviceRagged, DeviceScalar, DeviceUVector, Error,
    SharedResource, SimulatedMemoryResource, Stream,
};
use std::sync::Arc;

/// The example's PTX module: `rrmm_axpy(y, x, a, n)`, `rrmm_row_sums(out, values, offsets,
/// rows)`.
const KERNELS: &str = include_str!("../examples/cudarc_kernel.ptx");

/// Whether there is a GPU to test on; says so when there is none.
fn gpu() -> bool {
    if !cuda::driver_available() || cuda::device_count() == 0 {
        println!("skipped: needs a CUDA GPU (no driver or no device here)");
        return false;
    }
    true
}

/// A pool over device memory of device 0.
fn pool() -> SharedResource {
    let device: SharedResource = Arc::new(CudaMemoryResource::new().unwrap());
    Arc::new(PoolMemoryResource::new(device, Some(64 << 20), None).unwrap())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn rrmm_vectors_are_cudarc_copy_endpoints_on_a_shared_context() {
    if !gpu() {
        return;
    }
    let ctx = cudarc::driver::CudaContext::new(0).unwrap(); // the primary context, as rrmm's
    let stream = ctx.new_stream().unwrap();
    // SAFETY: the cudarc stream outlives every use of the handle in this test.
    let rrmm_stream = unsafe { stream_of(&stream) };
    let data: Vec<u32> = (0..100_000).collect();
    let mut v = DeviceUVector::from_host(&data, rrmm_stream, pool()).unwrap();

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

#[test]
#[ignore = "needs a CUDA GPU"]
fn kernels_take_rrmm_containers_and_views_as_arguments() {
    if !gpu() {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    // SAFETY: the cudarc stream is declared before the containers and outlives them.
    let on = unsafe { stream_of(&stream) };
    let mr = pool();
    let module = ctx.load_module(Ptx::from_src(KERNELS)).unwrap();
    let axpy = module.load_function("rrmm_axpy").unwrap();
    let row_sums = module.load_function("rrmm_row_sums").unwrap();

    // Not a multiple of the block size: the last block's bound check matters.
    let n: usize = 1_000_003;
    let x: Vec<f32> = (0..n).map(|i| (i % 1013) as f32).collect();
    let y0: Vec<f32> = (0..n).map(|i| (i % 5) as f32).collect();
    let xs = DeviceUVector::from_host(&x, on, mr.clone()).unwrap();
    let mut ys = DeviceUVector::from_host(&y0, on, mr.clone()).unwrap();
    // One element past `n` that the kernel must leave alone.
    ys.resize(n + 1).unwrap();
    ys.set_element(n, -1.0).unwrap();
    let mut a = DeviceScalar::new(3.0f32, on, mr.clone()).unwrap();
    let len = n as u64;
    let cfg = LaunchConfig::for_num_elems(n as u32);

    // Containers directly, on their own stream; the scalar as `&mut` too.
    let mut launch = stream.launch_builder(&axpy);
    launch.arg(&mut ys).arg(&xs).arg(&mut a).arg(&len);
    // SAFETY: (float *y, const float *x, const float *a, u64 n) as pushed; `ys` holds n + 1
    // and `xs` n elements; the launch stream is the containers' stream.
    unsafe { launch.launch(cfg) }.unwrap();
    let y = ys.to_vec().unwrap();
    for i in 0..n {
        assert_eq!(y[i], 3.0 * x[i] + y0[i], "element {i}");
    }
    assert_eq!(y[n], -1.0, "past n");

    // Views on a second stream, the vectors' stream kept busy before: the views wait for it,
    // and the vectors' stream waits for the kernel when they drop.
    let spin = SpinKernel::new(0).unwrap();
    spin.spin(50_000_000, on).unwrap();
    a.set_value(0.5).unwrap();
    let other = ctx.new_stream().unwrap();
    {
        let mut y_view = ys.on_cudarc_mut(&other).unwrap();
        let x_view = xs.on_cudarc(&other).unwrap();
        let a_view = a.as_vector().on_cudarc(&other).unwrap();
        // The kernel queued behind a spin on `other`: the vectors' stream must wait for both.
        spin.spin(50_000_000, cuda_stream(&other)).unwrap();
        let mut launch = other.launch_builder(&axpy);
        launch.arg(&mut y_view).arg(&x_view).arg(&a_view).arg(&len);
        // SAFETY: as above; the kernel runs on the views' stream.
        unsafe { launch.launch(cfg) }.unwrap();
    }
    let mut y2 = vec![0f32; n + 1];
    // SAFETY: `y2` is read only after the wait on the vectors' stream.
    unsafe { ys.copy_to_host_async(&mut y2, on) }.unwrap();
    stream.synchronize().unwrap();
    for i in 0..n {
        assert_eq!(
            y2[i],
            0.5 * x[i] + y[i],
            "element {i} after the views' kernel"
        );
    }

    // A ragged container's values and offsets as two arguments.
    let rows: Vec<Vec<f32>> = (0..5_000)
        .map(|r| (0..r % 23).map(|j| (r * 3 + j) as f32).collect())
        .collect();
    let ragged = DeviceRagged::from_host(&rows, on, mr.clone()).unwrap();
    let mut sums = DeviceUVector::<f32>::new(rows.len(), on, mr).unwrap();
    let count = rows.len() as u64;
    let mut launch = stream.launch_builder(&row_sums);
    launch
        .arg(&mut sums)
        .arg(ragged.values())
        .arg(ragged.device_offsets())
        .arg(&count);
    // SAFETY: (float *out, const float *values, const u64 *offsets, u64 rows) as pushed;
    // `sums` holds one value per row; all on the launch stream.
    unsafe { launch.launch(LaunchConfig::for_num_elems(rows.len() as u32)) }.unwrap();
    let got = sums.to_vec().unwrap();
    for (r, row) in rows.iter().enumerate() {
        assert_eq!(got[r], row.iter().sum::<f32>(), "row {r}");
    }
}

/// The rrmm handle of a cudarc stream that the caller keeps alive.
fn cuda_stream(stream: &cudarc::driver::CudaStream) -> Stream {
    // SAFETY: used at once, while the caller holds the cudarc stream.
    unsafe { stream_of(stream) }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cudarc_views_refuse_simulated_memory() {
    if !gpu() {
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let mr: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
    let mut v = DeviceUVector::<u32>::new(16, Stream::DEFAULT, mr).unwrap();
    assert!(matches!(v.on_cudarc(&stream), Err(Error::Logic(_))));
    assert!(matches!(v.on_cudarc_mut(&stream), Err(Error::Logic(_))));
}

/// Pinned host memory (`cuMemHostAlloc`) holding `u64`s, so that asynchronous copies really
/// are asynchronous; freed on drop.
struct Pinned {
    ptr: usize,
    len: usize,
}

impl Pinned {
    fn new(values: &[u64]) -> Pinned {
        let ptr = cuda::mem_alloc_host(values.len() * 8).unwrap();
        let mut pinned = Pinned {
            ptr,
            len: values.len(),
        };
        pinned.as_mut_slice().copy_from_slice(values);
        pinned
    }

    fn as_slice(&self) -> &[u64] {
        // SAFETY: `ptr` holds `len` u64s (page-aligned pinned memory this value owns until its
        // drop); any bit pattern is a `u64`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u64, self.len) }
    }

    fn as_mut_slice(&mut self) -> &mut [u64] {
        // SAFETY: as `as_slice`, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u64, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by `new`, freed once; the tests synchronize the copies that use it
        // before it drops.
        unsafe { cuda::mem_free_host(self.ptr) }.unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn async_copies_are_ordered_with_the_container_stream() {
    if !gpu() {
        return;
    }
    let _ctx = cuda::ContextGuard::new(0).unwrap();
    let spin = SpinKernel::new(0).unwrap();
    let mr = pool();
    // About 50 ms at H100 clocks: far longer than the host takes to enqueue what follows.
    let cycles = 100_000_000;
    let (own, copier) = (
        OwnedStream::new(true).unwrap(),
        OwnedStream::new(true).unwrap(),
    );
    let n = 1 << 20;
    let data = Pinned::new(&(1..=n as u64).collect::<Vec<_>>());
    let mut out = Pinned::new(&vec![0; n]);

    // 1. A copy on another stream waits for the vector's stream: the kernel there writes its
    // start clock into element 0 at its end, before the copy reads it.
    // SAFETY: `data` lives to the end of the test, after the waits below, and is not written.
    let mut v =
        unsafe { DeviceUVector::from_host_async(data.as_slice(), own.stream(), mr.clone()) }
            .unwrap();
    spin.launch(cycles, v.buffer()).unwrap();
    // SAFETY: `out` is read only after `copier` is synchronized.
    unsafe { v.copy_to_host_async(out.as_mut_slice(), copier.stream()) }.unwrap();
    copier.synchronize().unwrap();
    let clock = v.element(0).unwrap();
    assert_ne!(clock, 1, "the kernel wrote its start clock");
    assert_eq!(
        out.as_slice()[0],
        clock,
        "the copy ran before the kernel's write"
    );
    assert_eq!(out.as_slice()[1..], data.as_slice()[1..]);

    // 2. A copy on another stream after a kernel on the vector's stream that writes at its end:
    // the copy lands last.
    spin.launch(cycles, v.buffer()).unwrap();
    // SAFETY: `data` outlives the copy.
    unsafe { v.copy_from_host_async(data.as_slice(), copier.stream()) }.unwrap();
    assert_eq!(v.element(0).unwrap(), 1, "the kernel wrote after the copy");
    // 3. The vector's stream waits for the copy on `copier`, which is kept busy first here:
    // `to_vec` on the vector's stream sees the copied data.
    let scratch = DeviceBuffer::new(8, copier.stream(), mr.clone()).unwrap();
    spin.launch(cycles, &scratch).unwrap();
    let twice: Vec<u64> = data.as_slice().iter().map(|x| x * 2).collect();
    // SAFETY: `twice` outlives the copy (`to_vec` below waits for it) and is not written
    // before.
    unsafe { v.copy_from_host_async(&twice, copier.stream()) }.unwrap();
    assert_eq!(
        v.to_vec().unwrap(),
        twice,
        "the vector's stream ran before the copy"
    );

    // 4. On the vector's own stream, a scalar and a ragged container, pageable memory.
    let mut s = DeviceScalar::new(0u64, own.stream(), mr.clone()).unwrap();
    let value = 0xdead_beef_u64;
    let mut back = 0u64;
    // SAFETY: both outlive the copies, waited for below.
    unsafe {
        s.copy_from_host_async(&value, own.stream()).unwrap();
        s.copy_to_host_async(&mut back, copier.stream()).unwrap();
    }
    copier.synchronize().unwrap();
    assert_eq!(back, value);
    let rows: Vec<Vec<u64>> = (0..100).map(|r| (0..r % 9).collect()).collect();
    let ragged = DeviceRagged::from_host(&rows, own.stream(), mr).unwrap();
    let mut flat = vec![0u64; ragged.total_len()];
    let mut row = vec![0u64; rows[8].len()];
    // SAFETY: both are read only after the wait.
    unsafe {
        ragged
            .copy_to_host_async(&mut flat, copier.stream())
            .unwrap();
        ragged
            .copy_row_to_host_async(8, &mut row, own.stream())
            .unwrap();
    }
    own.synchronize().unwrap(); // the container's stream waits for `copier`'s copy too
    assert_eq!(flat, rows.concat());
    assert_eq!(row, rows[8]);
    drop(v); // freed on its stream, after the copies
    own.synchronize().unwrap();
}
