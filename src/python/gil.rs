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

use crate::resource::MemoryResource;
use pyo3::marker::Ungil;
use pyo3::prelude::*;

/// What a call into a resource may do, for the GIL decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CallProfile {
    /// Some call reaches Python code (a callback), which takes the GIL.
    pub(crate) calls_python: bool,
    /// Some call may block for long in the driver (allocation, free, synchronization).
    pub(crate) may_block: bool,
}

impl CallProfile {
    /// Host bookkeeping only (simulated and system memory).
    pub(crate) const HOST: CallProfile = CallProfile {
        calls_python: false,
        may_block: false,
    };
    /// CUDA allocation calls (cuda, managed, pinned host, cuda_async).
    pub(crate) const DRIVER: CallProfile = CallProfile {
        calls_python: false,
        may_block: true,
    };
    /// Python callbacks.
    pub(crate) const PYTHON: CallProfile = CallProfile {
        calls_python: true,
        may_block: false,
    };

    /// The profile of a resource made in Rust rather than from Python (the per-device default,
    /// one set by a framework hook), from the kind of memory it hands out: device, managed and
    /// pinned memory come from driver calls, host and simulated memory from bookkeeping. No
    /// such resource runs Python: those that do are made from Python, with their profile.
    pub(crate) fn of_rust(mr: &dyn MemoryResource) -> CallProfile {
        let p = mr.call_profile();
        CallProfile {
            calls_python: p.calls_foreign_code,
            may_block: p.may_block,
        }
    }

    /// A profile whose calls also block (`release()`: it synchronizes and frees upstream).
    pub(crate) fn blocking(self) -> CallProfile {
        CallProfile {
            may_block: true,
            ..self
        }
    }

    /// The profile of an adaptor over `upstream` that forwards each call (and, with
    /// `calls_python`, runs Python code of its own).
    pub(crate) fn adaptor(upstream: CallProfile, calls_python: bool) -> CallProfile {
        CallProfile {
            calls_python: upstream.calls_python || calls_python,
            may_block: upstream.may_block,
        }
    }

    /// The profile of a suballocator over `upstream`: answered from its own bookkeeping (so it
    /// does not block for long), but its growth calls the upstream under its lock.
    pub(crate) fn suballocator(upstream: CallProfile) -> CallProfile {
        CallProfile {
            calls_python: upstream.calls_python,
            may_block: false,
        }
    }

    /// Whether calls are made with the GIL released.
    pub(crate) fn releases_gil(self) -> bool {
        self.calls_python || self.may_block
    }
}

/// Runs `f` (a call into a resource of profile `profile`) with the GIL released where the
/// profile asks for it.
pub(crate) fn call<T, F>(py: Python<'_>, profile: CallProfile, f: F) -> T
where
    F: Ungil + FnOnce() -> T,
    T: Ungil,
{
    if profile.releases_gil() {
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
    if profile.releases_gil() {
        Python::attach(|py| py.detach(f))
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::CallProfile;

    #[test]
    fn python_anywhere_below_releases_the_gil() {
        let pool_over_callback = CallProfile::suballocator(CallProfile::PYTHON);
        assert!(pool_over_callback.releases_gil());
        let stats_over_pool = CallProfile::adaptor(pool_over_callback, false);
        assert!(stats_over_pool.releases_gil());
        assert!(CallProfile::adaptor(CallProfile::HOST, true).releases_gil());
    }

    #[test]
    fn bookkeeping_keeps_the_gil_and_driver_calls_release_it() {
        assert!(!CallProfile::HOST.releases_gil());
        assert!(!CallProfile::suballocator(CallProfile::DRIVER).releases_gil());
        assert!(CallProfile::adaptor(CallProfile::DRIVER, false).releases_gil());
    }
}
