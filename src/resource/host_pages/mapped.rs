//! Host pages an expandable pool spills to when its device is full: pinned host memory the
//! driver makes on the device's host NUMA node and maps under the pool's own addresses, so the
//! device reads the data in place over the link, and a later
//! [`promote`](crate::resource::VirtualMemory::promote) moves it to device memory at the same addresses.
//!
//! The driver makes these pages slowly (3-5 GB/s on an H200, against 40+ GB/s for the host page
//! supply's registered pages), so a [`HostPageKeep`] makes them once, ahead of need where asked
//! ([`HostPageKeep::make_ahead`], on several threads), and keeps every page that is unmapped for
//! the next spill, within a limit on the bytes of host pages it holds (mapped and kept), checked
//! against the host's room (cgroup-aware) before a page is made.

use crate::cuda::vmm::{HostPageSource, PhysicalMemory};
use crate::error::{Error, Result};
use parking_lot::Mutex;
use serde::Serialize;

summed_fields! {
    /// The figures of the host pages a pool spills to.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
    pub struct SpillFigures {
        /// The most bytes of host pages held at once (mapped and kept).
        pub limit: usize,
        /// Bytes of host pages mapped under the pool's addresses now.
        pub spilled: usize,
        /// Bytes of host pages made and kept, not mapped (ready for the next spill).
        pub kept: usize,
        /// Bytes of host pages ever made.
        pub made: u64,
        /// Of those, bytes made ahead of need in the background as the device filled (the
        /// rest were made when a spill needed them, or by `make_ahead`).
        pub made_ahead: u64,
        /// Bytes of host pages taken again after an unmap (not made twice).
        pub reused: u64,
        /// Bytes moved from host pages to device memory by promotion.
        pub promoted: u64,
        /// Seconds promotions spent making device memory and mapping it at a second address.
        pub promote_make_s: f64,
        /// Seconds promotions spent copying over the link.
        pub promote_copy_s: f64,
        /// Seconds promotions spent remapping (host pages out, device memory in).
        pub promote_remap_s: f64,
        /// Of the bytes promoted, those moved into device pages the pool had free (lent to the
        /// promotion where they lay mapped: no device memory made, no second mapping).
        pub promote_reused: u64,
    }
}

/// The mark from which a spilling pool keeps host pages ready, and how many: with `free` of
/// `total` device bytes free and `spilled` bytes spilled, `None` while the device is less than
/// three quarters full; past it, a sixteenth of the device or half of what has spilled,
/// whichever is more (the pool sets it itself: no size asked of the user).
pub fn spill_window(free: usize, total: usize, spilled: usize) -> Option<usize> {
    (free <= total / 4).then(|| (total / 16).max(spilled / 2))
}

/// The host pages of one device's virtual range: made on demand or ahead, kept when unmapped.
#[derive(Debug)]
pub struct HostPageKeep {
    ordinal: usize,
    page_size: usize,
    state: Mutex<KeepState>,
}

#[derive(Debug, Default)]
struct KeepState {
    free: Vec<PhysicalMemory>,
    /// Pages being made by `make_ahead` (counted against the limit).
    making: usize,
    /// Bytes the background maker keeps ready (kept, not mapped), as far as the limit and
    /// the host's room allow ([`HostPageKeep::keep_ahead`]).
    ahead_target: usize,
    /// Whether the background maker runs.
    maker: bool,
    /// When a spill last found no kept page and made its own: the demand outruns the maker,
    /// which then waits ([`DEMAND_QUIET`]).
    outran_at: Option<std::time::Instant>,
    figures: SpillFigures,
}

/// How long the background maker waits after a spill made its own page. The driver makes host
/// pages one at a time whatever the threads, so while spills outrun the maker its pages add
/// nothing to their rate, and the pages it has made ahead when they stop are made for nothing
/// (W11: 4.5-11 GB past the spill); it makes them once the spills pause, as the device
/// computes.
pub const DEMAND_QUIET: std::time::Duration = std::time::Duration::from_millis(100);

impl KeepState {
    fn held(&self, page_size: usize) -> usize {
        self.figures.spilled + self.figures.kept + self.making * page_size
    }

    /// A page just made, kept free for the next spill and counted as made.
    fn keep_made(&mut self, page: PhysicalMemory) {
        self.figures.kept += page.size();
        self.figures.made += page.size() as u64;
        self.free.push(page);
    }
}

impl HostPageKeep {
    /// Host pages of `page_size` bytes for device `ordinal`, at most `limit` bytes of them.
    pub fn new(ordinal: usize, page_size: usize, limit: usize) -> Self {
        HostPageKeep {
            ordinal,
            page_size,
            state: Mutex::new(KeepState {
                figures: SpillFigures {
                    limit,
                    ..SpillFigures::default()
                },
                ..KeepState::default()
            }),
        }
    }

    /// The figures now.
    pub fn figures(&self) -> SpillFigures {
        self.state.lock().figures
    }

    /// Counts `bytes` moved to the device by a promotion, and its times.
    pub fn count_promoted(&self, bytes: usize, times: crate::cuda::vmm::PromoteTimes) {
        let f = &mut self.state.lock().figures;
        f.promoted += bytes as u64;
        f.promote_make_s += times.make_s;
        f.promote_copy_s += times.copy_s;
        f.promote_remap_s += times.remap_s;
        f.promote_reused += times.reused as u64;
    }

    /// Makes pages until `bytes` (rounded up to pages) are kept free or the limit is reached,
    /// on `threads` threads (at least one); returns the bytes made. Allocation never waits for
    /// it: a spill meanwhile makes its own page.
    ///
    /// # Errors
    /// Out of memory when the host has no room for the pages (checked before any is made);
    /// the first CUDA error of a thread (the pages made before it are kept).
    pub fn make_ahead(&self, bytes: usize, threads: usize) -> Result<usize> {
        let want = {
            let mut state = self.state.lock();
            let room = state
                .figures
                .limit
                .saturating_sub(state.held(self.page_size));
            let lack = bytes.saturating_sub(state.figures.kept);
            let pages = lack.div_ceil(self.page_size).min(room / self.page_size);
            state.making += pages;
            pages
        };
        if want == 0 {
            return Ok(0);
        }
        if let Err(e) = crate::os::host_pages::check_host_room(want * self.page_size, true) {
            self.state.lock().making -= want;
            return Err(e);
        }
        let threads = threads.clamp(1, want);
        let made = std::sync::atomic::AtomicUsize::new(0);
        let first_error = Mutex::new(None);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let share = want / threads + usize::from(t < want % threads);
                let (made, first_error) = (&made, &first_error);
                scope.spawn(move || {
                    let _ctx = crate::cuda::ContextGuard::new(self.ordinal);
                    for _ in 0..share {
                        let page = PhysicalMemory::new_on_host(self.ordinal, self.page_size);
                        let mut state = self.state.lock();
                        state.making -= 1;
                        match page {
                            Ok(page) => {
                                state.keep_made(page);
                                made.fetch_add(
                                    self.page_size,
                                    std::sync::atomic::Ordering::Relaxed,
                                );
                            }
                            Err(e) => {
                                first_error.lock().get_or_insert(e);
                            }
                        }
                    }
                });
            }
        });
        match first_error.into_inner() {
            Some(e) => Err(e),
            None => Ok(made.into_inner()),
        }
    }

    /// Keeps at least `kept` bytes of pages made and ready for the next spills (within the
    /// limit and the host's room), made by one background thread, which stops once they are;
    /// a later call with the same or a larger figure starts it again as spills take pages.
    /// Never waits. One thread: the driver makes host pages at one rate (4-5 GB/s on an H200)
    /// whatever the size of each call or the threads making them (benches/gpu/
    /// probe_host_page_rate.cu); it yields to spills that make their own pages
    /// ([`DEMAND_QUIET`]).
    pub fn keep_ahead(self: &std::sync::Arc<Self>, kept: usize) {
        {
            let mut state = self.state.lock();
            state.ahead_target = state.ahead_target.max(kept);
            if state.maker || !self.ahead_lacks(&state) {
                return;
            }
            state.maker = true;
        }
        let keep = std::sync::Arc::downgrade(self);
        let ordinal = self.ordinal;
        let spawned = std::thread::Builder::new()
            .name("rrmm-spill-ahead".into())
            .spawn(move || {
                let _ctx = crate::cuda::ContextGuard::new(ordinal);
                while let Some(keep) = keep.upgrade() {
                    if !keep.make_one_ahead() {
                        break;
                    }
                }
            });
        if spawned.is_err() {
            self.state.lock().maker = false;
        }
    }

    /// Stops the background maker after the page it makes now, until the next
    /// [`keep_ahead`](Self::keep_ahead): a promotion gives host pages back, and the driver
    /// serializes its calls, so a page made meanwhile (30-60 ms each at 128 MiB on an H200)
    /// holds up the promotion's remapping (W11 at F = 1.5: the remap took 1.9 s with the maker
    /// running, 2.4x the link's time for the bytes).
    pub fn stop_ahead(&self) {
        self.state.lock().ahead_target = 0;
    }

    /// Whether the kept pages (and those being made) fall short of the target, with room
    /// under the limit for one more page.
    fn ahead_lacks(&self, state: &KeepState) -> bool {
        state.figures.kept + state.making * self.page_size < state.ahead_target
            && state.held(self.page_size) + self.page_size <= state.figures.limit
    }

    /// The background maker's step: one page toward the target; false (the maker stopped)
    /// once the target is met, the limit or the host's room reached, or the driver refuses.
    fn make_one_ahead(&self) -> bool {
        {
            let mut state = self.state.lock();
            if !self.ahead_lacks(&state) {
                state.maker = false;
                return false;
            }
            let since = state.outran_at.map(|at| at.elapsed());
            if let Some(since) = since.filter(|&since| since < DEMAND_QUIET) {
                drop(state);
                std::thread::sleep(DEMAND_QUIET - since);
                return true;
            }
            state.making += 1;
        }
        let page = self.make_page();
        let mut state = self.state.lock();
        state.making -= 1;
        match page {
            Ok(page) => {
                state.figures.made_ahead += page.size() as u64;
                state.keep_made(page);
                true
            }
            Err(_) => {
                // No room on the host (or the driver refused): spills make their own pages,
                // and refuse as they would without a maker.
                state.maker = false;
                false
            }
        }
    }

    /// One host page, once the host's room is checked.
    fn make_page(&self) -> Result<PhysicalMemory> {
        crate::os::host_pages::check_host_room(self.page_size, true)
            .and_then(|()| PhysicalMemory::new_on_host(self.ordinal, self.page_size))
    }

    /// Gives kept pages back to the OS until at most `keep` bytes stay kept; returns the bytes
    /// given back. The background maker's target falls to `keep`.
    pub fn give_back(&self, keep: usize) -> usize {
        let mut state = self.state.lock();
        state.ahead_target = state.ahead_target.min(keep);
        let mut given = 0;
        while state.figures.kept > keep {
            let Some(page) = state.free.pop() else { break };
            state.figures.kept -= page.size();
            given += page.size();
        }
        given
    }
}

impl HostPageSource for HostPageKeep {
    fn take(&self) -> Result<PhysicalMemory> {
        {
            let mut state = self.state.lock();
            if let Some(page) = state.free.pop() {
                state.figures.kept -= page.size();
                state.figures.spilled += page.size();
                state.figures.reused += page.size() as u64;
                return Ok(page);
            }
            state.outran_at = Some(std::time::Instant::now());
            if state.held(self.page_size) + self.page_size > state.figures.limit {
                return Err(Error::out_of_memory(
                    self.page_size,
                    format!(
                        "spill to host: the limit of {} bytes of host pages is reached",
                        state.figures.limit
                    ),
                ));
            }
            state.making += 1;
        }
        let page = self.make_page();
        let mut state = self.state.lock();
        state.making -= 1;
        if page.is_ok() {
            state.figures.spilled += self.page_size;
            state.figures.made += self.page_size as u64;
        }
        page
    }

    fn put(&self, memory: PhysicalMemory) {
        let mut state = self.state.lock();
        state.figures.spilled = state.figures.spilled.saturating_sub(memory.size());
        state.figures.kept += memory.size();
        state.free.push(memory);
    }
}

/// Which pages of a host virtual memory stand for device pages and which for spilled host
/// pages: the bookkeeping of a pretend device of `capacity` bytes (CPU tests of spilling and
/// promotion, with real bytes: a promotion gives the page to the OS and copies its bytes into a
/// fresh one).
#[derive(Debug)]
pub struct PretendDevice {
    capacity: usize,
    page_size: usize,
    /// Bytes of pages standing for device pages.
    on_device: usize,
    /// Addresses of the pages standing for spilled host pages.
    spilled: std::collections::BTreeSet<usize>,
    /// Whether unplaced device pages are lent to the next promotion (a real device's
    /// [`VirtualRange::lend_unmapped`](crate::cuda::vmm::VirtualRange::lend_unmapped)).
    lending: bool,
    /// Bytes of device pages unplaced while lending and not yet taken by a promotion (still
    /// counted in `on_device`: the device memory is held until taken or released).
    lent: usize,
    figures: SpillFigures,
}

impl PretendDevice {
    /// A device of `capacity` bytes that spills at most `limit` bytes, in pages of `page_size`.
    pub fn new(capacity: usize, limit: usize, page_size: usize) -> Self {
        PretendDevice {
            capacity,
            page_size,
            on_device: 0,
            spilled: std::collections::BTreeSet::new(),
            lending: false,
            lent: 0,
            figures: SpillFigures {
                limit,
                ..SpillFigures::default()
            },
        }
    }

    /// Free and total bytes of the pretend device.
    pub fn memory_info(&self) -> (usize, usize) {
        (self.capacity - self.on_device, self.capacity)
    }

    /// The figures now.
    pub fn figures(&self) -> SpillFigures {
        self.figures
    }

    /// Places the pages of `addr .. addr + bytes`: on the device while it has room, spilled
    /// for the rest; all or nothing.
    ///
    /// # Errors
    /// Out of memory when the spill's limit has no room for the rest.
    pub fn place(&mut self, addr: usize, bytes: usize) -> Result<()> {
        let pages = bytes / self.page_size;
        let device = ((self.capacity - self.on_device) / self.page_size).min(pages);
        let spill = (pages - device) * self.page_size;
        let f = &mut self.figures;
        let reused = spill.min(f.kept);
        if f.spilled + f.kept + (spill - reused) > f.limit {
            return Err(Error::out_of_memory(
                bytes,
                format!(
                    "pretend device: {} bytes free and the spill's limit of {} bytes reached",
                    self.capacity - self.on_device,
                    f.limit
                ),
            ));
        }
        f.kept -= reused;
        f.reused += reused as u64;
        f.made += (spill - reused) as u64;
        f.spilled += spill;
        self.on_device += device * self.page_size;
        for i in device..pages {
            self.spilled.insert(addr + i * self.page_size);
        }
        Ok(())
    }

    /// The background maker of a real device, at once: past the mark ([`spill_window`]), the
    /// kept pages rise to the window (within the limit).
    pub fn keep_ahead(&mut self) {
        let f = &mut self.figures;
        let Some(window) = spill_window(self.capacity - self.on_device, self.capacity, f.spilled)
        else {
            return;
        };
        let room = f.limit.saturating_sub(f.spilled + f.kept);
        let add = window.saturating_sub(f.kept).min(room) / self.page_size * self.page_size;
        f.kept += add;
        f.made += add as u64;
        f.made_ahead += add as u64;
    }

    /// The pages of `addr .. addr + bytes` are unmapped: spilled ones are kept for the next
    /// spill.
    pub fn unplace(&mut self, addr: usize, bytes: usize) {
        for page in (addr..addr + bytes).step_by(self.page_size) {
            if self.spilled.remove(&page) {
                self.figures.spilled -= self.page_size;
                self.figures.kept += self.page_size;
            } else if self.lending {
                self.lent += self.page_size;
            } else {
                self.on_device -= self.page_size;
            }
        }
    }

    /// While `on`, unplaced device pages are lent to the next promotion; turned off, the lent
    /// pages not taken are released.
    pub fn lend(&mut self, on: bool) {
        self.lending = on;
        if !on {
            self.on_device -= self.lent;
            self.lent = 0;
        }
    }

    /// The spilled pages of `addr .. addr + bytes` the device has room for (lent pages
    /// included), lowest first.
    pub fn promotable(&self, addr: usize, bytes: usize) -> Vec<usize> {
        let room = (self.capacity - self.on_device + self.lent) / self.page_size;
        self.spilled
            .range(addr..addr.saturating_add(bytes))
            .take(room)
            .copied()
            .collect()
    }

    /// The spilled page at `page` now stands for a device page.
    pub fn promoted(&mut self, page: usize) {
        if self.spilled.remove(&page) {
            if self.lent >= self.page_size {
                self.lent -= self.page_size;
                self.figures.promote_reused += self.page_size as u64;
            } else {
                self.on_device += self.page_size;
            }
            self.figures.spilled -= self.page_size;
            self.figures.kept += self.page_size;
            self.figures.promoted += self.page_size as u64;
        }
    }

    /// Runs of spilled pages: (address, bytes), lowest first.
    pub fn runs(&self) -> Vec<(usize, usize)> {
        crate::cuda::vmm::runs_of(self.spilled.iter().copied(), self.page_size)
    }

    /// Forgets kept pages until at most `keep` bytes stay kept; returns the bytes forgotten.
    pub fn give_back(&mut self, keep: usize) -> usize {
        let given = self.figures.kept.saturating_sub(keep) / self.page_size * self.page_size;
        self.figures.kept -= given;
        given
    }
}

summed_fields! {
    /// What a promotion did ([`Spiller::promote`](crate::resource::sleep::Spiller::promote)).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
    pub struct PromoteReport {
        /// Bytes moved from host pages to device memory at the same addresses.
        pub promoted: usize,
        /// Bytes of the pool's pages still on the host (the device had no room for them, or they
        /// lay outside the range asked for).
        pub spilled: usize,
        /// Free bytes unmapped first (free device pages make the room; free host pages are kept
        /// for the next spill).
        pub trimmed: usize,
        /// Seconds the promotion took, the synchronization included.
        pub seconds: f64,
        /// Seconds of it spent synchronizing the streams and unmapping the free pages (the rest:
        /// device memory made and mapped, the copies over the link, the remapping).
        pub trim_s: f64,
    }
}
