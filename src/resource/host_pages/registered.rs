//! One supply of host pages for the whole process.
//!
//! Three paths wait on a fresh host making pages: a sleep's host copy, a pinned host pool's
//! ranges, a host tier. Each used to make its own, every time (a sleep of 40 GiB made and
//! registered 40 GiB of pinned pages on every sleep, then gave them back: a quarter of the
//! link's speed). The supply makes ranges once (reserved, committed with huge pages on the
//! GPU's NUMA node, faulted in by several threads: [`PinnedPages`]; registered with the driver
//! for pinned ranges), hands them out as [`HostPages`], and takes them back when those are
//! dropped, kept ready for the next user, so a second sleep copies at the link's speed into
//! pages made before. Ranges can be made ahead of need, in the background
//! ([`HostPageSupply::prepare`]): a `take` that finds one being made waits for it instead of
//! making a second.
//!
//! A user whose need grows (a sleep's copy grows with its pool) takes pages over several ranges
//! ([`HostPageSupply::take_spanning`]) and has them made ahead by what it lacks
//! ([`HostPageSupply::prepare_total`]): a pool that grows adds a range for its growth instead
//! of remaking one range of its whole size.
//!
//! Bounds: every range is checked against the host's room before anything is touched (the
//! cgroup-aware check of `os::host_pages`); what is kept free between uses is bounded by
//! [`HostPageSupply::set_keep_limit`] (by default one copy's worth: the most bytes handed out
//! at once so far, or asked to be kept ready for a sleep, which the next sleep takes again) and
//! given back on request ([`HostPageSupply::give_back`]). A free range serves a take of at least
//! half its size, so a small take never holds a large range.

use crate::error::{Error, Result};
use crate::os::host_pages::{check_host_room, Commit, Reservation, HUGE_PAGE, SMALL_PAGE};
use crate::resource::pinned_pages::PinnedPages;
use parking_lot::{Condvar, Mutex};

/// What a range's pages are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum PageKind {
    /// Registered with the driver (page-locked, `cuMemHostRegister`): a device copies them at
    /// the link's speed. Needs the driver.
    Pinned,
    /// Ordinary pages, committed and faulted in (a host-memory pool's copies are `memcpy`s).
    Plain,
}

/// What to make a range of: its kind and NUMA node, and the device whose context registers a
/// pinned one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageSpec {
    /// The pages' kind.
    pub kind: PageKind,
    /// The NUMA node to place them on (a preference); `None`: the process's policy.
    pub numa_node: Option<u32>,
    /// The device whose context registers pinned pages (any works: the registration is
    /// portable); `None` for plain pages.
    pub device: Option<usize>,
}

impl PageSpec {
    /// Pinned pages near `device` (on the NUMA node the driver reports for it).
    pub fn pinned_for(device: usize) -> Self {
        PageSpec {
            kind: PageKind::Pinned,
            numa_node: crate::cuda::host_numa_node(device),
            device: Some(device),
        }
    }

    /// Plain pages, on the process's policy.
    pub fn plain() -> Self {
        PageSpec {
            kind: PageKind::Plain,
            numa_node: None,
            device: None,
        }
    }

    /// Whether a range made for `self` serves `other` (same kind and node).
    fn serves(&self, other: &PageSpec) -> bool {
        self.kind == other.kind && self.numa_node == other.numa_node
    }
}

/// Plain pages: a reservation committed and faulted in.
#[derive(Debug)]
struct PlainPages {
    reservation: Reservation,
    bytes: usize,
}

/// One range of the supply.
#[derive(Debug)]
enum Pages {
    Pinned(PinnedPages),
    Plain(PlainPages),
}

/// A range and what it was made for.
#[derive(Debug)]
struct Range {
    spec: PageSpec,
    pages: Pages,
}

impl Range {
    /// Makes a range of `bytes` (at least one byte) for `spec`.
    fn make(spec: PageSpec, bytes: usize) -> Result<Range> {
        let pages = match spec.kind {
            PageKind::Pinned => {
                let _ctx = match spec.device {
                    Some(device) => Some(crate::cuda::ContextGuard::new(device)?),
                    None => None,
                };
                Pages::Pinned(PinnedPages::new(bytes, spec.numa_node)?)
            }
            PageKind::Plain => {
                let committed = if bytes >= HUGE_PAGE {
                    bytes.checked_next_multiple_of(HUGE_PAGE)
                } else {
                    bytes.checked_next_multiple_of(SMALL_PAGE)
                }
                .ok_or_else(|| {
                    Error::out_of_memory(bytes, "host pages: larger than the address space")
                })?;
                check_host_room(committed, true)?;
                let reservation = Reservation::new(committed)?;
                let how = Commit {
                    numa_node: spec.numa_node,
                    populate: true,
                };
                reservation.commit(0, committed, how)?;
                Pages::Plain(PlainPages { reservation, bytes })
            }
        };
        Ok(Range { spec, pages })
    }

    fn addr(&self) -> usize {
        match &self.pages {
            Pages::Pinned(p) => p.addr(),
            Pages::Plain(p) => p.reservation.base(),
        }
    }

    /// Bytes it holds for its users.
    fn bytes(&self) -> usize {
        match &self.pages {
            Pages::Pinned(p) => p.bytes(),
            Pages::Plain(p) => p.bytes,
        }
    }
}

/// What the supply has done, and what it holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SupplyFigures {
    /// Bytes of ranges kept free, ready for the next user.
    pub free_bytes: usize,
    /// Ranges kept free.
    pub free_ranges: usize,
    /// Bytes of ranges handed out now.
    pub leased_bytes: usize,
    /// Bytes of ranges being made in the background.
    pub preparing_bytes: usize,
    /// Ranges made, ever.
    pub made_ranges: u64,
    /// Bytes of the ranges made, ever.
    pub made_bytes: u64,
    /// Takes served from a range made before (ready pages), ever.
    pub reused: u64,
    /// Takes that had to make their range, ever.
    pub made_on_take: u64,
    /// Bytes given back to the OS, ever.
    pub given_back_bytes: u64,
    /// The most bytes kept free between uses (`None`: the default, the largest range handed
    /// out so far).
    pub keep_limit: Option<usize>,
    /// The most bytes handed out at once so far (one range, or one take over several).
    pub largest_leased: usize,
    /// The most bytes asked to be kept ready at once ([`HostPageSupply::prepare_total`]: a
    /// sleep's pages made ahead). What is kept free by default is the larger of the two.
    pub ready_target: usize,
}

#[derive(Debug, Default)]
struct State {
    free: Vec<Range>,
    /// Ranges being made in the background: (spec, bytes).
    preparing: Vec<(PageSpec, usize)>,
    figures: SupplyFigures,
}

impl State {
    /// The index of the smallest free range for `spec` that holds `bytes`.
    fn best_fit(&self, spec: &PageSpec, bytes: usize) -> Option<usize> {
        self.free
            .iter()
            .enumerate()
            .filter(|(_, r)| r.spec.serves(spec) && r.bytes() >= bytes && r.bytes() / 2 <= bytes)
            .min_by_key(|(_, r)| r.bytes())
            .map(|(i, _)| i)
    }

    /// Bytes of the ranges of `spec` being made.
    fn preparing_for(&self, spec: &PageSpec) -> usize {
        self.preparing
            .iter()
            .filter(|(s, _)| s.serves(spec))
            .map(|(_, b)| b)
            .sum()
    }

    fn is_preparing(&self, spec: &PageSpec, bytes: usize) -> bool {
        self.preparing
            .iter()
            .any(|(s, b)| s.serves(spec) && *b >= bytes && *b / 2 <= bytes)
    }

    /// Bytes of the free ranges that serve `spec`.
    fn free_for(&self, spec: &PageSpec) -> usize {
        self.free
            .iter()
            .filter(|r| r.spec.serves(spec))
            .map(Range::bytes)
            .sum()
    }

    /// Bytes of the free and preparing ranges that serve `spec`.
    fn held_for(&self, spec: &PageSpec) -> usize {
        self.free_for(spec) + self.preparing_for(spec)
    }

    /// What is kept free between uses: the keep limit, else one copy's worth.
    fn keep(&self) -> usize {
        let f = &self.figures;
        f.keep_limit.unwrap_or(f.largest_leased.max(f.ready_target))
    }

    fn recount_free(&mut self) {
        self.figures.free_bytes = self.free.iter().map(Range::bytes).sum();
        self.figures.free_ranges = self.free.len();
        self.figures.preparing_bytes = self.preparing.iter().map(|(_, b)| b).sum();
    }

    /// Takes free ranges out so that at most `keep` bytes stay free: the largest ranges that
    /// fit in `keep` stay (a sleep's copy is worth more than the ranges of small allocations),
    /// the others go.
    fn over(&mut self, keep: usize) -> Vec<Range> {
        let mut ranges = std::mem::take(&mut self.free);
        ranges.sort_by_key(|r| std::cmp::Reverse(r.bytes()));
        let mut kept = 0usize;
        let (stay, out): (Vec<Range>, Vec<Range>) = ranges.into_iter().partition(|r| {
            let fits = kept + r.bytes() <= keep;
            if fits {
                kept += r.bytes();
            }
            fits
        });
        self.free = stay;
        let given: usize = out.iter().map(Range::bytes).sum();
        self.figures.given_back_bytes += given as u64;
        self.recount_free();
        out
    }
}

/// The process's supply of host pages (see the module docs); [`supply`] is the one instance.
#[derive(Debug, Default)]
pub struct HostPageSupply {
    state: Mutex<State>,
    /// Signalled when a background range is ready (or failed).
    prepared: Condvar,
}

/// The supply of the process.
// Why process-wide: host pages are the host's, and one process makes and registers them once
// for all its users (sleeps, pinned pools, host tiers).
static SUPPLY: HostPageSupply = HostPageSupply {
    state: Mutex::new(State {
        free: Vec::new(),
        preparing: Vec::new(),
        figures: SupplyFigures {
            free_bytes: 0,
            free_ranges: 0,
            leased_bytes: 0,
            preparing_bytes: 0,
            made_ranges: 0,
            made_bytes: 0,
            reused: 0,
            made_on_take: 0,
            given_back_bytes: 0,
            keep_limit: None,
            largest_leased: 0,
            ready_target: 0,
        },
    }),
    prepared: Condvar::new(),
};

/// The supply of the process.
pub fn supply() -> &'static HostPageSupply {
    &SUPPLY
}

impl HostPageSupply {
    /// Host pages of at least `bytes` for `spec`: a free range ready (the smallest that holds
    /// them), else the one being made in the background for them (waited for), else a range
    /// made now. They come back to the supply when the [`HostPages`] is dropped.
    ///
    /// # Errors
    /// Out of memory when the host has no room for a new range (checked before any page is
    /// touched); the driver's errors of a pinned range.
    pub fn take(&'static self, spec: PageSpec, bytes: usize) -> Result<HostPages> {
        let bytes = bytes.max(1);
        {
            let mut state = self.state.lock();
            loop {
                if let Some(i) = state.best_fit(&spec, bytes) {
                    let range = state.free.swap_remove(i);
                    state.figures.reused += 1;
                    state.figures.leased_bytes += range.bytes();
                    state.figures.largest_leased = state.figures.largest_leased.max(range.bytes());
                    state.recount_free();
                    return Ok(HostPages::lease(self, range, true));
                }
                if !state.is_preparing(&spec, bytes) {
                    break;
                }
                self.prepared.wait(&mut state);
            }
        }
        self.make_for_take(spec, bytes)
    }

    /// A range of `bytes` for `spec` made now for a take, counted and handed out.
    fn make_for_take(&'static self, spec: PageSpec, bytes: usize) -> Result<HostPages> {
        let range = Range::make(spec, bytes)?;
        let mut state = self.state.lock();
        state.figures.made_ranges += 1;
        state.figures.made_bytes += range.bytes() as u64;
        state.figures.made_on_take += 1;
        state.figures.leased_bytes += range.bytes();
        state.figures.largest_leased = state.figures.largest_leased.max(range.bytes());
        Ok(HostPages::lease(self, range, false))
    }

    /// Host pages of at least `bytes` for `spec` over as few ranges as serve, for a user whose
    /// need grows (a sleep's copy grows with its pool): one free range as [`take`](Self::take)
    /// finds it, else the free ranges of `spec`, largest first, until they hold `bytes`, with
    /// one range made for what they lack. Ranges of `spec` being made in the background are
    /// waited for first (they were asked for this). The pages are ready
    /// ([`HostPages::was_ready`]) when no range had to be made.
    ///
    /// # Errors
    /// As [`take`](Self::take); the ranges taken go back to the supply.
    pub fn take_spanning(&'static self, spec: PageSpec, bytes: usize) -> Result<Vec<HostPages>> {
        let bytes = bytes.max(1);
        let mut state = self.state.lock();
        loop {
            let waiting = state.preparing_for(&spec) > 0;
            if state.best_fit(&spec, bytes).is_some() || state.free_for(&spec) >= bytes || !waiting
            {
                break;
            }
            self.prepared.wait(&mut state);
        }
        if state.best_fit(&spec, bytes).is_some() {
            drop(state);
            // Served by one range (taken again under the lock: another thread may have it).
            return self.take(spec, bytes).map(|p| vec![p]);
        }
        let mut mine: Vec<usize> = (0..state.free.len())
            .filter(|&i| state.free[i].spec.serves(&spec))
            .collect();
        mine.sort_by_key(|&i| std::cmp::Reverse(state.free[i].bytes()));
        let mut chosen = Vec::new();
        let mut held = 0usize;
        for i in mine {
            if held >= bytes {
                break;
            }
            held += state.free[i].bytes();
            chosen.push(i);
        }
        chosen.sort_unstable_by(|a, b| b.cmp(a));
        let lacking = bytes.saturating_sub(held);
        let mut pages: Vec<HostPages> = chosen
            .into_iter()
            .map(|i| {
                let range = state.free.swap_remove(i);
                state.figures.leased_bytes += range.bytes();
                HostPages::lease(self, range, true)
            })
            .collect();
        if lacking == 0 {
            state.figures.reused += 1;
        }
        state.recount_free();
        drop(state);
        if lacking > 0 {
            pages.push(self.make_for_take(spec, lacking)?);
        }
        let total: usize = pages.iter().map(HostPages::len).sum();
        let mut state = self.state.lock();
        state.figures.largest_leased = state.figures.largest_leased.max(total);
        Ok(pages)
    }

    /// Makes ranges of `spec` ready ahead of need, in the background, so that the free and
    /// preparing ranges of `spec` hold `total` bytes: one range for what they lack (none when
    /// they hold enough), for a user that takes them over several ranges
    /// ([`take_spanning`](Self::take_spanning)). `total` also counts as one copy's worth, kept
    /// free between uses by default. Returns the bytes of the range asked for (0: none).
    pub fn prepare_total(&'static self, spec: PageSpec, total: usize) -> usize {
        let lacking = {
            let mut state = self.state.lock();
            state.figures.ready_target = state.figures.ready_target.max(total);
            total.saturating_sub(state.held_for(&spec))
        };
        if lacking > 0 {
            self.prepare_range(spec, lacking);
        }
        lacking
    }

    /// Makes a range of `bytes` for `spec` ready ahead of need, on a thread of its own (the
    /// caller does not wait; [`wait_prepared`](Self::wait_prepared) does). Nothing is made
    /// when a free or preparing range already holds `bytes`. A failure (no room) is recorded
    /// nowhere but leaves nothing behind: the take that needs the pages makes them then, and
    /// reports its own error.
    pub fn prepare(&'static self, spec: PageSpec, bytes: usize) {
        let bytes = bytes.max(1);
        {
            let state = self.state.lock();
            if state.best_fit(&spec, bytes).is_some() || state.is_preparing(&spec, bytes) {
                return;
            }
        }
        self.prepare_range(spec, bytes);
    }

    /// Makes one range of `bytes` for `spec` on a thread of its own (see
    /// [`prepare`](Self::prepare)).
    fn prepare_range(&'static self, spec: PageSpec, bytes: usize) {
        {
            let mut state = self.state.lock();
            state.preparing.push((spec, bytes));
            state.recount_free();
        }
        let spawned = std::thread::Builder::new()
            .name("rrmm-host-pages".into())
            .spawn(move || self.finish_prepare(spec, bytes));
        if spawned.is_err() {
            self.finish_prepare(spec, bytes);
        }
    }

    /// Makes the range [`prepare`](Self::prepare) asked for and puts it with the free ranges.
    fn finish_prepare(&self, spec: PageSpec, bytes: usize) {
        let made = Range::make(spec, bytes);
        let mut state = self.state.lock();
        if let Some(i) = state
            .preparing
            .iter()
            .position(|(s, b)| *s == spec && *b == bytes)
        {
            state.preparing.swap_remove(i);
        }
        if let Ok(range) = made {
            state.figures.made_ranges += 1;
            state.figures.made_bytes += range.bytes() as u64;
            state.free.push(range);
        }
        state.recount_free();
        drop(state);
        self.prepared.notify_all();
    }

    /// Waits until no range is being made in the background.
    pub fn wait_prepared(&self) {
        let mut state = self.state.lock();
        while !state.preparing.is_empty() {
            self.prepared.wait(&mut state);
        }
    }

    /// Takes `range` back from a user: kept free for the next one within the keep limit,
    /// else given back to the OS.
    fn put_back(&self, range: Range) {
        let mut state = self.state.lock();
        state.figures.leased_bytes = state.figures.leased_bytes.saturating_sub(range.bytes());
        state.free.push(range);
        state.recount_free();
        let keep = state.keep();
        let over = state.over(keep);
        drop(state);
        // Unregistered and unmapped outside the lock.
        drop(over);
    }

    /// Gives free ranges back to the OS until at most `keep` bytes stay free (the largest
    /// ranges that fit in `keep` stay); returns the bytes given back. Ranges handed out are not touched.
    pub fn give_back(&self, keep: usize) -> usize {
        let over = self.state.lock().over(keep);
        let given = over.iter().map(Range::bytes).sum();
        drop(over);
        given
    }

    /// Bounds the bytes kept free between uses (`None`: the default, as many as the largest
    /// range handed out so far), giving back what is over it now.
    pub fn set_keep_limit(&self, keep: Option<usize>) {
        let over = {
            let mut state = self.state.lock();
            state.figures.keep_limit = keep;
            keep.map(|k| state.over(k)).unwrap_or_default()
        };
        drop(over);
    }

    /// What the supply has done and holds.
    pub fn figures(&self) -> SupplyFigures {
        self.state.lock().figures
    }
}

/// Host pages handed out by the supply: `len()` bytes from `addr()`, back to the supply when
/// dropped (or to the OS, after [`give_back_on_drop`](Self::give_back_on_drop)).
#[derive(Debug)]
pub struct HostPages {
    range: Option<Range>,
    supply: &'static HostPageSupply,
    ready: bool,
    keep: bool,
}

impl HostPages {
    fn lease(supply: &'static HostPageSupply, range: Range, ready: bool) -> Self {
        HostPages {
            range: Some(range),
            supply,
            ready,
            keep: true,
        }
    }

    /// The first address.
    pub fn addr(&self) -> usize {
        self.range.as_ref().map_or(0, Range::addr)
    }

    /// Bytes it holds (at least what was asked).
    pub fn len(&self) -> usize {
        self.range.as_ref().map_or(0, Range::bytes)
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the pages are registered with the driver.
    pub fn is_pinned(&self) -> bool {
        self.range
            .as_ref()
            .is_some_and(|r| r.spec.kind == PageKind::Pinned)
    }

    /// Whether the pages were ready when taken (made before: no page was made for this take).
    pub fn was_ready(&self) -> bool {
        self.ready
    }

    /// How a pinned range was made (the figures of the call that made it); `None` for plain
    /// pages.
    pub fn pinned_startup(&self) -> Option<&crate::resource::pinned_pages::PinnedStartup> {
        match &self.range.as_ref()?.pages {
            Pages::Pinned(p) => Some(p.startup()),
            Pages::Plain(_) => None,
        }
    }

    /// Makes the drop give the pages back to the OS instead of keeping them in the supply.
    pub fn give_back_on_drop(&mut self) {
        self.keep = false;
    }
}

impl Drop for HostPages {
    fn drop(&mut self) {
        let Some(range) = self.range.take() else {
            return;
        };
        if self.keep {
            self.supply.put_back(range);
        } else {
            let mut state = self.supply.state.lock();
            state.figures.leased_bytes = state.figures.leased_bytes.saturating_sub(range.bytes());
            state.figures.given_back_bytes += range.bytes() as u64;
            drop(state);
            drop(range);
        }
    }
}

#[cfg(test)]
mod tests;
