//! Where fresh managed memory goes: on the device while it has room, the rest in host memory
//! mapped for the device and made ready there, so that no kernel pays a page fault per page.
//!
//! # What it costs not to place (measured on an H200, `benches/gpu/probe_placement.py`, 8 GiB)
//! | a fresh managed range, first written by a CuPy kernel | GB/s |
//! |---|---|
//! | no advice (RMM's): the device faults each page in | 12.7 |
//! | prefetched to the device first (`cuMemPrefetchAsync`) | 795 (plus 0.03 s for the prefetch) |
//! | advised to live on the host and mapped for the device, not populated | 3.5 |
//! | the same, its pages faulted in first by 16 host threads | 52.5 = the link (0.58 s to populate) |
//!
//! So the device part of a range is prefetched, and the host part is advised (preferred
//! location the CPU, accessed by the device) and populated from host threads: the device then
//! reads and writes it over the link at the link's speed, and nothing migrates back and forth.
//!
//! # Which ranges are placed
//! Only ranges of at least [`PLACEMENT_MIN_BYTES`], and of those only whole
//! [`PLACEMENT_GRANULE`]s: a small allocation is left to the driver's first touch, as RMM leaves
//! every allocation (one fault, and RMM's own tests expect a fresh small buffer to have no
//! prefetch location). With [`PlacementMode::Blocks`] a pool over managed memory places the
//! blocks it hands out the first time, not the chunks it grows ([`BlockPlacer`]): a chunk's
//! unused tail costs nothing, and its first small blocks stay unplaced.

use crate::cuda::{self, Stream};
use parking_lot::Mutex;
use std::collections::BTreeMap;

/// Who places a managed layer's fresh memory: a typed option of the layer that owns it (the
/// plan sets it per layer), never a side effect of building another resource over it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PlacementMode {
    /// Nothing is placed: the driver's first touch (RMM's behaviour).
    Off,
    /// The managed resource places each fresh range as it allocates it (for direct use).
    #[default]
    Ranges,
    /// The suballocator over it places the blocks it hands out, the first time, through the
    /// placer its [`Link`](super::Link) carries; the managed resource places nothing itself.
    Blocks,
}

impl std::str::FromStr for PlacementMode {
    type Err = crate::error::Error;

    fn from_str(s: &str) -> crate::error::Result<Self> {
        match s {
            "off" => Ok(PlacementMode::Off),
            "ranges" => Ok(PlacementMode::Ranges),
            "blocks" => Ok(PlacementMode::Blocks),
            _ => Err(crate::error::Error::invalid(
                "placement",
                format!("{s:?} is not a placement: use \"off\", \"ranges\" or \"blocks\""),
            )),
        }
    }
}

/// The device memory a prefetch leaves free: 1/32 of the device (2.5 GiB of 80), for
/// allocations that are not managed and for the driver.
pub const PLACEMENT_HEADROOM_DIVISOR: usize = 32;

/// The unit of placement: 2 MiB, the driver's large page for managed memory.
pub const PLACEMENT_GRANULE: usize = 2 << 20;

/// The smallest range that is placed; smaller ones are left to the driver's first touch.
pub const PLACEMENT_MIN_BYTES: usize = PLACEMENT_GRANULE;

/// Where the bytes of a fresh range go: the first `device` bytes to the device, the remaining
/// `host` bytes to host memory, mapped for the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Placement {
    /// Bytes prefetched to the device (from the start of the range).
    pub device: usize,
    /// Bytes kept in host memory and mapped for the device (the rest of the range).
    pub host: usize,
}

/// How a range of `bytes` is split on a device with `free` of `total` bytes free: as much as
/// fits with the headroom left goes to the device (in whole granules, all of it when it all
/// fits), the rest to host memory.
pub fn placement_for(bytes: usize, free: usize, total: usize) -> Placement {
    let room = free.saturating_sub(total / PLACEMENT_HEADROOM_DIVISOR);
    let device = if bytes <= room {
        bytes
    } else {
        room / PLACEMENT_GRANULE * PLACEMENT_GRANULE
    };
    Placement {
        device,
        host: bytes - device,
    }
}

/// The whole granules inside `[addr, addr + bytes)`, as `(start, end)` addresses; `None` when
/// the range is smaller than [`PLACEMENT_MIN_BYTES`] or holds no whole granule.
pub fn whole_granules(addr: usize, bytes: usize) -> Option<(usize, usize)> {
    if bytes < PLACEMENT_MIN_BYTES {
        return None;
    }
    let start = addr.checked_next_multiple_of(PLACEMENT_GRANULE)?;
    let end = addr.checked_add(bytes)? / PLACEMENT_GRANULE * PLACEMENT_GRANULE;
    (start < end).then_some((start, end))
}

/// What placing a range does to the memory, behind a trait so that the bookkeeping is tested
/// without a GPU.
pub trait PlaceRange: Send + Sync + std::fmt::Debug {
    /// Places the fresh range `[addr, addr + bytes)` (whole granules, no data in it) for work on
    /// `stream`; where it went, `None` where the driver refused (placement is advice).
    fn place(&self, addr: usize, bytes: usize, stream: Stream) -> Option<Placement>;
}

/// The driver's placement for managed memory of device `ordinal`.
#[derive(Debug)]
pub struct DevicePlacement {
    ordinal: usize,
    /// Bytes prefetched to the device since the device was last synchronized: a prefetch is
    /// queued on a stream, and the driver's free figure shows it only once it has run.
    queued: Mutex<usize>,
}

impl DevicePlacement {
    /// Placement for managed memory of device `ordinal`.
    pub fn new(ordinal: usize) -> Self {
        DevicePlacement {
            ordinal,
            queued: Mutex::new(0),
        }
    }

    /// The split of `bytes` given the device's free memory less the prefetches still queued;
    /// when those would decide it, the device is synchronized once and asked again.
    fn split(&self, bytes: usize) -> Option<Placement> {
        let mut queued = self.queued.lock();
        let (free, total) = cuda::device_memory_info(self.ordinal).ok()?;
        let split = placement_for(bytes, free.saturating_sub(*queued), total);
        if split.host == 0 || *queued == 0 {
            *queued += split.device;
            return Some(split);
        }
        cuda::context_synchronize().ok()?;
        *queued = 0;
        let (free, total) = cuda::device_memory_info(self.ordinal).ok()?;
        let split = placement_for(bytes, free, total);
        *queued += split.device;
        Some(split)
    }
}

impl PlaceRange for DevicePlacement {
    fn place(&self, addr: usize, bytes: usize, stream: Stream) -> Option<Placement> {
        let split = self.split(bytes)?;
        if split.device > 0 {
            // SAFETY: the trait's contract: `[addr, addr + bytes)` is fresh managed memory of
            // this device; a prefetch moves pages, it changes no data.
            unsafe { cuda::mem_prefetch_async(addr, split.device, self.ordinal, stream) }.ok()?;
        }
        if split.host > 0 {
            let host = addr + split.device;
            // SAFETY: as above; advice changes no data.
            unsafe { cuda::mem_advise_host_resident(host, split.host, self.ordinal) }.ok()?;
            // SAFETY: as above: the range is managed memory, valid for reading from the host;
            // reading a byte of each page makes it on the host (preferred location) and maps
            // it for the device (accessed by), and changes no data.
            unsafe { crate::os::host_pages::fault_in_readonly(host, split.host) };
        }
        Some(split)
    }
}

/// Places the blocks a pool over managed memory hands out, each whole granule once: the
/// granules placed are remembered until the memory under them goes back to the driver
/// ([`BlockPlacer::forget`]). Counts where the bytes went.
#[derive(Debug)]
pub struct BlockPlacer {
    how: Box<dyn PlaceRange>,
    /// Placed runs of granules: start -> end, disjoint, not adjacent.
    placed: Mutex<BTreeMap<usize, usize>>,
    /// Bytes placed on the device and on the host so far (not decreased by `forget`).
    totals: Mutex<Placement>,
}

impl BlockPlacer {
    /// A placer that places through `how`.
    pub fn new(how: Box<dyn PlaceRange>) -> Self {
        BlockPlacer {
            how,
            placed: Mutex::new(BTreeMap::new()),
            totals: Mutex::new(Placement::default()),
        }
    }

    /// Places the granules of the block `[addr, addr + bytes)` not placed before (nothing for
    /// a block smaller than [`PLACEMENT_MIN_BYTES`]).
    ///
    /// # Time Complexity
    /// O(log runs + runs the block overlaps).
    pub fn place(&self, addr: usize, bytes: usize, stream: Stream) {
        let Some((start, end)) = whole_granules(addr, bytes) else {
            return;
        };
        let gaps = self.claim(start, end);
        for (gap_start, gap_end) in gaps {
            if let Some(split) = self.how.place(gap_start, gap_end - gap_start, stream) {
                let mut totals = self.totals.lock();
                totals.device += split.device;
                totals.host += split.host;
            }
        }
    }

    /// Marks `[start, end)` placed; the parts of it that were not (to place now).
    fn claim(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        let mut placed = self.placed.lock();
        // The common case once a pool is warm: one placed run covers the block (no change).
        if placed
            .range(..=start)
            .next_back()
            .is_some_and(|(_, &e)| e >= end)
        {
            return Vec::new();
        }
        let mut gaps = Vec::new();
        let mut cursor = start;
        let mut new_start = start;
        let mut new_end = end;
        // The run that starts at or before `start` and reaches it (or touches it).
        if let Some((&s, &e)) = placed.range(..=start).next_back() {
            if e >= start {
                new_start = s;
                cursor = cursor.max(e);
                new_end = new_end.max(e);
                placed.remove(&s);
            }
        }
        let overlapping: Vec<(usize, usize)> =
            placed.range(start..=end).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in overlapping {
            if s > cursor {
                gaps.push((cursor, s.min(end)));
            }
            cursor = cursor.max(e);
            new_end = new_end.max(e);
            placed.remove(&s);
        }
        if cursor < end {
            gaps.push((cursor, end));
        }
        placed.insert(new_start, new_end);
        gaps
    }

    /// Forgets the placement of `[addr, addr + bytes)` (the memory went back to the driver; a
    /// range allocated there later is fresh again).
    pub fn forget(&self, addr: usize, bytes: usize) {
        // Whole granules: a granule any of whose bytes went back is fresh again.
        let Some(end) = addr
            .checked_add(bytes)
            .and_then(|e| e.checked_next_multiple_of(PLACEMENT_GRANULE))
        else {
            return;
        };
        let addr = addr / PLACEMENT_GRANULE * PLACEMENT_GRANULE;
        let mut placed = self.placed.lock();
        let mut touched: Vec<(usize, usize)> = Vec::new();
        if let Some((&s, &e)) = placed.range(..addr).next_back() {
            if e > addr {
                touched.push((s, e));
            }
        }
        touched.extend(placed.range(addr..end).map(|(&s, &e)| (s, e)));
        for (s, e) in touched {
            placed.remove(&s);
            if s < addr {
                placed.insert(s, addr);
            }
            if e > end {
                placed.insert(end, e);
            }
        }
    }

    /// Bytes placed on the device and on the host so far.
    pub fn totals(&self) -> Placement {
        *self.totals.lock()
    }

    /// Bytes currently marked placed.
    pub fn placed_bytes(&self) -> usize {
        self.placed.lock().iter().map(|(s, e)| e - s).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Arc;

    const GIB: usize = 1 << 30;
    const G: usize = PLACEMENT_GRANULE;

    #[test]
    fn ranges_go_to_the_device_while_they_fit_and_split_past_it() {
        let total = 32 * GIB; // 1 GiB headroom
        let whole = |device, host| Placement { device, host };
        assert_eq!(placement_for(GIB, 3 * GIB, total), whole(GIB, 0));
        assert_eq!(placement_for(2 * GIB, 3 * GIB, total), whole(2 * GIB, 0));
        // One byte too many: the room in whole granules on the device, the rest on the host.
        assert_eq!(
            placement_for(2 * GIB + 1, 3 * GIB, total),
            whole(2 * GIB, 1)
        );
        assert_eq!(
            placement_for(4 * GIB, 3 * GIB, total),
            whole(2 * GIB, 2 * GIB)
        );
        assert_eq!(placement_for(1, 0, total), whole(0, 1));
        let huge = placement_for(usize::MAX, usize::MAX, total);
        assert_eq!(huge.device % G, 0);
        assert_eq!(huge.device + huge.host, usize::MAX);
    }

    #[test]
    fn small_ranges_and_ranges_without_a_whole_granule_are_not_placed() {
        assert_eq!(whole_granules(0, G - 1), None);
        assert_eq!(whole_granules(256, G), None);
        assert_eq!(whole_granules(0, G), Some((0, G)));
        assert_eq!(whole_granules(256, 3 * G), Some((G, 3 * G)));
        assert_eq!(whole_granules(usize::MAX - G, 2 * G), None);
    }

    /// Records each range placed; splits as a device with `room` bytes of room would.
    #[derive(Debug, Default)]
    struct Recorder {
        calls: Mutex<Vec<(usize, usize)>>,
    }

    impl PlaceRange for Arc<Recorder> {
        fn place(&self, addr: usize, bytes: usize, _stream: Stream) -> Option<Placement> {
            self.calls.lock().push((addr, bytes));
            Some(Placement {
                device: bytes,
                host: 0,
            })
        }
    }

    #[test]
    fn each_granule_is_placed_once_until_forgotten() {
        let rec = Arc::new(Recorder::default());
        let placer = BlockPlacer::new(Box::new(rec.clone()));
        placer.place(0, 4 * G, Stream::DEFAULT);
        placer.place(G, 4 * G, Stream::DEFAULT); // only [4G, 5G) is new
        placer.place(256, 100, Stream::DEFAULT); // small: nothing
        assert_eq!(*rec.calls.lock(), vec![(0, 4 * G), (4 * G, G)]);
        placer.forget(2 * G, G);
        placer.place(0, 8 * G, Stream::DEFAULT);
        assert_eq!(rec.calls.lock()[2..], [(2 * G, G), (5 * G, 3 * G)]);
        assert_eq!(placer.placed_bytes(), 8 * G);
        assert_eq!(placer.totals().device, 9 * G);
    }

    proptest! {
        /// Against a model (a set of granules): every granule placed is placed exactly once
        /// between forgets, and only whole granules of blocks of at least the minimum.
        #[test]
        fn placement_matches_a_granule_model(
            ops in prop::collection::vec((any::<bool>(), 0usize..64, 0usize..(16 * G)), 1..60)
        ) {
            let rec = Arc::new(Recorder::default());
            let placer = BlockPlacer::new(Box::new(rec.clone()));
            let mut model = std::collections::BTreeSet::new();
            for (is_place, start_granule, bytes) in ops {
                let addr = start_granule * G + (bytes % 7) * 256;
                let before = rec.calls.lock().len();
                if is_place {
                    placer.place(addr, bytes, Stream::DEFAULT);
                    let mut expected = Vec::new();
                    if let Some((s, e)) = whole_granules(addr, bytes) {
                        for g in (s..e).step_by(G) {
                            if model.insert(g) {
                                expected.push(g);
                            }
                        }
                    }
                    let got: Vec<usize> = rec.calls.lock()[before..]
                        .iter()
                        .flat_map(|&(a, n)| (a..a + n).step_by(G))
                        .collect();
                    prop_assert_eq!(got, expected);
                } else {
                    placer.forget(addr, bytes);
                    let (s, e) = (addr, addr + bytes);
                    model.retain(|&g| g + G <= s || g >= e);
                }
                prop_assert_eq!(placer.placed_bytes(), model.len() * G);
            }
        }
    }
}
