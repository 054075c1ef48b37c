//! The [`MemoryResource`] trait and the source resources (those with no upstream: where a
//! stack's memory comes from), one per file.

/// Declares a struct of figures and `impl Type { pub fn plus(self, other) -> Type }`: the sum
/// of two values, field by field, made from the one declaration (a new field is summed without
/// being named again).
macro_rules! summed_fields {
    (
        $(#[$meta:meta])*
        $vis:vis struct $ty:ident {
            $($(#[$field_meta:meta])* $field_vis:vis $field:ident: $field_ty:ty),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $ty {
            $($(#[$field_meta])* $field_vis $field: $field_ty),+
        }

        impl $ty {
            /// The sum of two pools' figures, field by field.
            #[must_use]
            pub fn plus(self, other: $ty) -> $ty {
                $ty { $($field: self.$field + other.$field),+ }
            }
        }
    };
}

mod above;
mod address_ranges;
mod callback;
mod calls;
mod cuda;
mod cuda_async;
mod cuda_async_managed;
mod direct;
pub mod graph;
mod host_copy;
pub mod host_pages;
mod host_virtual_memory;
mod link;
mod managed;
pub mod memory_summary;
mod outside_blocks;
mod peer;
mod pinned_host;
mod pinned_pages;
mod placement;
mod simulated;
mod simulated_vmm;
pub mod sleep;
mod system;
mod tiers;
mod virtual_memory;

pub use callback::{AllocateFn, CallbackMemoryResource, DeallocateFn, FootprintFn, HeldBytesFn};
pub use calls::Calls;
pub use cuda::{CudaMemoryResource, DeviceAlloc};
pub use cuda_async::{CudaAsyncMemoryResource, CudaAsyncViewMemoryResource};
pub use cuda_async_managed::CudaAsyncManagedMemoryResource;
pub use direct::{DirectAllocator, DirectMemoryResource};
pub use host_copy::{CopyFence, HostCopy, Toward};
pub use host_pages::mapped::SpillFigures;
pub use host_virtual_memory::{HostVirtualMemory, HOST_PAGE_SIZE};
pub(crate) use link::place_of;
pub use link::Link;
pub use managed::{ManagedAlloc, UncachedManagedMemoryResource};
pub use peer::PeerMemoryResource;
pub use pinned_host::{PinnedHostMemoryResource, PinnedOptions, DEFAULT_REGISTERED_FROM};
pub use pinned_pages::{PinnedPages, PinnedStartup};
pub use placement::{
    placement_for, whole_granules, BlockPlacer, DevicePlacement, PlaceRange, Placement,
    PlacementMode, PLACEMENT_GRANULE, PLACEMENT_HEADROOM_DIVISOR, PLACEMENT_MIN_BYTES,
};
pub use simulated::{
    SimulatedMemoryResource, MAX_SIMULATED_SIZE, SIMULATED_ADDRESS_BASE, SIMULATED_ADDRESS_SPACE,
    SIMULATED_PAGE_SIZE,
};
pub use simulated_vmm::{SimulatedVirtualMemory, DEFAULT_PAGE_SIZE};
pub use system::SystemMemoryResource;
pub use tiers::{TierBook, TierCounts};
pub use virtual_memory::{CudaVirtualMemory, VirtualMemory};

use crate::cuda::Stream;
use crate::error::Result;
pub use crate::report::{Footprint, PoolReport};
use std::sync::Arc;

/// Alignment of every allocation rrmm hands out, in bytes (RMM's `CUDA_ALLOCATION_ALIGNMENT`).
pub const ALLOCATION_ALIGNMENT: usize = 256;

/// Rounds `bytes` up to a multiple of `alignment` (a power of two); `None` on overflow.
#[inline]
pub fn align_up(bytes: usize, alignment: usize) -> Option<usize> {
    debug_assert!(alignment.is_power_of_two());
    Some(bytes.checked_add(alignment - 1)? & !(alignment - 1))
}

/// What kind of memory a resource hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryKind {
    /// Device memory (`cuMemAlloc`, memory pools).
    Device,
    /// Managed (unified) memory.
    Managed,
    /// Pinned host memory.
    PinnedHost,
    /// Pageable host memory (system allocator, HMM/ATS).
    Host,
    /// Address ranges with no memory behind them: never dereference, never pass to CUDA.
    Simulated,
}

/// `kind` and `device` (of a [`MemoryResource`], or a growth policy) for memory that is where
/// `$source` puts it, `$source` an expression of `$this` (the implementer): its upstream, its
/// core, its virtual memory.
macro_rules! memory_from {
    (|$this:ident| $source:expr) => {
        fn kind(&self) -> $crate::resource::MemoryKind {
            let $this = self;
            $source.kind()
        }

        fn device(&self) -> Option<usize> {
            let $this = self;
            $source.device()
        }
    };
}
pub(crate) use memory_from;

/// A stream-ordered source of memory. Thread-safe; shared as [`SharedResource`].
///
/// Contract: allocations are aligned to [`ALLOCATION_ALIGNMENT`]; zero bytes gives the null
/// pointer (0) and deallocating it is a no-op; memory allocated on `stream` is ready for work
/// enqueued later on `stream`; memory deallocated on `stream` may be reused at once by later work
/// on that stream and by other streams only after the proper event wait.
pub trait MemoryResource: Send + Sync {
    /// Allocates `bytes` bytes, ready for use on `stream`.
    ///
    /// # Errors
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) when the request cannot be met; CUDA
    /// errors otherwise.
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize>;

    /// Returns `ptr`, allocated from this resource with the same `bytes`, on `stream`.
    ///
    /// # Safety
    /// 1. `ptr` was returned by [`allocate`](MemoryResource::allocate) on this resource (or on a
    ///    resource that shares its memory, such as an `Arc` clone), with the same `bytes`.
    /// 2. `ptr` has not been deallocated since it was allocated (no double free).
    /// 3. No work reads or writes the memory after the free in `stream`'s order: work enqueued
    ///    on other streams has been made to complete before, or is ordered before, this call on
    ///    `stream`; the host no longer uses it.
    /// 4. `stream` is a default stream or names a live stream of the resource's device (see
    ///    [`Stream::from_raw`]).
    ///
    /// Resources that document checked frees report a broken 1 or 2 as
    /// [`Error::Logic`](crate::Error::Logic) instead, so with them only 3 and 4 are required:
    /// the suballocators (pool, fixed-size, arena; binning through its bins and upstream),
    /// simulated and system memory, the tracking, limiting and aligned adaptors, and anything
    /// behind a [`CheckedResourceAdaptor`](crate::CheckedResourceAdaptor). With CUDA's own
    /// resources (cuda, managed, pinned host, cuda_async) a broken 1 or 2 is undefined
    /// behaviour; adaptors that only forward (statistics, logging, prefetch, failure callback)
    /// are as safe as their upstream.
    ///
    /// # Errors
    /// CUDA errors from the underlying free, or a logic error for a pointer this resource does
    /// not know (where the resource can tell).
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()>;

    /// The kind of memory this resource hands out.
    fn kind(&self) -> MemoryKind {
        MemoryKind::Device
    }

    /// The device ordinal this resource allocates on, where it has one.
    fn device(&self) -> Option<usize> {
        None
    }

    /// Free and total bytes of the memory behind this resource, where known; suballocators use it
    /// to size their growth.
    fn memory_info(&self) -> Option<(usize, usize)> {
        None
    }

    /// What a call into this resource may do: call foreign code (Python) and block (wait on
    /// the GPU or the OS): its link's [`calls`](Link::calls), where every resource says it
    /// once, at construction. The Python layer decides from it, in one place, whether to
    /// release the GIL around `allocate`/`deallocate` ([`CallProfile::release_gil`]): when the
    /// call may block, and when it may reach foreign code (so that no thread waits for this
    /// resource's lock while holding the GIL that the lock's holder needs for a callback).
    /// A caller that asks often keeps the link's [`Calls`] and reads it (one load).
    fn call_profile(&self) -> CallProfile {
        self.link().calls.get()
    }

    /// A short name for reports and logs, such as `"pool"`.
    fn name(&self) -> &'static str;

    /// The one typed link to the memory below this resource ([`Link`]): its kind and device,
    /// the pools below that can sleep. Computed once when the resource is built over its
    /// upstream and held (an adaptor returns its upstream's, a suballocator its upstream's,
    /// a source resource a new one); the allocation path never walks the graph for it.
    ///
    /// The default, for resources that do not say, joins the upstreams' links and marks the
    /// result opaque (a tag of an address alone cannot find a block this resource carved);
    /// a resource without an upstream is a source of its own kind and device. Either way its
    /// calls are [`CallProfile::UNKNOWN`] (the safe default: code that does not say what it
    /// does may call foreign code and block).
    fn link(&self) -> Link {
        let unknown = || {
            Link::source(
                self.kind(),
                self.device(),
                self.identity(),
                CallProfile::UNKNOWN,
            )
        };
        let ups = self.upstreams();
        if ups.is_empty() {
            return unknown();
        }
        let links: Vec<Link> = ups.iter().map(|u| u.link()).collect();
        let mut link = Link::join(&links).unwrap_or_else(unknown);
        link.opaque.get_or_insert(self.name());
        link.calls = Calls::fixed(CallProfile::UNKNOWN);
        link
    }

    /// The figures of the memory this resource holds (a pool's footprint, counters, segments),
    /// through adaptors to the resource that holds it; `None` for resources that pass every
    /// call to CUDA.
    fn report(&self) -> Option<&dyn PoolReport> {
        None
    }

    /// The resources this one calls: an adaptor's or suballocator's upstream, a binning
    /// resource's bins. Used to walk a stack without recursion ([`crate::resource::graph`]);
    /// source resources have none.
    fn upstreams(&self) -> Vec<SharedResource> {
        Vec::new()
    }

    /// Identity in a walk over a stack: clones of a handle type that share their state return
    /// the same number (the address of the shared state); the default is this value's address.
    fn identity(&self) -> usize {
        self as *const Self as *const () as usize
    }

    /// The resource as [`Any`](std::any::Any), for callers that must know its concrete type
    /// (the Python bindings choose the class of a resource set from Rust this way); `None` for
    /// resources that do not offer it.
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        None
    }

    /// The shared resource as a shared [`Any`](std::any::Any), for callers that must know its
    /// concrete type and keep it (the Python bindings give an adaptor set from Rust its class
    /// this way); `None` for resources that do not offer it.
    fn into_any(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        None
    }
}

/// What calls into a resource may do (see [`MemoryResource::call_profile`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallProfile {
    /// A call may run foreign code (a Python callback) that needs the GIL.
    pub calls_foreign_code: bool,
    /// A call may wait on the GPU (a synchronizing CUDA call) or the OS (file I/O, the system
    /// allocator), long enough that other Python threads should run meanwhile.
    pub may_block: bool,
}

impl CallProfile {
    /// Pure Rust bookkeeping that returns at once (simulated memory).
    pub const QUICK: CallProfile = CallProfile {
        calls_foreign_code: false,
        may_block: false,
    };
    /// Calls that may wait on the GPU or the OS and never call foreign code (CUDA resources).
    pub const BLOCKING: CallProfile = CallProfile {
        calls_foreign_code: false,
        may_block: true,
    };
    /// Unknown code: may call foreign code and may block (user callbacks, the default).
    pub const UNKNOWN: CallProfile = CallProfile {
        calls_foreign_code: true,
        may_block: true,
    };

    /// Both profiles together: a resource that does what `self` does and calls `other`.
    #[must_use]
    pub const fn and(self, other: CallProfile) -> CallProfile {
        CallProfile {
            calls_foreign_code: self.calls_foreign_code || other.calls_foreign_code,
            may_block: self.may_block || other.may_block,
        }
    }

    /// The profile of a suballocator whose source (upstream) has profile `self`: it answers its
    /// calls from its own bookkeeping and reaches the source only to grow (or to wait for
    /// another stream on its slow path), under its lock, so its calls do not block: a binding
    /// keeps the GIL through them, as CuPy's pool does, since releasing and taking it back costs
    /// more than the call (about 180 ns of a 280 ns `DeviceBuffer` round trip). Foreign code
    /// below still counts: a thread that holds the GIL must never wait for the lock of a
    /// suballocator whose growth may call Python.
    #[must_use]
    pub const fn suballocating(self) -> CallProfile {
        CallProfile {
            calls_foreign_code: self.calls_foreign_code,
            may_block: false,
        }
    }

    /// Whether a binding releases the GIL around the call: when it may block (so other
    /// Python threads run) or may reach foreign code. The second matters for deadlocks: a thread
    /// must never wait for a resource's lock while holding the GIL if the lock's holder may need
    /// the GIL (a Python callback below the lock, reached from another Python thread or from a
    /// C entry point that runs without the GIL); the callback takes the GIL back itself.
    pub const fn release_gil(self) -> bool {
        self.may_block || self.calls_foreign_code
    }
}

/// A resource shared between owners (adaptors, buffers, the per-device table).
pub type SharedResource = Arc<dyn MemoryResource>;

/// A resource in `Debug` output is its [`name`](MemoryResource::name) (most resources hold
/// state with no useful `Debug`): so a type holding an upstream can derive `Debug`.
impl std::fmt::Debug for dyn MemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.name(), f)
    }
}

impl<T: MemoryResource + ?Sized> MemoryResource for Arc<T> {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        (**self).allocate(bytes, stream)
    }
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        // SAFETY: the caller's contract, forwarded unchanged to the shared resource.
        unsafe { (**self).deallocate(ptr, bytes, stream) }
    }
    fn kind(&self) -> MemoryKind {
        (**self).kind()
    }
    fn device(&self) -> Option<usize> {
        (**self).device()
    }
    fn memory_info(&self) -> Option<(usize, usize)> {
        (**self).memory_info()
    }
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn link(&self) -> Link {
        (**self).link()
    }
    fn report(&self) -> Option<&dyn PoolReport> {
        (**self).report()
    }
    fn upstreams(&self) -> Vec<SharedResource> {
        (**self).upstreams()
    }
    fn identity(&self) -> usize {
        (**self).identity()
    }
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        (**self).as_any()
    }
    fn into_any(self: Arc<Self>) -> Option<Arc<dyn std::any::Any + Send + Sync>> {
        Arc::clone(&*self).into_any()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        BinningMemoryResource, FailureCallbackResourceAdaptor, LimitingResourceAdaptor,
        LoggingResourceAdaptor, PoolMemoryResource, StatisticsResourceAdaptor,
    };

    fn callback_resource() -> SharedResource {
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        let up = sim.clone();
        Arc::new(CallbackMemoryResource::new(
            Box::new(move |bytes, stream| sim.allocate(bytes, stream)),
            // SAFETY: the callback resource passes on its caller's contract; pointers from `up`.
            Box::new(move |ptr, bytes, stream| unsafe { up.deallocate(ptr, bytes, stream) }),
            MemoryKind::Simulated,
        ))
    }

    #[test]
    fn profiles_decide_the_gil_in_one_place() {
        assert!(!CallProfile::QUICK.release_gil(), "nothing to wait for");
        assert!(CallProfile::BLOCKING.release_gil());
        assert!(
            CallProfile::UNKNOWN.release_gil(),
            "the callback takes the GIL back"
        );
        assert_eq!(
            CallProfile::QUICK.and(CallProfile::BLOCKING),
            CallProfile::BLOCKING
        );
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        assert_eq!(sim.call_profile(), CallProfile::QUICK);
        assert_eq!(
            SystemMemoryResource::new().call_profile(),
            CallProfile::BLOCKING
        );
        assert_eq!(callback_resource().call_profile(), CallProfile::UNKNOWN);
    }

    /// Issue 9's deadlock: `PoolMemoryResource.release()` released the GIL and then called a
    /// `CallbackMemoryResource` upstream under the pool's mutex while another thread held the GIL
    /// and waited for that mutex. The profile of every stack over a callback says foreign code,
    /// so every caller releases the GIL before it can wait for the mutex.
    #[test]
    fn stacks_over_a_callback_keep_the_gil() {
        let pool: SharedResource =
            Arc::new(PoolMemoryResource::new(callback_resource(), Some(1 << 16), None).unwrap());
        assert!(pool.call_profile().calls_foreign_code);
        assert!(pool.call_profile().release_gil());
        let stack = StatisticsResourceAdaptor::new(Arc::new(LimitingResourceAdaptor::new(
            pool.clone(),
            1 << 20,
        )));
        assert!(stack.call_profile().release_gil());
        let binning =
            BinningMemoryResource::new(Arc::new(SimulatedMemoryResource::new(1 << 20)), None, None)
                .unwrap();
        assert_eq!(binning.call_profile(), CallProfile::QUICK);
        binning.add_bin(4096, Some(pool)).unwrap();
        assert!(
            binning.call_profile().calls_foreign_code,
            "a bin over a callback"
        );
    }

    /// Issue 28's round-trip regression: a pool made from Python over a driver resource released
    /// the GIL on every allocate and free once the Python objects read the Rust profile, which
    /// said the source's (blocking) for every suballocator: ~180 ns of a 280 ns `DeviceBuffer`
    /// round trip. A suballocator answers from bookkeeping, so over a blocking source (system
    /// memory here, CUDA memory on a GPU) its calls keep the GIL, through the adaptors above it
    /// too; foreign code below, and resources that call the driver on every call, still release.
    #[test]
    fn suballocators_over_a_blocking_source_keep_the_gil() {
        use crate::{ArenaMemoryResource, FixedSizeMemoryResource};
        let system: SharedResource = Arc::new(SystemMemoryResource::new());
        assert!(
            system.call_profile().release_gil(),
            "the source itself blocks"
        );
        let pool: SharedResource =
            Arc::new(PoolMemoryResource::new(system.clone(), Some(1 << 20), None).unwrap());
        assert_eq!(pool.call_profile(), CallProfile::QUICK);
        let arena = ArenaMemoryResource::new(system.clone(), Some(4 << 20), false).unwrap();
        assert_eq!(arena.call_profile(), CallProfile::QUICK);
        let fixed = FixedSizeMemoryResource::new(system.clone(), 1 << 16, 1).unwrap();
        assert_eq!(fixed.call_profile(), CallProfile::QUICK);
        let binning = BinningMemoryResource::new(pool.clone(), Some(12), Some(20)).unwrap();
        assert!(!binning.call_profile().release_gil(), "bins over a pool");
        let stats = StatisticsResourceAdaptor::new(pool.clone());
        assert!(
            !stats.call_profile().release_gil(),
            "an adaptor adds nothing"
        );
        let over_callback: SharedResource =
            Arc::new(PoolMemoryResource::new(callback_resource(), Some(1 << 16), None).unwrap());
        assert!(over_callback.call_profile().release_gil(), "foreign code");
        let binning_over_system = BinningMemoryResource::new(system, None, None).unwrap();
        assert!(
            binning_over_system.call_profile().release_gil(),
            "sizes without a bin go to the blocking source on every call"
        );
    }

    #[test]
    fn adaptors_add_their_own_behaviour() {
        let sim: SharedResource = Arc::new(SimulatedMemoryResource::new(1 << 20));
        let pool: SharedResource =
            Arc::new(PoolMemoryResource::new(sim.clone(), Some(1 << 16), None).unwrap());
        assert_eq!(pool.call_profile(), CallProfile::QUICK);
        let path = std::env::temp_dir().join(format!("rrmm_profile_{}.csv", std::process::id()));
        let logging = LoggingResourceAdaptor::new(pool, &path.to_string_lossy(), false).unwrap();
        assert_eq!(logging.call_profile(), CallProfile::BLOCKING, "file I/O");
        drop(logging);
        let _ = std::fs::remove_file(&path);
        let fc = FailureCallbackResourceAdaptor::new(sim, Box::new(|_| Ok(false)));
        assert_eq!(
            fc.call_profile(),
            CallProfile::UNKNOWN,
            "the callback is any code"
        );
    }
}
