//! Loading a small PTX module and launching rrmm's own kernels (benchmarks and GPU tests): one
//! spin kernel that keeps a stream busy for a number of clock cycles.

use super::check::check;
use super::driver::ensure_driver;
use super::stream::Stream;
use super::ContextGuard;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CString};

/// `rrmm_spin(out, cycles)`: one thread spins until `cycles` clocks have passed since it started,
/// then (thread 0, if `out` is not null) writes its start clock to `out[0]` (8 bytes).
/// Hand-written PTX, JIT-compiled by the driver for the device at load time.
const SPIN_PTX: &str = r#"
.version 7.0
.target sm_52
.address_size 64

.visible .entry rrmm_spin(
    .param .u64 rrmm_spin_out,
    .param .s64 rrmm_spin_cycles
)
{
    .reg .pred %p<4>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [rrmm_spin_out];
    ld.param.s64 %rd2, [rrmm_spin_cycles];
    mov.u64 %rd3, %clock64;
SPIN:
    mov.u64 %rd4, %clock64;
    sub.s64 %rd5, %rd4, %rd3;
    setp.lt.s64 %p1, %rd5, %rd2;
    @%p1 bra SPIN;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra DONE;
    setp.eq.u64 %p3, %rd1, 0;
    @%p3 bra DONE;
    cvta.to.global.u64 %rd6, %rd1;
    st.global.u64 [%rd6], %rd3;
DONE:
    ret;
}
"#;

/// A loaded module; unloaded on drop.
#[derive(Debug)]
struct Module {
    raw: usize,
    device: usize,
}

impl Module {
    /// Loads the PTX `image` into the primary context of `device`.
    fn load(device: usize, image: &str) -> Result<Module> {
        ensure_driver()?;
        let _ctx = ContextGuard::new(device)?;
        let image = CString::new(image).map_err(|_| Error::invalid("image", "contains NUL"))?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `raw` is a valid out-pointer; `image` is a NUL-terminated PTX text that lives
        // across the call (the driver copies it).
        check("cuModuleLoadData", unsafe {
            sys::cuModuleLoadData(&mut raw, image.as_ptr().cast())
        })?;
        Ok(Module {
            raw: raw as usize,
            device,
        })
    }

    /// The kernel `name` of this module (valid while the module lives).
    fn function(&self, name: &str) -> Result<usize> {
        let name = CString::new(name).map_err(|_| Error::invalid("name", "contains NUL"))?;
        let mut f: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; `f` is a valid out-pointer; `name` is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            sys::cuModuleGetFunction(&mut f, self.raw as sys::CUmodule, name.as_ptr())
        })?;
        Ok(f as usize)
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(_ctx) = ContextGuard::new(self.device) {
            // SAFETY: the module was loaded by `load` and is unloaded exactly once; its functions
            // are not used after (they are borrowed from it only inside `SpinKernel`).
            unsafe {
                sys::cuModuleUnload(self.raw as sys::CUmodule);
            }
        }
    }
}

/// The spin kernel, loaded on one device: keeps a stream busy for a number of clock cycles (the
/// multi-stream benchmark of RMM, W7).
#[derive(Debug)]
pub struct SpinKernel {
    function: usize,
    module: Module,
}

impl SpinKernel {
    /// Loads the kernel into the primary context of `device`.
    ///
    /// # Errors
    /// [`Error::NoDriver`] without a driver; CUDA errors from loading (JIT) the module.
    pub fn new(device: usize) -> Result<Self> {
        let module = Module::load(device, SPIN_PTX)?;
        let function = module.function("rrmm_spin")?;
        Ok(SpinKernel { function, module })
    }

    /// Enqueues one spin of `cycles` clocks on `stream` that writes nothing.
    ///
    /// # Errors
    /// CUDA errors from the launch.
    pub fn spin(&self, cycles: i64, stream: Stream) -> Result<()> {
        self.launch_raw(cycles, 0, stream)
    }

    /// Enqueues one spin that writes its start clock to `out` (8 bytes; 0: nowhere).
    pub(crate) fn launch_raw(&self, cycles: i64, out: usize, stream: Stream) -> Result<()> {
        let _ctx = ContextGuard::new(self.module.device)?;
        let mut out = out as u64;
        let mut cycles = cycles;
        let mut params: [*mut c_void; 2] = [
            (&mut out as *mut u64).cast(),
            (&mut cycles as *mut i64).cast(),
        ];
        // SAFETY: the function belongs to the live module (kept by `self`); `params` holds one
        // pointer per kernel parameter (u64 address, s64 cycles), valid for the call (the driver
        // copies the values at launch); `out` is null or 8+ bytes of device memory the caller
        // owns (checked by `launch`); the grid is 1x1x1 with no shared memory.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.function as sys::CUfunction,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                stream.as_cu(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

// Module and function handles are plain driver handles, usable from any thread.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SpinKernel>();
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_names_the_kernel_and_its_parameters() {
        assert!(SPIN_PTX.contains(".visible .entry rrmm_spin("));
        assert_eq!(SPIN_PTX.matches(".param .").count(), 2);
    }

    #[test]
    fn without_a_driver_loading_is_an_error_not_a_panic() {
        if crate::cuda::driver_available() {
            return; // covered by the GPU test
        }
        assert!(matches!(SpinKernel::new(0), Err(Error::NoDriver(_))));
    }
}
