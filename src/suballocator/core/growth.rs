//! How a stream-ordered core gets memory and gives it back: the [`Growth`] hook, and the
//! policies over an upstream resource ([`Geometric`] for the pool, [`Chunks`] for fixed-size).
//! Each policy owns its source of memory (an upstream resource, or the expandable pool's
//! virtual memory) and describes it (kind, device, call profile, free memory) to the core.
//!
//! # Extension point
//! A strategy decides the size of each upstream request and owns its error text; the core only
//! records what [`Growth::grow`] returned (a [`Block`] with its region) and hands it back through
//! [`Growth::give_back`]. Blocks coalesce only within one region, so a strategy that grows ONE
//! virtual address range by mapping pages at its end returns every extension with the region of
//! that range: the new chunk then coalesces with a free block that ends at its start. Such a
//! strategy may also unmap free granules in [`Growth::trim`], which `release()` calls after the
//! synchronize-and-merge with the fresh list as [`FreeRanges`]: it reads the free ranges, takes
//! out what it unmaps, and returns the bytes given back (the core subtracts them from the pool
//! size). A strategy that trims keeps its own record of what is mapped; at drop the core passes
//! each chunk that `grow` returned to `give_back`.

#![deny(unsafe_code)]

use super::free_list::{Block, FreeList};
use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::resource::{CallProfile, MemoryKind, SharedResource, ALLOCATION_ALIGNMENT};

/// One growth request of the core.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GrowRequest {
    /// The user's request, in bytes (for error messages).
    pub bytes: usize,
    /// The block size needed (a chunk must hold at least this).
    pub size: usize,
    /// Bytes the core holds from the upstream now.
    pub held: usize,
    /// The stream of the request (a stream-ordered upstream allocates on it).
    pub stream: Stream,
    /// Map only what the block needs, no growth step ahead (a policy that maps its own pages:
    /// [`StreamOrderedCore::grow_exactly`](super::StreamOrderedCore::grow_exactly)).
    pub exact: bool,
}

/// The free ranges of a core's fresh list, as a trimming strategy sees them.
// Used by trimming policies (the expandable pool's); none of today's policies trims.
#[allow(dead_code)]
pub(crate) trait FreeRanges {
    /// Every free block, by address.
    fn ranges(&self) -> Vec<Block>;
    /// The free blocks of at least `min` bytes, by address (cheaper than [`Self::ranges`] where
    /// most blocks are smaller: a trim of whole pages reads only these).
    fn ranges_at_least(&self, min: usize) -> Vec<Block>;
    /// The free block that ends at `end`, if one does (a growth that extends a range in place
    /// asks this of each end it could extend, rather than reading every block).
    fn ending_at(&self, end: usize) -> Option<Block>;
    /// Takes `[addr, addr + size)` out of the free block containing it; whether one did.
    fn take_range(&mut self, addr: usize, size: usize) -> bool;
    /// Puts back a range [`FreeRanges::take_range`] took out (its give-back failed).
    fn put_back(&mut self, block: Block);
}

impl<F: FreeList> FreeRanges for F {
    fn ranges(&self) -> Vec<Block> {
        self.free_ranges()
    }
    fn ranges_at_least(&self, min: usize) -> Vec<Block> {
        self.free_ranges_at_least(min)
    }
    fn ending_at(&self, end: usize) -> Option<Block> {
        self.free_block_ending_at(end)
    }
    fn take_range(&mut self, addr: usize, size: usize) -> bool {
        self.remove_range(addr, size)
    }
    fn put_back(&mut self, block: Block) {
        self.insert(block);
    }
}

/// How a core grows from, and gives back to, its source of memory (which the policy owns).
pub(crate) trait Growth: Send + Sync + std::fmt::Debug + 'static {
    /// The upstream resource the policy allocates from, if its source is one (the defaults of
    /// the describing methods below read it; a policy without one overrides them).
    fn upstream(&self) -> Option<&SharedResource> {
        None
    }

    /// The identity of the source when there is no upstream resource (the pool that maps its
    /// own pages): its link's place where its memory is not a device's.
    fn source_identity(&self) -> usize {
        0
    }

    /// A new chunk of at least `request.size` bytes.
    ///
    /// # Errors
    /// Out of memory with the strategy's own text; other upstream errors as they are.
    fn grow(&self, request: GrowRequest) -> Result<Block>;

    /// As [`Growth::grow`], seeing the fresh list's free ranges (a policy that extends one range
    /// in place picks where to map from them); the default ignores them.
    ///
    /// # Errors
    /// As [`Growth::grow`].
    fn grow_beside(&self, request: GrowRequest, fresh: &dyn FreeRanges) -> Result<Block> {
        let _ = fresh;
        self.grow(request)
    }

    /// The initial chunk of exactly `bytes` (construction), for a policy that gives chunks back;
    /// the default asks the upstream.
    ///
    /// # Errors
    /// The upstream's error; [`Error::Logic`] for a policy without an upstream that does not
    /// override it.
    fn initial_chunk(&self, bytes: usize) -> Result<Block> {
        let upstream = self
            .upstream()
            .ok_or_else(|| Error::Logic("this growth policy has no initial chunk".into()))?;
        let addr = upstream.allocate(bytes, Stream::DEFAULT)?;
        checked_chunk(upstream, addr, bytes, Stream::DEFAULT)
    }

    /// Whether the core gives fully free chunks back through [`Growth::give_back`] on
    /// `release()` and before reporting out of memory; a policy that trims in place (and keeps
    /// its own record of what is mapped) says no, and its chunks go back only at drop.
    fn gives_back_chunks(&self) -> bool {
        true
    }

    /// Whether the policy's segments are offloaded (a sleeping expandable pool: no page mapped,
    /// the live bytes on the host); snapshots mark them so.
    fn offloaded(&self) -> bool {
        false
    }

    /// The segments (address, size) of a policy that keeps its own (the expandable pool's runs
    /// of mapped pages); `None` when the core's chunks are the segments.
    fn segments(&self) -> Option<Vec<(usize, usize)>> {
        None
    }

    /// Whether giving free chunks back could let [`Growth::grow`] serve `size` bytes (the core
    /// gives chunks back before reporting out of memory only when it could).
    fn may_grow_after_release(&self, size: usize) -> bool {
        let _ = size;
        true
    }

    /// Returns a chunk that `grow` (or [`Growth::initial_chunk`]) produced; the default frees
    /// it to the upstream.
    ///
    /// # Safety
    /// 1. `chunk` is exactly a chunk that [`Growth::grow`] or [`Growth::initial_chunk`] of this
    ///    policy returned, not given back since.
    /// 2. No block of it is allocated, and every stream was synchronized after its last use.
    ///
    /// # Errors
    /// The upstream's error.
    #[allow(unsafe_code)]
    unsafe fn give_back(&self, chunk: Block) -> Result<()> {
        match self.upstream() {
            // SAFETY: by 1 the chunk came from `upstream.allocate` with this size and is freed
            // once; by 2 no work uses it.
            Some(upstream) => unsafe {
                upstream.deallocate(chunk.addr, chunk.size, Stream::DEFAULT)
            },
            None => Ok(()),
        }
    }

    /// Gives back free memory inside free blocks of `fresh` (after every stream was synchronized
    /// and merged) while more than `keep` bytes are held; the bytes given back, and the source's
    /// error if a give-back failed (the policy stops there and puts that range back in `fresh`,
    /// so what the source still holds stays in the books; the bytes given back before it count).
    /// The default trims nothing.
    fn trim(&self, fresh: &mut dyn FreeRanges, keep: usize) -> (usize, Result<()>) {
        let _ = (fresh, keep);
        (0, Ok(()))
    }

    /// The resource's `memory_info`, given what the core holds and has free; the default is the
    /// upstream's.
    fn memory_info(&self, held: usize, free: usize) -> Option<(usize, usize)> {
        let _ = (held, free);
        self.upstream()?.memory_info()
    }

    /// The kind of memory the source hands out.
    fn kind(&self) -> MemoryKind {
        self.upstream().map_or(MemoryKind::Device, |u| u.kind())
    }

    /// The source's device, where it has one.
    fn device(&self) -> Option<usize> {
        self.upstream()?.device()
    }

    /// What calls into the source may do.
    fn call_profile(&self) -> CallProfile {
        self.upstream()
            .map_or(CallProfile::UNKNOWN, |u| u.call_profile())
    }

    /// The source's short name, for debug output.
    fn source_name(&self) -> &'static str {
        self.upstream().map_or("?", |u| u.name())
    }
}

/// The chunk `[addr, addr + size)` the upstream handed out, unless it is null or would run past
/// the end of the address space (an upstream that breaks the contract: its block is given back
/// and the growth fails with [`Error::Logic`] instead of handing out addresses that wrap).
pub(crate) fn checked_chunk(
    upstream: &SharedResource,
    addr: usize,
    size: usize,
    stream: Stream,
) -> Result<Block> {
    if size > 0 && (addr == 0 || addr.checked_add(size).is_none()) {
        // SAFETY: `addr` came from `upstream.allocate` with `size` bytes on `stream` and is freed
        // once, unused.
        #[allow(unsafe_code)]
        let _ = unsafe { upstream.deallocate(addr, size, stream) };
        return Err(Error::Logic(format!(
            "{}: the upstream handed out {addr:#x} for {size} bytes, a block that is null or \
             runs past the end of the address space",
            upstream.name()
        )));
    }
    Ok(Block {
        addr,
        size,
        region: addr,
    })
}

/// The upstream's out-of-memory text without the `std::bad_alloc` prefix of the error display.
fn upstream_reason(e: &Error) -> String {
    let text = e.to_string();
    text.strip_prefix("std::bad_alloc: out_of_memory: ")
        .unwrap_or(&text)
        .to_string()
}

/// Asks the upstream for `try_size` bytes, halving in multiples of `step` down to `min_size` on
/// out of memory; out-of-memory errors get `reason(upstream text)`, built once, for the last
/// attempt. After the first failure it asks for `min_size` once: when even that fails, no size
/// between can succeed (an upstream that cannot serve `min_size` cannot serve more), and the
/// halving stops there; when it succeeds, the block goes back at once and the halving goes on,
/// so the chunk is the largest halving that fits, as without the probe.
fn allocate_halving(
    upstream: &SharedResource,
    request: GrowRequest,
    mut try_size: usize,
    min_size: usize,
    step: usize,
    reason: impl Fn(&str) -> String,
) -> Result<Block> {
    let halve = |size: usize| ((size / 2) / step * step).max(min_size);
    let out_of_memory =
        |e: &Error| Error::out_of_memory(request.bytes, reason(&upstream_reason(e)));
    let mut probed = false;
    loop {
        match upstream.allocate(try_size, request.stream) {
            Ok(addr) => return checked_chunk(upstream, addr, try_size, request.stream),
            Err(e) if e.is_out_of_memory() && try_size > min_size => {
                try_size = halve(try_size);
                if !probed && try_size > min_size {
                    probed = true;
                    let least = upstream.allocate(min_size, request.stream);
                    match least {
                        Ok(addr) => {
                            // SAFETY: allocated just above from `upstream` with `min_size` on
                            // this stream, freed once; nothing used it.
                            #[allow(unsafe_code)]
                            unsafe { upstream.deallocate(addr, min_size, request.stream) }?;
                        }
                        Err(e) if e.is_out_of_memory() => return Err(out_of_memory(&e)),
                        Err(e) => return Err(e),
                    }
                }
            }
            Err(e) if e.is_out_of_memory() => return Err(out_of_memory(&e)),
            Err(e) => return Err(e),
        }
    }
}

/// Asks the upstream for `try_size` bytes; when that is out of memory, for `try_size` less a
/// margin that doubles on each refusal (from 1/1024 of the ask), keeping the first size served,
/// and below the need halves as [`allocate_halving`]. Near a full device the driver refuses its
/// exact free figure (it keeps some memory for itself) but serves a little less; halving there
/// (RMM's way) took half of what was left, and each halved chunk left a tail too small for the
/// next request (issue 28: a 4 GiB array refused beside 6.2 GiB free in five tails). Refusals
/// are cheap and nothing is allocated and given back to find the size (a probe of 30 GiB costs
/// tens of milliseconds on an H100).
fn allocate_largest(
    upstream: &SharedResource,
    request: GrowRequest,
    try_size: usize,
    min_size: usize,
    step: usize,
    reason: impl Fn(&str) -> String,
) -> Result<Block> {
    let mut margin = (try_size / 1024).max(step);
    let mut size = try_size;
    loop {
        match upstream.allocate(size, request.stream) {
            Ok(addr) => return checked_chunk(upstream, addr, size, request.stream),
            Err(e) if e.is_out_of_memory() && size > min_size => {
                let next = try_size.saturating_sub(margin) / step * step;
                margin = margin.saturating_mul(2);
                if next <= min_size || next >= size {
                    return allocate_halving(upstream, request, min_size, min_size, step, reason);
                }
                size = next;
            }
            Err(e) if e.is_out_of_memory() => {
                return Err(Error::out_of_memory(
                    request.bytes,
                    reason(&upstream_reason(&e)),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// A growing pool's free and total memory: its `free` bytes plus the room it could still grow
/// by (the source's free memory, within `maximum` less the `held` bytes); total: the source's
/// total, capped by `maximum`. `None` when the source does not report.
pub(crate) fn memory_info_below(
    source: Option<(usize, usize)>,
    maximum: Option<usize>,
    held: usize,
    free: usize,
) -> Option<(usize, usize)> {
    let (source_free, source_total) = source?;
    let max = maximum.unwrap_or(usize::MAX);
    let room = max.saturating_sub(held).min(source_free);
    Some((free + room, source_total.min(max)))
}

/// RMM's out-of-memory error when growing by `size` bytes from `held` would pass `maximum`
/// (for the user's request of `bytes`).
///
/// # Errors
/// [`Error::OutOfMemory`] with RMM's "Maximum pool size exceeded" text.
pub(crate) fn check_maximum(
    maximum: Option<usize>,
    bytes: usize,
    held: usize,
    size: usize,
) -> Result<()> {
    let room = maximum.map_or(usize::MAX, |m| m.saturating_sub(held));
    if size <= room {
        return Ok(());
    }
    if let Some(maximum) = maximum.filter(|&m| size > m) {
        // No growth, release or trim could serve it: say so, not "reached its maximum".
        return Err(Error::out_of_memory(
            bytes,
            format!(
                "Maximum pool size exceeded: the request ({size} bytes) is larger than the \
                 pool's maximum ({maximum} bytes)"
            ),
        ));
    }
    Err(Error::out_of_memory(
        bytes,
        format!(
            "Maximum pool size exceeded: not enough room to grow, current/max/try size = {}, {}, \
             {}",
            held,
            maximum.unwrap_or(usize::MAX),
            size
        ),
    ))
}

/// The pool's policy: ask for `max(needed, pool size)` (doubling), capped by the room left to
/// `maximum` and by the upstream's free memory (when known and enough for the need; when known
/// and less than the need, ask for the need alone, once); on an upstream failure ask for a
/// little less, then less ([`allocate_largest`]), down to the need.
/// Each chunk is its own region.
#[derive(Clone, Debug)]
pub(crate) struct Geometric {
    /// Where chunks come from.
    pub upstream: SharedResource,
    /// The pool's maximum size, if any.
    pub maximum: Option<usize>,
}

impl Growth for Geometric {
    fn upstream(&self) -> Option<&SharedResource> {
        Some(&self.upstream)
    }

    fn grow(&self, request: GrowRequest) -> Result<Block> {
        let upstream = &self.upstream;
        let GrowRequest { size, held, .. } = request;
        check_maximum(self.maximum, request.bytes, held, size)?;
        let room = self.maximum.map_or(usize::MAX, |m| m.saturating_sub(held));
        let mut try_size = size.max(held).min(room);
        if let Some((free, _)) = upstream.memory_info() {
            let free = free & !(ALLOCATION_ALIGNMENT - 1);
            // Less free than the need: one request for the need itself (the upstream's own
            // answer, and a chance should its figure be stale).
            try_size = if free >= size {
                try_size.min(free)
            } else {
                size
            };
        }
        allocate_largest(
            upstream,
            request,
            try_size,
            size,
            ALLOCATION_ALIGNMENT,
            |inner| format!("Maximum pool size exceeded: upstream: {inner}"),
        )
    }

    /// Not for a request larger than the maximum or the upstream's total: giving chunks back
    /// could never make it fit, so a failure keeps them.
    fn may_grow_after_release(&self, size: usize) -> bool {
        let total = self
            .upstream
            .memory_info()
            .map_or(usize::MAX, |(_, total)| total);
        size <= self.maximum.unwrap_or(usize::MAX).min(total)
    }

    /// Free: the pool's free bytes plus what it could still grow by; total: the upstream's
    /// total, capped by the maximum.
    fn memory_info(&self, held: usize, free: usize) -> Option<(usize, usize)> {
        memory_info_below(self.upstream.memory_info(), self.maximum, held, free)
    }
}

/// The fixed-size policy: chunks of `chunk` bytes; on an upstream failure halve (in whole
/// blocks) down to one `block`.
#[derive(Clone, Debug)]
pub(crate) struct Chunks {
    /// Where chunks come from.
    pub upstream: SharedResource,
    /// Bytes per chunk.
    pub chunk: usize,
    /// Bytes per block.
    pub block: usize,
    /// The resource's name, for error messages.
    pub name: &'static str,
}

impl Growth for Chunks {
    fn upstream(&self) -> Option<&SharedResource> {
        Some(&self.upstream)
    }

    fn grow(&self, request: GrowRequest) -> Result<Block> {
        let size = request.size;
        allocate_halving(
            &self.upstream,
            request,
            self.chunk.max(size),
            size.max(self.block),
            self.block,
            |inner| format!("{}: upstream: {inner}", self.name),
        )
    }
}
