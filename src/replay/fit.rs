//! `--fit`: the smallest simulated device on which a log replays into a resource with no failed
//! allocation (for managed memory: with no byte beyond the device).

use super::engine::{replay, ReplayOptions};
use super::trace::{Action, Trace};
use super::{build, ResourceOptions};
use crate::error::Result;

/// The largest device the search tries (1 PiB).
const LARGEST_DEVICE: usize = 1 << 50;
/// The search stops once the bracket is this fine (or [`FIT_RELATIVE`] of the size, if finer).
pub const FIT_ABSOLUTE: usize = 64 << 20;
/// Relative precision of the search: 1% of the size found.
pub const FIT_RELATIVE: f64 = 0.01;

/// What [`fit`] found for one resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitResult {
    /// The resource's name.
    pub resource: String,
    /// The smallest device size found on which the log replays with no failed allocation;
    /// `None` when no device up to 1 PiB does (see `reason`).
    pub device_bytes: Option<usize>,
    /// The largest size tried on which the log failed (the search's lower bracket; 0 if none).
    pub failing_bytes: usize,
    /// The pool sizes (initial, maximum) the resource ran with on the device found.
    pub pool_sizes: Option<(usize, Option<usize>)>,
    /// The arena size the resource ran with on the device found, where it is an arena.
    pub arena_size: Option<usize>,
    /// The resource's setup on the device found.
    pub setup: String,
    /// Replays the search ran.
    pub replays: usize,
    /// Why the log fits on no device, where it does not.
    pub reason: Option<String>,
}

/// Outcome of one try: fits (with setup, pool sizes and arena size) or not.
type Try = Option<(String, Option<(usize, Option<usize>)>, Option<usize>)>;

/// Whether `trace` replays into `name` on a simulated device of `size` bytes with no failed
/// allocation. A resource that cannot even be built there does not fit: for want of memory, or
/// (`builds_larger`: it was built on the largest device with these options) for any other
/// reason, which is then the size (a device smaller than one page of an expandable pool or one
/// superblock of an arena). Issue 29: the search's halving reached such sizes for small logs,
/// and the error ended the search as "fits on no device".
fn try_size(
    trace: &Trace,
    name: &str,
    size: usize,
    options: &ResourceOptions,
    builds_larger: bool,
) -> Result<Try> {
    let built = match build(name, Some(size), options) {
        Ok(b) => b,
        Err(e) if e.is_out_of_memory() || builds_larger => return Ok(None),
        Err(e) => return Err(e),
    };
    let options = ReplayOptions {
        device: built.managed_device(),
        ..ReplayOptions::default()
    };
    let report = replay(trace, &built.resource, options)?;
    // Managed memory never fails for want of device memory; it fits where nothing spills past
    // the device. Tiers (device, peer GPU, host) fit where nothing reaches the last tier, host
    // memory: the device and a peer GPU of its size hold the log.
    let spilled = report.peak_beyond_device.unwrap_or(0) > 0
        || report
            .tiers
            .as_ref()
            .and_then(|t| t.last())
            .is_some_and(|host| host.peak_bytes > 0);
    Ok((report.failed_allocations == 0 && !spilled).then_some((
        built.setup,
        built.pool_sizes,
        built.arena_size,
    )))
}

/// The smallest simulated device on which `trace` replays into resource `name` (set up by
/// `options`) with no failed allocation (managed memory: with no byte beyond the device; it
/// never fails for want of device memory): [`search_smallest`] from the log's peak, to 1% of
/// the size or 64 MiB, whichever is finer (256-byte steps at least). The size returned is one
/// the log was replayed on without failure, and no smaller size of the search's grid was.
///
/// # Errors
/// The resource's errors other than out of memory (bad options, a broken log).
///
/// # Time Complexity
/// O(log(size / precision)) replays.
pub fn fit(trace: &Trace, name: &str, options: &ResourceOptions) -> Result<FitResult> {
    fit_with_progress(trace, name, options, &mut |_| {})
}

/// One size the search of [`fit_with_progress`] tried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FitTry {
    /// Sizes tried so far, this one included.
    pub tries: usize,
    /// The simulated device's size, bytes.
    pub device_bytes: usize,
    /// Whether the log replayed on it without failure.
    pub fits: bool,
}

/// [`fit`], calling `progress` after every size the search tried (a long fit's replays, for a
/// progress bar).
///
/// # Errors
/// As [`fit`].
pub fn fit_with_progress(
    trace: &Trace,
    name: &str,
    options: &ResourceOptions,
    progress: &mut dyn FnMut(FitTry),
) -> Result<FitResult> {
    let mut result = FitResult {
        resource: name.to_string(),
        device_bytes: None,
        failing_bytes: 0,
        pool_sizes: None,
        arena_size: None,
        setup: String::new(),
        replays: 0,
        reason: None,
    };
    // A resource that cannot serve some requests by design fits nowhere (asked of one built on
    // the largest device, where it surely can be built).
    let probe = build(name, Some(LARGEST_DEVICE), options);
    if let Ok(built) = &probe {
        if let Some(largest) = built.largest_request {
            let above = trace
                .events
                .iter()
                .filter(|e| e.action == Action::Allocate && e.size > largest)
                .count();
            if above > 0 {
                result.setup = built.setup.clone();
                result.reason = Some(format!(
                    "{above} request(s) above its largest block ({largest} bytes) cannot be \
                     served on any device"
                ));
                return Ok(result);
            }
        }
    }
    let builds_larger = probe.is_ok();
    let peak = usize::try_from(trace.peak_requested_bytes).unwrap_or(usize::MAX);
    let mut tries = 0;
    let search = search_smallest(peak, LARGEST_DEVICE, |size| {
        let outcome = try_size(trace, name, size, options, builds_larger);
        tries += 1;
        if let Ok(found) = &outcome {
            progress(FitTry {
                tries,
                device_bytes: size,
                fits: found.is_some(),
            });
        }
        outcome
    })?;
    result.replays = search.tries;
    result.failing_bytes = search.failing;
    match (search.smallest, search.found) {
        (Some(size), Some((setup, pool_sizes, arena_size))) => {
            result.device_bytes = Some(size);
            result.setup = setup;
            result.pool_sizes = pool_sizes;
            result.arena_size = arena_size;
        }
        _ => {
            result.reason = Some(format!(
                "failed allocations even on a device of {LARGEST_DEVICE} bytes"
            ));
        }
    }
    Ok(result)
}

/// What [`search_smallest`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Search<T> {
    /// The smallest size that worked (to the tolerance); `None` when not even `cap` did.
    pub smallest: Option<usize>,
    /// The largest size that failed (0 when the first try worked).
    pub failing: usize,
    /// Sizes tried.
    pub tries: usize,
    /// What the try at `smallest` gave.
    pub found: Option<T>,
}

impl<T> Search<T> {
    /// `smallest` worked, giving `found`; `failing` is the largest size tried that failed.
    fn worked(smallest: usize, failing: usize, tries: usize, found: T) -> Self {
        Search {
            smallest: Some(smallest),
            failing,
            tries,
            found: Some(found),
        }
    }

    /// Not even the cap worked (`failing`).
    fn nothing(failing: usize, tries: usize) -> Self {
        Search {
            smallest: None,
            failing,
            tries,
            found: None,
        }
    }
}

/// Most sizes the upward scan of [`search_smallest`] tries before it falls back to doubling and
/// halving: 1% steps cover up to about 1.9 times the peak (where pools, arenas and expandable
/// pools land), so a log that needs far more (bins preallocated, large pages) costs a few dozen
/// replays more than a bisection, not hundreds.
pub const SCAN_TRIES: usize = 64;

/// The search's tolerance at `size`: 1% of it, at least 256 bytes, at most [`FIT_ABSOLUTE`].
fn tolerance(size: usize) -> usize {
    ((size as f64 * FIT_RELATIVE) as usize).clamp(256, FIT_ABSOLUTE)
}

/// [`search_smallest`] when its first size, `size` (the log's peak), worked with `ok`: one try a
/// tolerance below gives the bracket (no smaller size can hold the peak, so it fails); a limit
/// that works there too (one not bound by the peak) is searched below by halving.
fn below_first<T>(
    size: usize,
    ok: T,
    mut try_at: impl FnMut(usize) -> Result<Option<T>>,
) -> Result<Search<T>> {
    let (mut lo, mut hi, mut found, mut tries) = (0usize, size, ok, 1);
    // Rounded up to 256 bytes: within the tolerance of `size`, and below it (the tolerance is
    // 256 bytes at least and `size` a multiple of 256).
    let below = size
        .saturating_sub(tolerance(size))
        .next_multiple_of(256)
        .min(size.saturating_sub(256));
    if below > 0 {
        tries += 1;
        match try_at(below)? {
            None => lo = below,
            Some(ok) => {
                hi = below;
                found = ok;
            }
        }
    }
    // Worked below the peak too: halve the bracket [lo, hi] (hi is `below` then).
    if hi < size {
        return halve_bracket(lo, hi, found, tries, try_at);
    }
    Ok(Search::worked(hi, lo, tries, found))
}

/// Halves the bracket `[lo, hi]` (`lo` fails or is 0, `hi` works with `found`) down to the
/// tolerance; the smallest working size found and the failing one below it.
fn halve_bracket<T>(
    mut lo: usize,
    mut hi: usize,
    mut found: T,
    mut tries: usize,
    mut try_at: impl FnMut(usize) -> Result<Option<T>>,
) -> Result<Search<T>> {
    loop {
        let mid = (lo + (hi - lo) / 2) & !255;
        if hi - lo <= tolerance(hi) || mid <= lo || mid >= hi {
            break;
        }
        tries += 1;
        match try_at(mid)? {
            Some(ok) => {
                hi = mid;
                found = ok;
            }
            None => lo = mid,
        }
    }
    Ok(Search::worked(hi, lo, tries, found))
}

/// The smallest size, at most `cap`, at which `try_at` gives `Some`, to the tolerance (1% of
/// the size or 64 MiB, whichever is finer; 256-byte steps): a scan up from `peak` (no smaller
/// size can hold the log's bytes in use) in steps of the tolerance, so the size found is the
/// first clean one of that grid, also for a resource that is not monotone in the device size
/// (a pool whose initial chunk is half the device fits some sizes and not a larger one; a
/// search that halved a bracket could land above a size that fits, which `--fit` then
/// contradicted: issue 29). After `SCAN_TRIES` sizes without one (a log that needs more
/// than about twice its peak) it doubles until one works and halves the bracket, as a search
/// of a monotone resource may. The one search of `--fit`: the simulated devices of [`fit`] and
/// the memory limits of the rows `rrmm replay` drives from Python.
///
/// # Errors
/// The first error of `try_at`.
pub fn search_smallest<T>(
    peak: usize,
    cap: usize,
    mut try_at: impl FnMut(usize) -> Result<Option<T>>,
) -> Result<Search<T>> {
    let mut size = crate::resource::align_up(peak.max(1), 256)
        .unwrap_or(cap)
        .min(cap);
    let mut lo = 0usize;
    let mut tries = 0;
    // The scan up the grid.
    while tries < SCAN_TRIES {
        tries += 1;
        if let Some(ok) = try_at(size)? {
            if tries == 1 {
                // The peak itself: a bracket below it (one more try) before it is the answer.
                return below_first(size, ok, try_at);
            }
            return Ok(Search::worked(size, lo, tries, ok));
        }
        lo = size;
        if size >= cap {
            return Ok(Search::nothing(lo, tries));
        }
        size = (size.saturating_add(tolerance(size)) & !255).min(cap);
    }
    // Many times the peak: doubling, then halving the bracket.
    let mut hi = size;
    let found = loop {
        tries += 1;
        if let Some(ok) = try_at(hi)? {
            break ok;
        }
        lo = hi;
        if hi >= cap {
            return Ok(Search::nothing(lo, tries));
        }
        hi = hi.saturating_mul(2).min(cap);
    };
    halve_bracket(lo, hi, found, tries, try_at)
}

#[cfg(test)]
mod search_tests {
    use super::*;

    #[test]
    fn the_search_brackets_the_smallest_size_to_the_tolerance() {
        let need = 3_000_000_000usize;
        let s = search_smallest(10, 80 << 30, |size| Ok((size >= need).then_some(size))).unwrap();
        let smallest = s.smallest.unwrap();
        assert!(smallest >= need && smallest - s.failing <= smallest / 100);
        assert_eq!(s.found, Some(smallest));
        let none = search_smallest(1 << 20, 64 << 20, |_| Ok(None::<()>)).unwrap();
        assert_eq!((none.smallest, none.failing), (None, 64 << 20));
    }

    /// A resource that fits on some sizes and not on a larger one (issue 29: a pool fitted on
    /// 5.4 MB, the search said 8.1 MB): the scan finds the first clean size of its grid.
    #[test]
    fn the_search_finds_the_smallest_size_of_a_resource_that_is_not_monotone() {
        let fits = |size: usize| (5_000_000..5_500_000).contains(&size) || size >= 8_000_000;
        let s = search_smallest(4_000_000, 1 << 40, |size| Ok(fits(size).then_some(()))).unwrap();
        let smallest = s.smallest.unwrap();
        assert!(fits(smallest) && !fits(s.failing));
        assert!(
            (5_000_000..5_000_000 + tolerance(5_000_000)).contains(&smallest),
            "{s:?}"
        );
    }

    #[test]
    fn a_fit_at_the_peak_gets_a_bracket_below_it() {
        let peak = 500 << 20;
        let s = search_smallest(peak, 1 << 40, |size| Ok((size >= peak).then_some(()))).unwrap();
        assert_eq!(
            (s.smallest, s.failing, s.tries),
            (Some(peak), peak - (5 << 20), 2)
        );
        // A limit not bound by the peak is searched below it.
        let s =
            search_smallest(peak, 1 << 40, |size| Ok((size >= 100 << 20).then_some(()))).unwrap();
        let smallest = s.smallest.unwrap();
        assert!(
            smallest >= 100 << 20 && smallest - s.failing <= tolerance(smallest),
            "{s:?}"
        );
    }
}
