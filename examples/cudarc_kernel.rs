//! Kernels launched through cudarc on rrmm memory, results checked on the host:
//! `y = a * x + y` over `DeviceUVector<f32>`s from a pool with `a` in a `DeviceScalar`, first
//! with the containers as kernel arguments on their own stream, then through cudarc views on a
//! second stream; then the row sums of a `DeviceRagged`. The kernels are hand-written PTX
//! (`examples/cudarc_kernel.ptx`) loaded with cudarc's module loading: the driver compiles PTX
//! for the GPU, so neither nvcc nor NVRTC is needed. Without a GPU it says so and exits 0.
//!
//! `cargo run --example cudarc_kernel`

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use rrmm::container::stream_of;
use rrmm::cuda;
use rrmm::suballocator::PoolMemoryResource;
use rrmm::{CudaMemoryResource, DeviceRagged, DeviceScalar, DeviceUVector, SharedResource};
use std::sync::Arc;

/// The PTX module: `rrmm_axpy(y, x, a, n)` and `rrmm_row_sums(out, values, offsets, rows)`.
const KERNELS: &str = include_str!("cudarc_kernel.ptx");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !cuda::driver_available() || cuda::device_count() == 0 {
        println!("cudarc_kernel needs a CUDA GPU; none here, nothing to do");
        return Ok(());
    }
    // cudarc's context of device 0 is the device's primary context, the one rrmm allocates in.
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    // The containers are ordered on the cudarc stream, so kernels launched on it, rrmm's copies
    // and the final frees all run in one order.
    // SAFETY: `stream` is declared before the containers, so it outlives them.
    let on = unsafe { stream_of(&stream) };
    let device: SharedResource = Arc::new(CudaMemoryResource::new()?);
    let pool: SharedResource = Arc::new(PoolMemoryResource::new(device, Some(64 << 20), None)?);
    let module = ctx.load_module(Ptx::from_src(KERNELS))?;
    let axpy = module.load_function("rrmm_axpy")?;
    let row_sums = module.load_function("rrmm_row_sums")?;

    let n: usize = 1 << 20;
    let x: Vec<f32> = (0..n).map(|i| (i % 1000) as f32).collect();
    let y0: Vec<f32> = (0..n).map(|i| (i % 7) as f32).collect();
    let xs = DeviceUVector::from_host(&x, on, pool.clone())?;
    let mut ys = DeviceUVector::from_host(&y0, on, pool.clone())?;
    let a = DeviceScalar::new(2.0f32, on, pool.clone())?;
    let len = n as u64;
    let cfg = LaunchConfig::for_num_elems(n as u32);

    // 1. rrmm containers as kernel arguments, on their own stream (no ordering needed).
    let mut launch = stream.launch_builder(&axpy);
    launch.arg(&mut ys).arg(&xs).arg(&a).arg(&len);
    // SAFETY: rrmm_axpy takes (float *y, const float *x, const float *a, u64 n) as pushed; the
    // vectors hold `n` elements; the launch stream is the containers' stream.
    unsafe { launch.launch(cfg) }?;
    let mut y = vec![0f32; n];
    // SAFETY: `y` is read only after the stream is synchronized, just below.
    unsafe { ys.copy_to_host_async(&mut y, on) }?;
    stream.synchronize()?;
    let wrong = (0..n).filter(|&i| y[i] != 2.0 * x[i] + y0[i]).count();
    println!("axpy on {n} f32 of rrmm pool memory, containers as arguments: {wrong} wrong");

    // 2. The same through views on a second stream: it waits for the containers' stream when
    // the views are made, and the containers' stream waits for it when they drop.
    let other = ctx.new_stream()?;
    {
        let mut y_view = ys.on_cudarc_mut(&other)?;
        let x_view = xs.on_cudarc(&other)?;
        let a_view = a.as_vector().on_cudarc(&other)?;
        let mut launch = other.launch_builder(&axpy);
        launch.arg(&mut y_view).arg(&x_view).arg(&a_view).arg(&len);
        // SAFETY: as above; the kernel runs on the views' stream.
        unsafe { launch.launch(cfg) }?;
    }
    let y = ys.to_vec()?; // on the vectors' stream, after the kernel on `other`
    let wrong_views = (0..n).filter(|&i| y[i] != 4.0 * x[i] + y0[i]).count();
    println!("axpy again through cudarc views on a second stream: {wrong_views} wrong");

    // 3. A ragged container: the values and the row offsets as two arguments.
    let rows: Vec<Vec<f32>> = (0..10_000)
        .map(|r| (0..r % 17).map(|j| (r + j) as f32).collect())
        .collect();
    let ragged = DeviceRagged::from_host(&rows, on, pool.clone())?;
    let mut sums = DeviceUVector::<f32>::new(rows.len(), on, pool.clone())?;
    let row_count = rows.len() as u64;
    let mut launch = stream.launch_builder(&row_sums);
    launch
        .arg(&mut sums)
        .arg(ragged.values())
        .arg(ragged.device_offsets())
        .arg(&row_count);
    // SAFETY: rrmm_row_sums takes (float *out, const float *values, const u64 *offsets, u64
    // rows) as pushed; `sums` holds a value per row; all are on the launch stream.
    unsafe { launch.launch(LaunchConfig::for_num_elems(rows.len() as u32)) }?;
    let got = sums.to_vec()?;
    let wrong_rows = (0..rows.len())
        .filter(|&r| got[r] != rows[r].iter().sum::<f32>())
        .count();
    println!("row sums of {} ragged rows: {wrong_rows} wrong", rows.len());

    if wrong + wrong_views + wrong_rows != 0 {
        return Err("wrong results".into());
    }
    println!("all results checked");
    Ok(())
}
