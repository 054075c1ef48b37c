//! One switch between the locks of normal builds (parking_lot) and loom's model-checked ones
//! (the `loom` feature; hawkw/sharded-slab does the same with `--cfg loom`): the stream-ordered core takes its
//! locks from here, so `tests/loom_core.rs` explores its lock protocol.
//!
//! Both sides offer the same small API: `Mutex::new`, `Mutex::lock` (no poisoning),
//! `Mutex::try_lock`,
//! `RwLock::new`, `RwLock::read`, `RwLock::write`.
//!
//! [`OwnedMutex`] wraps a mutex that is held while a resource calls its upstream: it knows the
//! thread that holds it, so a thread that would wait for it while already holding it (an
//! upstream callback calling back into the resource) gets an error instead of a deadlock.

#[cfg(not(feature = "loom"))]
pub(crate) use parking_lot::{Mutex, RwLock};

#[cfg(feature = "loom")]
use self::loom_locks::MutexGuard;
#[cfg(not(feature = "loom"))]
use parking_lot::MutexGuard;

#[cfg(feature = "loom")]
use loom::sync::atomic::{AtomicUsize, Ordering};
#[cfg(not(feature = "loom"))]
use std::sync::atomic::{AtomicUsize, Ordering};

// Why process-wide: a thread's identity for `OwnedMutex`: the address of its own local.
#[cfg(not(feature = "loom"))]
std::thread_local!(static THREAD_TOKEN: u8 = const { 0 });
// Why process-wide: the same identity under loom, whose threads need its thread-locals.
#[cfg(feature = "loom")]
loom::thread_local!(static THREAD_TOKEN: u8 = 0);

/// A non-zero number unique to the calling thread while it lives (the address of a
/// thread-local).
fn thread_token() -> usize {
    THREAD_TOKEN.with(|t| t as *const u8 as usize)
}

/// `Deref` and `DerefMut` of a guard type `$guard<'_, T>` to the data of the lock guard it
/// wraps (its field `guard`).
macro_rules! derefs_to_guard {
    ($guard:ident) => {
        impl<T> std::ops::Deref for $guard<'_, T> {
            type Target = T;
            fn deref(&self) -> &T {
                &self.guard
            }
        }

        impl<T> std::ops::DerefMut for $guard<'_, T> {
            fn deref_mut(&mut self) -> &mut T {
                &mut self.guard
            }
        }
    };
}

/// The calling thread already holds the [`OwnedMutex`] it asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reentered;

/// A mutex that records which thread holds it (see the module doc).
#[derive(Debug)]
pub(crate) struct OwnedMutex<T> {
    mutex: Mutex<T>,
    /// The holder's [`thread_token`]; 0 when free. Only the holder writes its own token, so a
    /// thread reads its own token here exactly when it holds the lock.
    owner: AtomicUsize,
}

/// The guard of [`OwnedMutex`]: clears the owner, then unlocks.
pub(crate) struct OwnedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    owner: &'a AtomicUsize,
}

impl<T> Drop for OwnedGuard<'_, T> {
    fn drop(&mut self) {
        self.owner.store(0, Ordering::Relaxed);
    }
}

derefs_to_guard!(OwnedGuard);

impl<T> OwnedMutex<T> {
    pub(crate) fn new(value: T) -> Self {
        OwnedMutex {
            mutex: Mutex::new(value),
            owner: AtomicUsize::new(0),
        }
    }

    /// Whether the calling thread holds the lock.
    pub(crate) fn held_here(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == thread_token()
    }

    fn own<'a>(&'a self, guard: MutexGuard<'a, T>) -> OwnedGuard<'a, T> {
        self.owner.store(thread_token(), Ordering::Relaxed);
        OwnedGuard {
            guard,
            owner: &self.owner,
        }
    }

    /// Locks, waiting for another thread; [`Reentered`] at once when this thread holds it.
    pub(crate) fn lock(&self) -> Result<OwnedGuard<'_, T>, Reentered> {
        if self.held_here() {
            return Err(Reentered);
        }
        Ok(self.own(self.mutex.lock()))
    }

    /// Locks if free now.
    pub(crate) fn try_lock(&self) -> Option<OwnedGuard<'_, T>> {
        self.mutex.try_lock().map(|g| self.own(g))
    }
}

#[cfg(feature = "loom")]
pub(crate) use self::loom_locks::{Mutex, RwLock};

#[cfg(feature = "loom")]
mod loom_locks {
    use loom::sync::atomic::{AtomicBool, Ordering};

    /// A mutex for loom with parking_lot's signature. The lock itself is a flag taken with a
    /// compare-and-swap (spinning with `yield_now`), so `try_lock` never waits: loom 0.7's own
    /// `try_lock` marks a thread trying a held mutex as blocked, which reports a deadlock where
    /// the real `try_lock` would have returned at once. The inner loom mutex, never contended,
    /// carries the data and its happens-before edges.
    #[derive(Debug)]
    pub(crate) struct Mutex<T> {
        locked: AtomicBool,
        data: loom::sync::Mutex<T>,
    }

    /// Clears the lock flag when dropped (after the data guard: fields drop in order).
    #[derive(Debug)]
    struct Unlock<'a>(&'a AtomicBool);

    impl Drop for Unlock<'_> {
        fn drop(&mut self) {
            self.0.store(false, Ordering::Release);
        }
    }

    /// The guard of [`Mutex`].
    #[derive(Debug)]
    pub(crate) struct MutexGuard<'a, T> {
        guard: loom::sync::MutexGuard<'a, T>,
        _unlock: Unlock<'a>,
    }

    derefs_to_guard!(MutexGuard);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex {
                locked: AtomicBool::new(false),
                data: loom::sync::Mutex::new(value),
            }
        }

        fn take_flag(&self) -> bool {
            self.locked
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        }

        fn guard(&self) -> MutexGuard<'_, T> {
            MutexGuard {
                guard: self.data.lock().unwrap_or_else(|e| e.into_inner()),
                _unlock: Unlock(&self.locked),
            }
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            while !self.take_flag() {
                loom::thread::yield_now();
            }
            self.guard()
        }

        pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            self.take_flag().then(|| self.guard())
        }
    }

    /// loom's read-write lock with parking_lot's signature.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }
        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }
        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
        pub(crate) fn try_write(&self) -> Option<loom::sync::RwLockWriteGuard<'_, T>> {
            self.0.try_write().ok()
        }
    }
}
