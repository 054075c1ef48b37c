//! One switch between the locks of normal builds (parking_lot) and loom's model-checked ones
//! (`RUSTFLAGS="--cfg loom"`), as hawkw/sharded-slab does: the stream-ordered core takes its
//! locks from here, so `tests/loom_core.rs` explores its lock protocol.
//!
//! Both sides offer the same small API: `Mutex::new`, `Mutex::lock` (no poisoning),
//! `RwLock::new`, `RwLock::read`, `RwLock::write`.

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, RwLock};

#[cfg(loom)]
pub(crate) use self::loom_locks::{Mutex, RwLock};

#[cfg(loom)]
mod loom_locks {
    /// loom's mutex with parking_lot's signature (a poisoned lock is taken anyway).
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    /// The guard of [`Mutex`].
    pub(crate) type MutexGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
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
    }
}
