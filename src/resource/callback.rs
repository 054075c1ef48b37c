//! A resource whose allocate and deallocate are functions given by the user.

use super::outside_blocks::OutsideBlocks;
use super::{MemoryKind, MemoryResource, ALLOCATION_ALIGNMENT};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::report::{Footprint, PoolReport};

/// The allocate function of a [`CallbackMemoryResource`].
pub type AllocateFn = Box<dyn Fn(usize, Stream) -> Result<usize> + Send + Sync>;
/// The deallocate function of a [`CallbackMemoryResource`].
pub type DeallocateFn = Box<dyn Fn(usize, usize, Stream) -> Result<()> + Send + Sync>;
/// The function that says how many bytes a [`CallbackMemoryResource`]'s allocator holds
/// ([`Footprint::held_bytes`]: a cache's or pool's size), sampled often.
pub type HeldBytesFn = Box<dyn Fn() -> usize + Send + Sync>;
/// The function that gives a [`CallbackMemoryResource`]'s full [`Footprint`] (with its free
/// blocks), read where fragmentation is measured.
pub type FootprintFn = Box<dyn Fn() -> Footprint + Send + Sync>;

/// Checks what an allocate function returned for `bytes`: for a positive size, a null pointer is
/// out of memory, and an address that is not 256-byte aligned, or whose block would run past the
/// end of the address space, is [`Error::Logic`]. A refused address is not freed (rrmm cannot
/// know what it is) and counts as never allocated: whoever records live allocations records
/// only what passes.
pub(crate) fn check_returned_pointer(ptr: usize, bytes: usize) -> Result<usize> {
    if bytes == 0 {
        return Ok(ptr);
    }
    if ptr == 0 {
        return Err(Error::out_of_memory(
            bytes,
            "callback_memory_resource: the allocate function returned a null pointer",
        ));
    }
    if ptr % ALLOCATION_ALIGNMENT != 0 || ptr.checked_add(bytes).is_none() {
        return Err(Error::Logic(format!(
            "callback_memory_resource: the allocate function returned {ptr:#x} for {bytes} \
             bytes: not {ALLOCATION_ALIGNMENT}-byte aligned, or the block would run past the end \
             of the address space (rrmm does not use or free it)"
        )));
    }
    Ok(ptr)
}

/// Calls the user's functions for every allocation and deallocation.
///
/// What `allocate` returns is checked before anything uses it: for a positive size, a null
/// pointer is out of memory (the C convention for a failed allocation), and an address that is
/// not 256-byte aligned, or whose block would run past the end of the address space, is
/// [`Error::Logic`]: resources above would otherwise hand out blocks that break rrmm's
/// alignment or wrap around. A block that overlaps one still live (a pointer returned twice) is
/// [`Error::Logic`] too, and so is a free of a block the resource did not hand out or with
/// another size: the addresses come from outside rrmm, so it keeps their record.
pub struct CallbackMemoryResource {
    allocate: AllocateFn,
    deallocate: DeallocateFn,
    blocks: OutsideBlocks,
    kind: MemoryKind,
    device: Option<usize>,
    figures: Option<CallbackFigures>,
}

/// The figures of a [`CallbackMemoryResource`] whose user says how much its allocator holds
/// ([`CallbackMemoryResource::with_figures`]): its [`PoolReport`].
struct CallbackFigures {
    held_bytes: HeldBytesFn,
    footprint: Option<FootprintFn>,
}

impl PoolReport for CallbackFigures {
    fn footprint(&self) -> Footprint {
        match &self.footprint {
            Some(footprint) => footprint(),
            None => Footprint {
                held_bytes: (self.held_bytes)(),
                ..Footprint::default()
            },
        }
    }

    fn held_bytes(&self) -> usize {
        (self.held_bytes)()
    }
}

impl CallbackMemoryResource {
    /// A resource over `allocate(bytes, stream)` and `deallocate(ptr, bytes, stream)`, handing
    /// out memory of `kind`.
    pub fn new(allocate: AllocateFn, deallocate: DeallocateFn, kind: MemoryKind) -> Self {
        CallbackMemoryResource {
            allocate,
            deallocate,
            blocks: OutsideBlocks::default(),
            kind,
            device: None,
            figures: None,
        }
    }

    /// The same resource on CUDA device `device` ([`MemoryResource::device`]: what a replay
    /// synchronizes).
    pub fn on_device(mut self, device: usize) -> Self {
        self.device = Some(device);
        self
    }

    /// The same resource reporting its allocator's figures ([`MemoryResource::report`]):
    /// `held_bytes()` the bytes it holds, `footprint()` (when given) its full footprint with
    /// the free blocks; without it the footprint has the bytes held and nothing free.
    pub fn with_figures(mut self, held_bytes: HeldBytesFn, footprint: Option<FootprintFn>) -> Self {
        self.figures = Some(CallbackFigures {
            held_bytes,
            footprint,
        });
        self
    }
}

impl CallbackMemoryResource {
    /// Takes the record of every live block, for a caller that gives them back itself (the
    /// Python class, when a reference cycle through its functions is collected); later frees
    /// of them are no-ops that call nothing.
    pub fn release_live(&self) -> Vec<(usize, usize)> {
        self.blocks.release_all()
    }
}

impl std::fmt::Debug for CallbackMemoryResource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackMemoryResource")
            .finish_non_exhaustive()
    }
}

/// Calls of callback resources in progress on this thread, one inside another.
struct Nesting;

// Why process-wide: nesting is the calling thread's, whichever callback resource it calls.
std::thread_local!(static NESTED_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) });

/// How deep callback resources may call into each other on one thread: a callback that calls
/// back into the stack it serves (a binning resource whose bin's function allocates from that
/// binning resource) would otherwise recurse until the thread's stack runs out.
pub const MAX_NESTED_CALLBACKS: usize = 32;

impl Nesting {
    fn enter() -> Result<Nesting> {
        NESTED_CALLS.with(|n| {
            if n.get() >= MAX_NESTED_CALLBACKS {
                return Err(Error::Logic(format!(
                    "callback_memory_resource: callbacks nested {MAX_NESTED_CALLBACKS} deep on \
                     this thread: a callback that calls back into the resources it serves?"
                )));
            }
            n.set(n.get() + 1);
            Ok(Nesting)
        })
    }
}

impl Drop for Nesting {
    fn drop(&mut self) {
        NESTED_CALLS.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

impl MemoryResource for CallbackMemoryResource {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let ptr = {
            let _depth = Nesting::enter()?;
            (self.allocate)(bytes, stream)?
        };
        let ptr = check_returned_pointer(ptr, bytes)?;
        self.blocks.admit("callback_memory_resource", ptr, bytes)?;
        Ok(ptr)
    }

    /// # Safety
    /// Only preconditions 3 and 4 of [`MemoryResource::deallocate`]: a block this resource did
    /// not hand out, a double free or a wrong size is [`Error::Logic`] and calls nothing.
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        let _depth = Nesting::enter()?;
        self.blocks
            .free("callback_memory_resource", ptr, bytes, || {
                (self.deallocate)(ptr, bytes, stream)
            })
    }

    fn kind(&self) -> MemoryKind {
        self.kind
    }

    fn device(&self) -> Option<usize> {
        self.device
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        self.figures.as_ref().map(|f| f as &dyn PoolReport)
    }

    fn name(&self) -> &'static str {
        "callback"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Error, PoolMemoryResource, SharedResource, SimulatedMemoryResource};
    use std::sync::Arc;

    #[derive(Debug, PartialEq)]
    struct Raised(&'static str);

    /// A callback resource whose allocate fails with `Error::Callback` above `limit` bytes.
    fn failing(limit: usize, out_of_memory: bool) -> SharedResource {
        let sim = Arc::new(SimulatedMemoryResource::new(64 << 20));
        let up = sim.clone();
        Arc::new(CallbackMemoryResource::new(
            Box::new(move |bytes, stream| {
                if bytes > limit {
                    Err(Error::callback("raised", out_of_memory, Raised("exc")))
                } else {
                    sim.allocate(bytes, stream)
                }
            }),
            // SAFETY: the callback resource passes on its caller's contract; its pointers come
            // from `up`.
            Box::new(move |ptr, bytes, stream| unsafe { up.deallocate(ptr, bytes, stream) }),
            MemoryKind::Simulated,
        ))
    }

    /// Issue 18: a null or wrapping "allocation" from the user's function was handed out.
    #[test]
    fn null_unaligned_and_wrapping_pointers_are_refused() {
        let fixed = |p: usize| -> SharedResource {
            Arc::new(CallbackMemoryResource::new(
                Box::new(move |_, _| Ok(p)),
                Box::new(|_, _, _| Ok(())),
                MemoryKind::Simulated,
            ))
        };
        assert!(fixed(0)
            .allocate(100, Stream::DEFAULT)
            .unwrap_err()
            .is_out_of_memory());
        assert_eq!(fixed(0).allocate(0, Stream::DEFAULT).unwrap(), 0);
        assert!(matches!(
            fixed(0x1001).allocate(16, Stream::DEFAULT),
            Err(Error::Logic(_))
        ));
        let top = usize::MAX - 255;
        assert!(matches!(
            fixed(top).allocate(512, Stream::DEFAULT),
            Err(Error::Logic(_))
        ));
        // A pool over it reports the refusal instead of handing out the range.
        assert!(PoolMemoryResource::new(fixed(top), Some(1 << 20), None).is_err());
        assert_eq!(fixed(0x1000).allocate(16, Stream::DEFAULT).unwrap(), 0x1000);
    }

    #[test]
    fn the_callbacks_error_comes_out_untouched() {
        let mr = failing(1 << 20, false);
        let err = mr.allocate(2 << 20, Stream::DEFAULT).unwrap_err();
        assert_eq!(err.callback_payload::<Raised>(), Some(&Raised("exc")));
        let p = mr.allocate(100, Stream::DEFAULT).unwrap();
        // SAFETY: allocated just above with 100 bytes, freed once.
        unsafe { mr.deallocate(p, 100, Stream::DEFAULT) }.unwrap();
    }

    /// A callback's error passes through a pool untouched; a callback's out of memory is what
    /// the pool reacts to (it tries smaller growth, then reports its own out-of-memory error
    /// naming the upstream's message, as RMM's pool does).
    #[test]
    fn a_pool_passes_the_callbacks_error_through() {
        for out_of_memory in [false, true] {
            let pool =
                PoolMemoryResource::new(failing(1 << 20, out_of_memory), Some(1 << 20), None)
                    .unwrap();
            let err = pool.allocate(4 << 20, Stream::DEFAULT).unwrap_err();
            if out_of_memory {
                assert!(err.is_out_of_memory());
                assert!(err.to_string().contains("upstream: raised"), "{err}");
            } else {
                assert_eq!(
                    err.callback_payload::<Raised>(),
                    Some(&Raised("exc")),
                    "{err:?}"
                );
            }
            let p = pool.allocate(4096, Stream::DEFAULT).unwrap();
            // SAFETY: allocated just above with 4096 bytes, freed once.
            unsafe { pool.deallocate(p, 4096, Stream::DEFAULT) }.unwrap();
        }
    }
}
