//! Allocation by tag: each tag has an expandable pool of its own, so each sleeps and wakes on its
//! own (an engine drops its KV cache's pool between phases and keeps its weights' on the
//! device, as vLLM's `sleep(offload_tags)` and torch_memory_saver's `pause(tag)` do).
//!
//! An allocation goes to the pool of the calling thread's current tag
//! ([`TaggedMemoryResource::set_current_tag`]; the first tag's when none is set), a free to the
//! pool whose addresses hold the pointer (every pool has a reservation of its own, so the owner
//! is one ordered lookup): a block allocated in one tag's region and freed outside it goes back
//! where it came from. Set as the current device resource, every framework hook (CuPy, Numba,
//! PyTorch, `DeviceBuffer`) allocates by tag without knowing it.
//!
//! Its link is made once and held: a tag added later joins its live cells (the calls, the pools
//! whose memory moves), so a resource built over the tagged resource before the tag was added
//! still sees the tag's pool (refuses its sleeping memory, is its tenant). Its figures
//! ([`PoolReport`]) are its tags' pools' together.

use crate::cuda::Stream;
use crate::error::{Error, Result};
use crate::report::{Footprint, MemoryStats, PoolReport, SegmentInfo};
use crate::resource::{Link, MemoryKind, MemoryResource, SharedResource};
use crate::suballocator::ExpandableMemoryResource;
use parking_lot::RwLock;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The most tags one [`TaggedMemoryResource`] takes.
pub const MAX_TAGS: usize = 64;

/// One tag and its pool.
#[derive(Debug)]
struct Member {
    name: String,
    pool: ExpandableMemoryResource,
    shared: SharedResource,
}

#[derive(Debug, Default)]
struct Members {
    tags: Vec<Member>,
    /// Reservation start -> (end, tag index), for frees.
    by_address: BTreeMap<usize, (usize, usize)>,
}

impl Members {
    /// The index of the tag whose pool's addresses hold `ptr`.
    fn owner(&self, ptr: usize) -> Option<usize> {
        self.by_address
            .range(..=ptr)
            .next_back()
            .filter(|(_, &(end, _))| ptr < end)
            .map(|(_, &(_, i))| i)
    }
}

// The calling thread's current tag: (the resource's identity, tag index + 1; 0: none).
// Why process-wide: the current tag is the calling thread's (a region is entered and left on one
// thread), whichever tagged resource it allocates from; one read per allocation.
std::thread_local!(static CURRENT: Cell<(usize, usize)> = const { Cell::new((0, 0)) });

/// A never reused number for a tagged resource: the key of the calling thread's current tag,
/// which must not take a new resource for a dropped one.
fn next_key() -> usize {
    // Why process-wide: the current tag is per thread across every tagged resource.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Allocation by tag (see the module docs). Clones share the tags.
#[derive(Clone, Debug)]
pub struct TaggedMemoryResource {
    members: Arc<RwLock<Members>>,
    /// Its link, made with the first tag and held: every tag's pool joins its live cells (the
    /// calls, the pools whose memory moves) as it is added.
    link: Link,
    /// The key of the calling thread's current tag (never reused).
    key: usize,
}

impl TaggedMemoryResource {
    /// A resource whose first tag, `name`, allocates from `pool` (where allocations go when no
    /// tag is current).
    pub fn new(name: impl Into<String>, pool: ExpandableMemoryResource) -> Self {
        let link = Link::join(&[pool.link()]).unwrap_or_else(|| pool.link());
        let tagged = TaggedMemoryResource {
            members: Arc::new(RwLock::new(Members::default())),
            link,
            key: next_key(),
        };
        let mut members = tagged.members.write();
        Self::insert(&mut members, name.into(), pool);
        drop(members);
        tagged
    }

    fn insert(members: &mut Members, name: String, pool: ExpandableMemoryResource) {
        let base = pool.virtual_memory().base();
        let end = base + pool.virtual_memory().reserved_bytes();
        members.by_address.insert(base, (end, members.tags.len()));
        members.tags.push(Member {
            name,
            shared: Arc::new(pool.clone()),
            pool,
        });
    }

    /// Adds tag `name`, allocating from `pool`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name already taken, a pool whose addresses overlap a
    /// tag's pool (the same pool twice), or more than [`MAX_TAGS`] tags.
    pub fn add_tag(&self, name: impl Into<String>, pool: ExpandableMemoryResource) -> Result<()> {
        let name = name.into();
        let mut members = self.members.write();
        if members.tags.len() >= MAX_TAGS {
            return Err(Error::invalid("tag", format!("at most {MAX_TAGS} tags")));
        }
        if members.tags.iter().any(|m| m.name == name) {
            return Err(Error::invalid("tag", format!("{name:?} is a tag already")));
        }
        let base = pool.virtual_memory().base();
        let end = base + pool.virtual_memory().reserved_bytes();
        let overlaps = members
            .by_address
            .iter()
            .any(|(&start, &(stop, _))| start < end && base < stop);
        if overlaps {
            return Err(Error::invalid(
                "pool",
                format!("the pool for {name:?} is a tag's pool already"),
            ));
        }
        // The pool's cells join this resource's: every resource above sees the new tag.
        let part = pool.link();
        self.link.calls.add_part(&part.calls);
        self.link.sleep.add_part(&part.sleep);
        Self::insert(&mut members, name, pool);
        Ok(())
    }

    /// The tags, in the order they were added.
    pub fn tags(&self) -> Vec<String> {
        self.members
            .read()
            .tags
            .iter()
            .map(|m| m.name.clone())
            .collect()
    }

    /// The pool of tag `name`.
    pub fn pool(&self, name: &str) -> Option<ExpandableMemoryResource> {
        self.members
            .read()
            .tags
            .iter()
            .find(|m| m.name == name)
            .map(|m| m.pool.clone())
    }

    fn identity_key(&self) -> usize {
        self.key
    }

    /// Makes `name` the calling thread's current tag (`None`: no tag, the first tag's pool);
    /// returns the previous one (to set back when a region ends).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a name that is not a tag (nothing changes).
    pub fn set_current_tag(&self, name: Option<&str>) -> Result<Option<String>> {
        let index = match name {
            None => 0,
            Some(name) => {
                let members = self.members.read();
                let i = members
                    .tags
                    .iter()
                    .position(|m| m.name == name)
                    .ok_or_else(|| Error::invalid("tag", format!("{name:?} is not a tag")))?;
                i + 1
            }
        };
        let previous = self.current_tag();
        CURRENT.with(|c| c.set((self.identity_key(), index)));
        Ok(previous)
    }

    /// The calling thread's current tag (`None`: none set).
    pub fn current_tag(&self) -> Option<String> {
        let (key, index) = CURRENT.with(Cell::get);
        if key != self.identity_key() || index == 0 {
            return None;
        }
        self.members
            .read()
            .tags
            .get(index - 1)
            .map(|m| m.name.clone())
    }

    /// The index of the tag an allocation of this thread goes to.
    #[inline]
    fn current_index(&self) -> usize {
        let (key, index) = CURRENT.with(Cell::get);
        if key == self.identity_key() {
            index.saturating_sub(1)
        } else {
            0
        }
    }
}

impl MemoryResource for TaggedMemoryResource {
    fn allocate(&self, bytes: usize, stream: Stream) -> Result<usize> {
        let members = self.members.read();
        let member = members
            .tags
            .get(self.current_index())
            .unwrap_or(&members.tags[0]);
        member.shared.allocate(bytes, stream)
    }

    /// Frees through the pool whose addresses hold `ptr`.
    ///
    /// # Safety
    /// As [`MemoryResource::deallocate`]; a pointer that no tag's pool holds is [`Error::Logic`].
    unsafe fn deallocate(&self, ptr: usize, bytes: usize, stream: Stream) -> Result<()> {
        let members = self.members.read();
        if ptr == 0 {
            // SAFETY: a null pointer is never a live allocation: freeing it is a no-op.
            return unsafe { members.tags[0].shared.deallocate(0, bytes, stream) };
        }
        let Some(i) = members.owner(ptr) else {
            return Err(Error::Logic(format!(
                "tagged: deallocate of {ptr:#x}, which no tag's pool holds"
            )));
        };
        // SAFETY: the pool whose addresses hold `ptr` made it (the caller's contract gives the
        // rest, passed on).
        unsafe { members.tags[i].shared.deallocate(ptr, bytes, stream) }
    }

    fn kind(&self) -> MemoryKind {
        self.link.kind
    }

    fn device(&self) -> Option<usize> {
        self.link.device
    }

    fn memory_info(&self) -> Option<(usize, usize)> {
        self.members.read().tags[0].shared.memory_info()
    }

    fn name(&self) -> &'static str {
        "tagged"
    }

    fn upstreams(&self) -> Vec<SharedResource> {
        self.members
            .read()
            .tags
            .iter()
            .map(|m| m.shared.clone())
            .collect()
    }

    /// Every tag's pool's, held and grown as tags are added: a sleep of the whole resource
    /// sleeps every tag.
    fn link(&self) -> Link {
        self.link.clone()
    }

    fn report(&self) -> Option<&dyn PoolReport> {
        Some(self)
    }

    fn identity(&self) -> usize {
        Arc::as_ptr(&self.members) as *const () as usize
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }
}

/// The tags' pools' figures together: bytes and counts summed (a peak is the sum of the pools'
/// peaks, at least the stack's), every pool's segments.
impl PoolReport for TaggedMemoryResource {
    fn footprint(&self) -> Footprint {
        self.pools_reports(|r| r.footprint())
            .into_iter()
            .fold(Footprint::default(), Footprint::plus)
    }

    /// The pools' held bytes, without their footprints' walks.
    fn held_bytes(&self) -> usize {
        self.pools_reports(|r| r.held_bytes()).into_iter().sum()
    }

    fn memory_stats(&self) -> Option<MemoryStats> {
        self.pools_reports(|r| r.memory_stats())
            .into_iter()
            .flatten()
            .reduce(MemoryStats::plus)
    }

    fn reset_peak_memory_stats(&self) -> bool {
        self.pools_reports(|r| r.reset_peak_memory_stats())
            .into_iter()
            .fold(false, |a, b| a | b)
    }

    fn memory_snapshot(&self) -> Option<Vec<SegmentInfo>> {
        let all: Vec<SegmentInfo> = self
            .pools_reports(|r| r.memory_snapshot())
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        Some(all)
    }

    fn busy(&self) -> bool {
        self.pools_reports(|r| r.busy()).into_iter().any(|b| b)
    }
}

impl TaggedMemoryResource {
    /// `f` of each tag's pool's report, in the order the tags were added.
    fn pools_reports<T>(&self, f: impl Fn(&dyn PoolReport) -> T) -> Vec<T> {
        let pools: Vec<ExpandableMemoryResource> = self
            .members
            .read()
            .tags
            .iter()
            .map(|m| m.pool.clone())
            .collect();
        pools
            .iter()
            .filter_map(|p| MemoryResource::report(p).map(&f))
            .collect()
    }
}

#[cfg(test)]
mod tests;
