//! The one decision about the GIL around a call into a resource.
//!
//! A thread must never wait for a resource's lock while it holds the GIL if the lock's holder
//! may need the GIL: a Python callback below the lock (a `CallbackMemoryResource` upstream, a
//! failure callback) runs under it, and CPython hands the GIL to other threads while that
//! callback runs, so a waiter holding the GIL would block the holder for ever. Calls into a
//! chain that reaches Python are therefore made with the GIL released (the callback takes it
//! back). Calls that may block for long in CUDA are made with the GIL released too, so that
//! other Python threads run. Calls answered from host bookkeeping keep the GIL: releasing it
//! would cost more than the call.

pub(crate) use crate::resource::CallProfile;
use pyo3::marker::Ungil;
use pyo3::prelude::*;

/// Runs `f` (a call into a resource of profile `profile`) with the GIL released where the
/// profile asks for it.
pub(crate) fn call<T, F>(py: Python<'_>, profile: CallProfile, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if profile.release_gil() {
        py.detach(f)
    } else {
        f()
    }
}

/// Runs `f` (a call into a resource of profile `profile`) with the GIL released where the
/// profile asks for it; usable where no GIL token is at hand (a `Drop`).
pub(crate) fn call_anywhere<T, F>(profile: CallProfile, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if profile.release_gil() {
        Python::attach(|py| py.detach(f))
    } else {
        f()
    }
}

/// An allocation's door from Python ([`crate::pressure::allocate_asking`]): `allocate` runs as
/// [`call`] decides; an ask of the processes sharing the GPU runs with the GIL released.
pub(crate) fn allocate<T, F>(py: Python<'_>, profile: CallProfile, allocate: F) -> crate::Result<T>
where
    F: Ungil + Sync + Fn() -> crate::Result<T>,
    T: Send,
{
    crate::pressure::allocate_asking(|| call(py, profile, &allocate), |ask| py.detach(ask))
}

/// [`allocate`] from a C entry point that may or may not hold the GIL
/// ([`call_from_foreign`]): an ask runs with the GIL released where the caller holds it.
pub(crate) fn allocate_from_foreign<T, F>(profile: CallProfile, allocate: F) -> crate::Result<T>
where
    F: Ungil + Sync + Fn() -> crate::Result<T>,
    T: Send,
{
    crate::pressure::allocate_asking(
        || call_from_foreign(profile, &allocate),
        |ask| call_from_foreign(CallProfile::BLOCKING, ask),
    )
}

extern "C" {
    /// CPython's `int PyGILState_Check(void)` (stable ABI since 3.4; not declared by PyO3).
    fn PyGILState_Check() -> std::ffi::c_int;
}

/// Whether the calling thread holds the GIL (an attached thread state).
fn gil_held() -> bool {
    // SAFETY: both only read the runtime's and the calling thread's state, and are callable
    // before the interpreter exists. `PyGILState_Check` answers 1 before initialization (and
    // where its checks are off, with subinterpreters: then `attach` takes the GIL if need be,
    // and `detach` gives it back).
    unsafe { pyo3::ffi::Py_IsInitialized() != 0 && PyGILState_Check() != 0 }
}

/// Runs `f` (a call into a resource of profile `profile`) from a C entry point that may or may
/// not hold the GIL (CuPy calls its allocator with the GIL held; PyTorch mostly without): with
/// the GIL released for the call where the profile asks for it and the caller holds it, else
/// as it is. Never takes a GIL the caller does not hold.
pub(crate) fn call_from_foreign<T, F>(profile: CallProfile, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if profile.release_gil() && gil_held() {
        Python::attach(|py| py.detach(f))
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use crate::resource::MemoryResource;
    use crate::{PoolMemoryResource, SharedResource, SimulatedMemoryResource};
    use std::sync::Arc;

    /// A Python object keeps its resource's link's calls: a pool made from Python and one
    /// made in Rust decide the GIL alike, and a bin added after a pool was built over the
    /// binning resource reaches the pool's kept calls.
    #[test]
    fn kept_calls_follow_new_bins_below() {
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 30));
        let pool: SharedResource =
            Arc::new(PoolMemoryResource::new(sim, Some(1 << 20), None).unwrap());
        let kept = pool.link().calls;
        assert_eq!(kept.get(), pool.call_profile());
        assert!(
            !kept.get().release_gil(),
            "simulated memory: bookkeeping only"
        );
        let binning =
            Arc::new(crate::BinningMemoryResource::new(pool.clone(), None, None).unwrap());
        let over: SharedResource =
            Arc::new(PoolMemoryResource::new(binning.clone(), Some(1 << 16), None).unwrap());
        let kept_binning = binning.link().calls;
        let kept_over = over.link().calls;
        assert!(!kept_binning.get().release_gil());
        let callback: SharedResource = Arc::new(crate::resource::CallbackMemoryResource::new(
            Box::new(|_, _| Ok(0)),
            Box::new(|_, _, _| Ok(())),
            crate::MemoryKind::Simulated,
        ));
        binning.add_bin(4096, Some(callback)).unwrap();
        assert!(
            kept_binning.get().release_gil(),
            "a bin that runs foreign code"
        );
        assert!(
            kept_over.get().calls_foreign_code,
            "a pool built over the binning resource before the bin sees it"
        );
        assert_eq!(over.call_profile(), kept_over.get());
    }
}
