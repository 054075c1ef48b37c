//! The shared implementation of the resources that take every allocation straight from one
//! driver call on one device and free it with `cuMemFree`: [`CudaMemoryResource`]
//! (`cuMemAlloc`) and [`UncachedManagedMemoryResource`] (`cuMemAllocManaged`). Each of those
//! files names its driver call; everything else is here, once. An allocation that fails for
//! want of memory relieves the device's caches ([`crate::pressure`]) and is tried once more.
//!
//! [`CudaMemoryResource`]: super::CudaMemoryResource
//! [`UncachedManagedMemoryResource`]: super::UncachedManagedMemoryResource

use super::{MemoryKind, MemoryResource};
use crate::cuda::{self, ContextGuard, Stream};
use crate::error::Result;
use std::fmt;
use std::marker::PhantomData;

pub(super) mod sealed {
    /// Only rrmm's driver calls are [`DirectAllocator`](super::DirectAllocator)s: what they
    /// return must be freed with `cuMemFree`.
    pub trait Sealed {}
}

/// One driver allocation call whose memory `cuMemFree` frees (sealed: rrmm's own only).
pub trait DirectAllocator: sealed::Sealed + Send + Sync + 'static {
    /// The resource's short name (`"cuda"`, `"managed"`).
    const NAME: &'static str;
    /// The kind of memory the call returns.
    const KIND: MemoryKind;

    /// Allocates `bytes` (non-zero) in the current context.
    ///
    /// # Errors
    /// Out of memory, or the driver's error.
    fn alloc(bytes: usize) -> Result<usize>;
}

/// Declares a [`DirectAllocator`]: its unit type (with its doc), its name, its kind and its
/// driver call. The two files that name a driver call use it.
macro_rules! direct_allocator {
    ($(#[$doc:meta])* $alloc:ident: $name:literal, $kind:ident, $call:path) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy)]
        pub struct $alloc;

        impl super::direct::sealed::Sealed for $alloc {}

        impl super::direct::DirectAllocator for $alloc {
            const NAME: &'static str = $name;
            const KIND: super::MemoryKind = super::MemoryKind::$kind;

            fn alloc(bytes: usize) -> crate::error::Result<usize> {
                $call(bytes)
            }
        }
    };
}
pub(super) use direct_allocator;

/// The descriptive methods of [`MemoryResource`] for a source resource whose calls block (they
/// wait on the driver, the device or the OS): `kind` (`$kind`), `link` (a
/// source whose calls are [`CallProfile::BLOCKING`](super::CallProfile::BLOCKING)) and `name` (`$name`). With
/// `memory_of_device: $ordinal`, for device memory used by `self.device`: also `device` (that
/// ordinal), `memory_info` (the free and total memory of device `self.$ordinal`) and `as_any`
/// (the resource itself).
macro_rules! blocking_source_info {
    (kind: $kind:expr, name: $name:expr) => {
        fn kind(&self) -> $crate::resource::MemoryKind {
            $kind
        }

        /// A source whose calls block.
        fn link(&self) -> $crate::resource::Link {
            $crate::resource::Link::blocking_source(self)
        }

        fn name(&self) -> &'static str {
            $name
        }
    };
    (kind: $kind:expr, name: $name:expr, memory_of_device: $ordinal:ident) => {
        $crate::resource::direct::blocking_source_info!(kind: $kind, name: $name);

        fn device(&self) -> Option<usize> {
            Some(self.device)
        }

        fn memory_info(&self) -> Option<(usize, usize)> {
            $crate::cuda::device_memory_info(self.$ordinal).ok()
        }

        fn as_any(&self) -> Option<&dyn std::any::Any> {
            Some(self)
        }
    };
}
pub(super) use blocking_source_info;

/// Memory from the driver call `A` on one device; every call synchronises the device. Use it
/// through its names, [`CudaMemoryResource`](super::CudaMemoryResource) and
/// [`UncachedManagedMemoryResource`](super::UncachedManagedMemoryResource).
pub struct DirectMemoryResource<A> {
    device: usize,
    /// Bytes of device memory this resource (and its clones) hold, in the process's figures
    /// of the device ([`crate::pressure::figures`]).
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    _alloc: PhantomData<fn() -> A>,
}

impl<A: DirectAllocator> DirectMemoryResource<A> {
    /// A resource on the current device.
    ///
    /// # Errors
    /// [`Error::NoDriver`](crate::Error::NoDriver) where there is no CUDA driver.
    pub fn new() -> Result<Self> {
        Self::on_device(cuda::current_device()?)
    }

    /// A resource on device `ordinal`.
    ///
    /// # Errors
    /// No driver, or a bad ordinal.
    pub fn on_device(ordinal: usize) -> Result<Self> {
        let _ctx = ContextGuard::new(ordinal)?;
        Ok(DirectMemoryResource {
            device: ordinal,
            held: crate::pressure::held_counter(crate::pressure::Place::Device(ordinal)),
            _alloc: PhantomData,
        })
    }
}

impl<A> Clone for DirectMemoryResource<A> {
    fn clone(&self) -> Self {
        DirectMemoryResource {
            device: self.device,
            held: self.held.clone(),
            _alloc: PhantomData,
        }
    }
}

impl<A: DirectAllocator> fmt::Debug for DirectMemoryResource<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DirectMemoryResource")
            .field("name", &A::NAME)
            .field("device", &self.device)
            .finish()
    }
}

impl<A: DirectAllocator> MemoryResource for DirectMemoryResource<A> {
    fn allocate(&self, bytes: usize, _stream: Stream) -> Result<usize> {
        if bytes == 0 {
            return Ok(0);
        }
        let ptr = crate::pressure::retry_after_relief(
            crate::pressure::Place::Device(self.device),
            bytes,
            || {
                let _ctx = ContextGuard::new(self.device)?;
                A::alloc(bytes)
            },
        )?;
        if A::KIND == MemoryKind::Device {
            self.held
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(ptr)
    }

    unsafe fn deallocate(&self, ptr: usize, bytes: usize, _stream: Stream) -> Result<()> {
        if ptr == 0 {
            return Ok(());
        }
        let _ctx = ContextGuard::new(self.device)?;
        // SAFETY: `ptr` came from `allocate` of this resource (the trait's contract), that is
        // from `A::alloc`, whose memory `cuMemFree` frees (the sealed trait's contract).
        unsafe { cuda::mem_free(ptr) }?;
        if A::KIND == MemoryKind::Device {
            // A wrong size (a caller's logic error) may not wrap the figure below zero.
            let _ = self.held.fetch_update(
                std::sync::atomic::Ordering::Relaxed,
                std::sync::atomic::Ordering::Relaxed,
                |held| Some(held.saturating_sub(bytes)),
            );
        }
        Ok(())
    }

    // Blocking: cuMemAlloc/cuMemAllocManaged/cuMemFree synchronize with the device.
    blocking_source_info!(kind: A::KIND, name: A::NAME, memory_of_device: device);
}
