//! Address-keyed maps: the one pointer hasher of rrmm ([`AddressHasher`], [`AddressMap`]) and
//! [`LiveAllocations`], a sharded pointer -> size registry that resources use to check frees.

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hashes addresses (and other integer keys) with one folded 64x64->128 multiply: every input
/// bit reaches both the low bits (bucket index) and the high bits (control bytes) of the hash,
/// so 256-byte-aligned pointers spread as well as random keys. Far cheaper than SipHash; not
/// meant for keys an adversary chooses to collide.
#[derive(Default, Clone, Copy)]
pub struct AddressHasher(u64);

impl Hasher for AddressHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
        self.write_u64(0);
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        let p = u128::from(x ^ self.0).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
    #[inline]
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// A hash map keyed by addresses (or other integers) with [`AddressHasher`].
pub type AddressMap<K, V> = HashMap<K, V, BuildHasherDefault<AddressHasher>>;

/// Number of shards of a [`LiveAllocations`] (a power of two).
const SHARDS: usize = 64;

/// One shard, on its own cache lines so that threads freeing different pointers do not contend.
#[derive(Default)]
#[repr(align(128))]
struct Shard(Mutex<AddressMap<usize, usize>>);

/// The live allocations of one resource: pointer -> size, in 64 independently locked shards.
///
/// A resource records what it hands out ([`insert`](Self::insert)) and checks every free
/// against it ([`remove`](Self::remove)): a pointer it never handed out, a double free and a
/// free with the wrong size are [`Error::Logic`] and leave the registry (and so the resource) as
/// it was. Cost: one hash and one uncontended lock per call.
pub struct LiveAllocations {
    shards: Box<[Shard]>,
}

impl Default for LiveAllocations {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for LiveAllocations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveAllocations")
            .field("len", &self.len())
            .finish()
    }
}

impl LiveAllocations {
    /// An empty registry.
    pub fn new() -> Self {
        LiveAllocations {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    #[inline]
    fn shard(&self, ptr: usize) -> &Mutex<AddressMap<usize, usize>> {
        // Fibonacci hashing on the address without its alignment bits: the top bits of the
        // product pick the shard.
        let h = ((ptr as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> (64 - SHARDS.trailing_zeros())) as usize].0
    }

    /// Records `ptr` (non-null) as live with `bytes`.
    ///
    /// # Errors
    /// [`Error::Logic`] when `ptr` is already live (the resource handed it out twice); the
    /// registry keeps the first record.
    pub fn insert(&self, ptr: usize, bytes: usize) -> Result<()> {
        let mut shard = self.shard(ptr).lock();
        match shard.entry(ptr) {
            std::collections::hash_map::Entry::Occupied(e) => Err(Error::Logic(format!(
                "allocate returned {ptr:#x} ({bytes} bytes), which is already allocated \
                 ({} bytes) and not freed",
                e.get()
            ))),
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(bytes);
                Ok(())
            }
        }
    }

    /// Checks that `ptr` is live with exactly `bytes` and forgets it.
    ///
    /// # Errors
    /// [`Error::Logic`] for a pointer that is not live (never allocated here, or already freed)
    /// and for a size other than the allocation's (the message names both sizes); the registry
    /// is unchanged then.
    pub fn remove(&self, ptr: usize, bytes: usize) -> Result<()> {
        let mut shard = self.shard(ptr).lock();
        match shard.get(&ptr) {
            None => Err(Error::Logic(format!(
                "deallocate of {ptr:#x} ({bytes} bytes), which is not allocated by this \
                 resource (never allocated here, or already freed)"
            ))),
            Some(&size) if size != bytes => Err(Error::Logic(format!(
                "deallocate of {ptr:#x} with size {bytes}, but it was allocated with size {size}"
            ))),
            Some(_) => {
                shard.remove(&ptr);
                Ok(())
            }
        }
    }

    /// Frees `ptr` of `bytes` under this registry's check, for a resource that records what
    /// it hands out: takes the record first (so a concurrent double free fails on one side; a
    /// pointer not live or a size other than the allocation's is [`Error::Logic`], its message
    /// prefixed with `who:` where given), then runs `free`, and puts the record back when
    /// `free` fails (the memory is still live then).
    ///
    /// # Errors
    /// As [`remove`](Self::remove), or `free`'s error.
    pub fn free_checked(
        &self,
        ptr: usize,
        bytes: usize,
        who: Option<&str>,
        free: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.remove(ptr, bytes).map_err(|e| match who {
            Some(who) => Error::Logic(format!("{who}: {e}")),
            None => e,
        })?;
        let freed = free();
        if freed.is_err() {
            let _ = self.insert(ptr, bytes);
        }
        freed
    }

    /// The size `ptr` was allocated with, if it is live.
    pub fn size_of(&self, ptr: usize) -> Option<usize> {
        self.shard(ptr).lock().get(&ptr).copied()
    }

    /// The live allocation `(start, bytes)` that contains `ptr`, if any.
    ///
    /// # Time Complexity
    /// O(live allocations): every shard is searched (for rare checks of raw addresses, not for
    /// frees).
    pub fn containing(&self, ptr: usize) -> Option<(usize, usize)> {
        if let Some(bytes) = self.size_of(ptr) {
            return Some((ptr, bytes));
        }
        self.shards.iter().find_map(|shard| {
            shard
                .0
                .lock()
                .iter()
                .find(|(&start, &bytes)| start <= ptr && ptr - start < bytes)
                .map(|(&start, &bytes)| (start, bytes))
        })
    }

    /// Every live allocation as (pointer, bytes), in no order.
    ///
    /// # Time Complexity
    /// O(live allocations): locks each shard in turn (not a snapshot under concurrent change).
    pub fn entries(&self) -> Vec<(usize, usize)> {
        self.shards
            .iter()
            .flat_map(|s| s.0.lock().iter().map(|(&p, &b)| (p, b)).collect::<Vec<_>>())
            .collect()
    }

    /// Number of live allocations.
    ///
    /// # Time Complexity
    /// O(shards): locks each shard in turn (not a snapshot under concurrent change).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }

    /// Whether nothing is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes live (the sum of the recorded sizes, saturating).
    ///
    /// # Time Complexity
    /// O(live allocations).
    pub fn bytes(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.0.lock()
                    .values()
                    .fold(0usize, |a, &b| a.saturating_add(b))
            })
            .fold(0usize, usize::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn insert_remove_round_trip() {
        let live = LiveAllocations::new();
        live.insert(0x1000, 8).unwrap();
        live.insert(0x2000, 300).unwrap();
        assert_eq!((live.len(), live.bytes()), (2, 308));
        assert_eq!(live.size_of(0x2000), Some(300));
        live.remove(0x1000, 8).unwrap();
        live.remove(0x2000, 300).unwrap();
        assert!(live.is_empty());
    }

    #[test]
    fn bogus_double_and_wrong_size_frees_are_logic_errors_and_change_nothing() {
        let live = LiveAllocations::new();
        live.insert(0x1000, 8).unwrap();
        let bogus = live.remove(0x9000, 8).unwrap_err();
        assert!(
            matches!(&bogus, Error::Logic(m) if m.contains("0x9000") && m.contains("not allocated"))
        );
        let wrong = live.remove(0x1000, 16).unwrap_err();
        assert!(
            matches!(&wrong, Error::Logic(m) if m.contains("size 16") && m.contains("size 8")),
            "{wrong}"
        );
        assert_eq!(
            live.size_of(0x1000),
            Some(8),
            "a wrong-size free keeps the record"
        );
        live.remove(0x1000, 8).unwrap();
        let double = live.remove(0x1000, 8).unwrap_err();
        assert!(matches!(double, Error::Logic(_)));
        assert!(live.is_empty());
    }

    #[test]
    fn containing_finds_the_allocation_around_an_interior_address() {
        let live = LiveAllocations::new();
        live.insert(0x1000, 256).unwrap();
        live.insert(0x9000, 16).unwrap();
        assert_eq!(live.containing(0x1000), Some((0x1000, 256)));
        assert_eq!(live.containing(0x10ff), Some((0x1000, 256)));
        assert_eq!(live.containing(0x1100), None);
        assert_eq!(live.containing(0x900f), Some((0x9000, 16)));
        assert_eq!(live.containing(0x8fff), None);
    }

    #[test]
    fn handing_out_a_live_pointer_twice_is_a_logic_error() {
        let live = LiveAllocations::new();
        live.insert(0x1000, 8).unwrap();
        assert!(matches!(live.insert(0x1000, 16), Err(Error::Logic(_))));
        assert_eq!(live.size_of(0x1000), Some(8));
    }

    #[test]
    fn aligned_addresses_spread_over_shards_and_buckets() {
        let live = LiveAllocations::new();
        let mut used = std::collections::HashSet::new();
        for i in 0..4096usize {
            used.insert(live.shard(0x7f00_0000_0000 + i * 256) as *const _ as usize);
        }
        assert_eq!(
            used.len(),
            SHARDS,
            "every shard gets some of 4096 consecutive blocks"
        );
        // The hash's low 12 bits (bucket index of a 4096-bucket table) are near-distinct too.
        let build = BuildHasherDefault::<AddressHasher>::default();
        let low: std::collections::HashSet<u64> = (0..4096usize)
            .map(|i| build.hash_one(0x7f00_0000_0000usize + i * 256) & 0xfff)
            .collect();
        assert!(low.len() > 2500, "{} distinct low-bit buckets", low.len());
    }

    #[test]
    fn concurrent_frees_of_one_pointer_succeed_once() {
        let live = std::sync::Arc::new(LiveAllocations::new());
        for round in 0..200usize {
            let ptr = 0x10_0000 + round * 256;
            live.insert(ptr, 256).unwrap();
            let ok: usize = std::thread::scope(|s| {
                let handles: Vec<_> = (0..4)
                    .map(|_| s.spawn(|| usize::from(live.remove(ptr, 256).is_ok())))
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap_or(0)).sum()
            });
            assert_eq!(ok, 1);
        }
        assert!(live.is_empty());
    }
}
