//! Replaying a compiled trace against a resource, with timing and memory figures.

use super::trace::{Action, Trace};
use crate::cuda::{OwnedStream, Stream};
use crate::error::{Error, Result};
use crate::resource::{Footprint, MemoryKind, SharedResource};
use crate::stack::BlockRounding;
use std::time::{Duration, Instant};

/// Events between progress checks (and between regular footprint samples at most).
const CHECK_EVERY: usize = 4096;
/// Regular footprint samples per replay (besides one at every new peak of bytes in use).
const SAMPLES: usize = 1024;
/// Replays shorter than this show no progress.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// How many timed repetitions follow the figures pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Repeat {
    /// None: the figures pass (clock stopped while sampling) is the one timing.
    #[default]
    FiguresOnly,
    /// Exactly this many timed repetitions after the figures pass (a warm-up).
    Times(usize),
    /// At least [`AUTO_MIN_REPEATS`] repetitions and [`AUTO_MIN_TIME`] of them, at most
    /// [`AUTO_MAX_REPEATS`].
    Auto,
}

/// [`Repeat::Auto`]'s least number of timed repetitions.
pub const AUTO_MIN_REPEATS: usize = 5;
/// [`Repeat::Auto`]'s least time spent in timed repetitions.
pub const AUTO_MIN_TIME: Duration = Duration::from_millis(500);
/// [`Repeat::Auto`]'s most repetitions (short logs).
pub const AUTO_MAX_REPEATS: usize = 1000;

/// Whether another timed repetition runs after `done` of them, `elapsed` into the timed
/// repetitions: the one rule of [`Repeat`] (the rows `rrmm replay` drives from Python follow it
/// too).
pub fn more_repetitions(repeat: Repeat, done: usize, elapsed: Duration) -> bool {
    match repeat {
        Repeat::FiguresOnly => false,
        Repeat::Times(k) => done < k,
        Repeat::Auto => {
            done < AUTO_MAX_REPEATS && (done < AUTO_MIN_REPEATS || elapsed < AUTO_MIN_TIME)
        }
    }
}

/// The timing figures of a replay, from its repetitions' wall times (their field names are the
/// keys of a replay record's timings).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Timings {
    /// The median repetition, in nanoseconds (the mean of the middle two, rounded down).
    pub total_ns: u64,
    /// `total_ns / events`.
    pub ns_per_event: f64,
    /// The fastest repetition per event.
    pub ns_per_event_min: f64,
    /// The slowest repetition per event.
    pub ns_per_event_max: f64,
    /// The first quartile per event (nearest rank).
    pub ns_per_event_p25: f64,
    /// The third quartile per event (nearest rank).
    pub ns_per_event_p75: f64,
    /// Interquartile range / median (robust to one preempted repetition); `None` with fewer
    /// than two repetitions.
    pub spread: Option<f64>,
}

/// [`Timings`] of the repetitions' nanoseconds `samples` (at least one) over `events` events.
pub fn timings(samples: &[u64], events: usize) -> Timings {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    if sorted.is_empty() {
        sorted.push(0);
    }
    let mid = sorted.len() / 2;
    let median = if sorted.len() % 2 == 1 {
        sorted[mid]
    } else {
        let (a, b) = (sorted[mid - 1], sorted[mid]);
        a / 2 + b / 2 + (a % 2 + b % 2) / 2
    };
    let per_event = |ns: u64| {
        if events == 0 {
            0.0
        } else {
            ns as f64 / events as f64
        }
    };
    let (p25, p75) = (
        per_event(quantile(&sorted, 1, 4)),
        per_event(quantile(&sorted, 3, 4)),
    );
    let middle = per_event(median);
    let spread = if samples.len() < 2 {
        None
    } else if middle > 0.0 {
        Some((p75 - p25) / middle)
    } else {
        Some(0.0)
    };
    Timings {
        total_ns: median,
        ns_per_event: middle,
        ns_per_event_min: per_event(sorted[0]),
        ns_per_event_max: per_event(sorted[sorted.len() - 1]),
        ns_per_event_p25: p25,
        ns_per_event_p75: p75,
        spread,
    }
}

/// Options of [`replay`].
#[derive(Clone, Debug, Default)]
pub struct ReplayOptions {
    /// Points of the timeline to record for a plot (0: none).
    pub timeline_points: usize,
    /// Timed repetitions after the figures pass, on the same resource (warm against warm).
    pub repeat: Repeat,
    /// How the resource rounds requests into blocks (for internal waste; default 256 B).
    pub rounding: Option<BlockRounding>,
    /// The largest request the resource serves by design (requests above it are counted as
    /// [`ReplayReport::unservable_allocations`]).
    pub largest_request: Option<usize>,
    /// The simulated device under the resource, whose bytes beyond the device (managed memory's
    /// host tier) the report follows ([`ReplayReport::peak_beyond_device`]).
    pub device: Option<std::sync::Arc<crate::resource::SimulatedMemoryResource>>,
}

/// The host pages a replay's resource took from the process's supply during the figures pass
/// (pinned host memory, a host tier, a sleep's copy: [`crate::resource::host_pages::registered`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostPagesUsed {
    /// Bytes of ranges made for it.
    pub made_bytes: u64,
    /// Ranges made for it.
    pub made_ranges: u64,
    /// Takes served by pages made before (ready).
    pub reused_takes: u64,
    /// Bytes the supply held (handed out or kept free) after the last event.
    pub held_bytes_at_end: usize,
}

impl HostPagesUsed {
    /// What happened between `before` and `after` (the supply's figures), or `None` when the
    /// replay neither made nor took host pages.
    fn between(
        before: &crate::resource::host_pages::registered::SupplyFigures,
        after: &crate::resource::host_pages::registered::SupplyFigures,
    ) -> Option<HostPagesUsed> {
        let used = HostPagesUsed {
            made_bytes: after.made_bytes.saturating_sub(before.made_bytes),
            made_ranges: after.made_ranges.saturating_sub(before.made_ranges),
            reused_takes: after.reused.saturating_sub(before.reused),
            held_bytes_at_end: after.free_bytes + after.leased_bytes,
        };
        (used.made_ranges > 0 || used.reused_takes > 0).then_some(used)
    }
}

/// One point of a replay's timeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimelinePoint {
    /// Events replayed so far.
    pub event: usize,
    /// Sum of the requested sizes of the live allocations.
    pub bytes_in_use: u128,
    /// The resource's footprint (`held_bytes`), where it reports one.
    pub footprint: Option<usize>,
    /// Bytes beyond the simulated device (in its host tier), where the replay follows one.
    pub beyond_device: Option<usize>,
}

/// The figures of one replay. Byte sums are exact (`u128`).
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// The trace's source.
    pub source: String,
    /// The resource's name.
    pub resource: String,
    /// Events replayed (allocations and frees).
    pub events: usize,
    /// Allocate events.
    pub allocations: usize,
    /// The timings of the repetitions (of the figures pass, without its sampling, when there
    /// were none).
    pub timings: Timings,
    /// Wall time of every timed repetition, in order (the figures pass's alone when none).
    pub samples_ns: Vec<u64>,
    /// Timed repetitions (0: the figures pass was the timing).
    pub repeats: usize,
    /// The most bytes in use at once (sum of live requested sizes).
    pub peak_bytes_in_use: u128,
    /// The largest footprint sampled (`Footprint::held_bytes`: a pool's size), where reported.
    pub peak_footprint: Option<usize>,
    /// Overhead: `peak_footprint / peak_bytes_in_use`.
    pub overhead: Option<f64>,
    /// Internal waste when bytes in use peaked: bytes of the blocks holding the live
    /// allocations minus the bytes they requested (bin, block and page rounding).
    pub internal_waste_at_peak: u128,
    /// Internal waste after the last event.
    pub internal_waste_at_end: u128,
    /// External fragmentation (`1 - largest free block / free bytes`) when bytes in use peaked.
    pub fragmentation_at_peak: Option<f64>,
    /// External fragmentation after the last event (before leaks are freed).
    pub fragmentation_at_end: Option<f64>,
    /// The full footprint after the last event.
    pub footprint_at_end: Option<Footprint>,
    /// The most bytes beyond the simulated device at once (managed memory that would live in
    /// host memory), where the replay follows a device with a host tier.
    pub peak_beyond_device: Option<usize>,
    /// The counts of each tier over the figures pass (peaks, totals, allocations each tier
    /// passed on), where the replay follows a tiered resource.
    pub tiers: Option<Vec<crate::adaptor::TierCounts>>,
    /// The host pages the resource took from the process's supply during the figures pass,
    /// where it took any (on a GPU: the pinned kinds, a host tier).
    pub host_pages: Option<HostPagesUsed>,
    /// Allocations that failed with out of memory.
    pub failed_allocations: usize,
    /// Bytes those failed allocations asked for.
    pub failed_bytes: u128,
    /// Event indices of the failed allocations.
    pub failure_events: Vec<usize>,
    /// Allocations above the largest request the resource serves by design (they fail).
    pub unservable_allocations: usize,
    /// Allocations still live after the last event (freed after the report).
    pub leaked_allocations: usize,
    /// Bytes of those allocations.
    pub leaked_bytes: u128,
    /// `allocate failure` rows of the log (not replayed).
    pub logged_failures: usize,
    /// Lines the lenient parse skipped.
    pub parse_warnings: usize,
    /// Sampled timeline (empty unless asked for).
    pub timeline: Vec<TimelinePoint>,
}

/// Progress of a running replay, given to the progress callback.
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    /// Events done.
    pub done: usize,
    /// Events in all.
    pub total: usize,
    /// Time since the replay (or, once the figures pass is done, the timed repetitions)
    /// started.
    pub elapsed: Duration,
    /// Timed repetitions done (0 during the figures pass).
    pub repetitions: usize,
}

/// The streams of a replay: log stream index -> handle; owns created CUDA streams.
struct Streams {
    handles: Vec<Stream>,
    owned: Vec<OwnedStream>,
}

fn map_streams(trace: &Trace, mr: &SharedResource) -> Result<Streams> {
    let real = matches!(
        mr.kind(),
        MemoryKind::Device | MemoryKind::Managed | MemoryKind::PinnedHost
    );
    let mut handles = Vec::with_capacity(trace.streams.len());
    let mut owned = Vec::new();
    for (i, &logged) in trace.streams.iter().enumerate() {
        let handle = match logged {
            0 => Stream::DEFAULT,
            1 => Stream::LEGACY,
            2 => Stream::PER_THREAD,
            _ if real => {
                let s = OwnedStream::new(true)?;
                let h = s.stream();
                owned.push(s);
                h
            }
            // SAFETY: `real` is false, so no resource in this replay passes the handle to the
            // driver: it is only a key.
            _ => unsafe { Stream::from_raw(0x1000 + i) },
        };
        handles.push(handle);
    }
    Ok(Streams { handles, owned })
}

/// Replays `trace` against `mr` in log order and reports time and memory figures; every
/// allocation the log leaves live is freed afterwards, so `mr` is left as it was.
///
/// The first pass measures the memory figures (sampling the footprint with the clock stopped)
/// and warms the resource up; then `options.repeat` timed repetitions run on the same resource
/// (warm against warm, as RMM's replay benchmark does) and give the timings.
///
/// Logged streams map to fake handles on simulated and host memory and to created streams on
/// device memory (stream 0 stays the default stream). Out of memory is counted, not fatal: the
/// matching free is skipped.
///
/// # Errors
/// Any error of the resource other than out of memory (after freeing what is live); creating
/// streams on a device.
///
/// # Time Complexity
/// O(events x (1 + repetitions)) calls to the resource.
pub fn replay(trace: &Trace, mr: &SharedResource, options: ReplayOptions) -> Result<ReplayReport> {
    replay_with_progress(trace, mr, options, &mut |_| {})
}

/// The memory figures of the figures pass.
#[derive(Default)]
struct Figures {
    peak: u128,
    peak_footprint: Option<usize>,
    fragmentation_at_peak: Option<f64>,
    waste_at_peak: u128,
    waste_at_end: u128,
    failure_events: Vec<usize>,
    failed_bytes: u128,
    unservable: usize,
    timeline: Vec<TimelinePoint>,
    end: Option<Footprint>,
    leaked_allocations: usize,
    leaked_bytes: u128,
    timed: Duration,
}

/// Frees what `slots` holds (the log's leaks); counts them.
fn free_live(
    mr: &SharedResource,
    streams: &Streams,
    slots: &mut [(usize, usize, u32)],
) -> (usize, u128, Option<Error>) {
    let (mut count, mut bytes, mut first_error) = (0, 0u128, None);
    for slot in slots.iter_mut() {
        let (ptr, size, stream) = *slot;
        if ptr != 0 {
            count += 1;
            bytes += size as u128;
            // SAFETY: the slot owns `ptr`, allocated from `mr` with `size` and not freed since;
            // it is freed once (the slot is cleared) and the replay does no work on the memory.
            if let Err(e) = unsafe { mr.deallocate(ptr, size, streams.handles[stream as usize]) } {
                first_error.get_or_insert(e);
            }
            *slot = (0, 0, 0);
        }
    }
    (count, bytes, first_error)
}

/// Waits for stream-ordered work (asynchronous frees) on device memory: part of the replay's
/// cost, as in RMM's replay benchmark.
fn synchronize_device(mr: &SharedResource) {
    if matches!(mr.kind(), MemoryKind::Device | MemoryKind::Managed) {
        if let Ok(_ctx) = crate::cuda::ContextGuard::new(mr.device().unwrap_or(0)) {
            let _ = crate::cuda::context_synchronize();
        }
    }
}

/// [`replay`] with a progress callback, called every few thousand events of the figures pass
/// once it has run for a second, once at its end if it was called before, and after each timed
/// repetition once they have run for a second. The engine prints nothing: whoever shows
/// progress (the command line's one bar) does it from the callback.
///
/// # Errors
/// As [`replay`].
pub fn replay_with_progress(
    trace: &Trace,
    mr: &SharedResource,
    options: ReplayOptions,
    progress: &mut dyn FnMut(Progress),
) -> Result<ReplayReport> {
    let streams = map_streams(trace, mr)?;
    let n = trace.events.len();
    let mut slots: Vec<(usize, usize, u32)> = vec![(0, 0, 0); trace.slot_count];
    let supply = crate::resource::host_pages::registered::supply();
    let supply_before = supply.figures();
    let figures = figures_pass(trace, mr, &options, &streams, &mut slots, progress);
    let host_pages = HostPagesUsed::between(&supply_before, &supply.figures());
    // The device's own peak covers every allocation of the figures pass (the repetitions reuse
    // the same memory pattern); read before the repetitions run.
    let beyond_device_peak = options.device.as_ref().map(|d| d.beyond_device_bytes().1);
    // The tiers of the memory below the resource, from its link (any stack with a tiered
    // resource in it).
    let tiers = mr.link().tiers.map(|t| t.tier_counts());
    let figures = match figures {
        Ok(f) => f,
        Err(e) => {
            free_live(mr, &streams, &mut slots);
            sync_streams(&streams);
            return Err(e);
        }
    };
    // Timed repetitions on the same, now warm, resource.
    let mut samples = Vec::new();
    let started = Instant::now();
    loop {
        if !more_repetitions(options.repeat, samples.len(), started.elapsed()) {
            break;
        }
        match timed_pass(trace, mr, &streams, &mut slots) {
            Ok(t) => samples.push(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX)),
            Err(e) => {
                free_live(mr, &streams, &mut slots);
                sync_streams(&streams);
                return Err(e);
            }
        }
        let (_, _, error) = free_live(mr, &streams, &mut slots);
        if let Some(e) = error {
            sync_streams(&streams);
            return Err(e);
        }
        if started.elapsed() >= PROGRESS_AFTER {
            progress(Progress {
                done: n,
                total: n,
                elapsed: started.elapsed(),
                repetitions: samples.len(),
            });
        }
    }
    sync_streams(&streams);
    let repeats = samples.len();
    if samples.is_empty() {
        samples.push(u64::try_from(figures.timed.as_nanos()).unwrap_or(u64::MAX));
    }
    let overhead = match (figures.peak_footprint, figures.peak) {
        (Some(f), p) if p > 0 => Some(f as f64 / p as f64),
        _ => None,
    };
    Ok(ReplayReport {
        source: trace.source.clone(),
        resource: mr.name().to_string(),
        events: n,
        allocations: trace.allocations(),
        timings: timings(&samples, n),
        samples_ns: samples,
        repeats,
        peak_bytes_in_use: figures.peak,
        peak_footprint: figures.peak_footprint,
        overhead,
        internal_waste_at_peak: figures.waste_at_peak,
        internal_waste_at_end: figures.waste_at_end,
        fragmentation_at_peak: figures.fragmentation_at_peak,
        fragmentation_at_end: figures.end.map(|f| f.fragmentation()),
        footprint_at_end: figures.end,
        peak_beyond_device: beyond_device_peak,
        tiers,
        host_pages,
        failed_allocations: figures.failure_events.len(),
        failed_bytes: figures.failed_bytes,
        failure_events: figures.failure_events,
        unservable_allocations: figures.unservable,
        leaked_allocations: figures.leaked_allocations,
        leaked_bytes: figures.leaked_bytes,
        logged_failures: trace.logged_failures,
        parse_warnings: trace.warnings,
        timeline: figures.timeline,
    })
}

/// For each event `i` of `trace`, the most bytes the log has in use after any later event
/// (every allocation succeeding; 0 after the last), saturating at `u64::MAX` (8 bytes an event).
fn later_in_use_max(trace: &Trace) -> Vec<u64> {
    let mut in_use = 0u64;
    let after: Vec<u64> = trace
        .events
        .iter()
        .map(|e| {
            match e.action {
                Action::Allocate => in_use = in_use.saturating_add(e.size as u64),
                Action::Free => in_use = in_use.saturating_sub(e.size as u64),
            }
            in_use
        })
        .collect();
    let mut out = vec![0u64; after.len()];
    let mut max = 0u64;
    for i in (0..after.len()).rev() {
        out[i] = max;
        max = max.max(after[i]);
    }
    out
}

/// The `num/den` quantile of sorted, non-empty `values`, by nearest rank.
fn quantile(values: &[u64], num: usize, den: usize) -> u64 {
    let last = values.len() - 1;
    values[((last * num) + den / 2) / den]
}

fn sync_streams(streams: &Streams) {
    for s in &streams.owned {
        let _ = s.synchronize();
    }
}

/// Frees the allocation in `slots[slot]` (a free event of `size` bytes on `stream`), if the
/// allocation succeeded; whether it freed.
#[inline]
fn free_slot(
    mr: &SharedResource,
    slots: &mut [(usize, usize, u32)],
    slot: usize,
    size: usize,
    stream: Stream,
) -> Result<bool> {
    let (ptr, _, _) = slots[slot];
    if ptr == 0 {
        return Ok(false);
    }
    // SAFETY: `ptr` was allocated from `mr` for this slot with `size` (the trace checks a free's
    // size against its allocation) and is freed once (the slot is cleared); the replay does no
    // work on the memory.
    unsafe { mr.deallocate(ptr, size, stream) }?;
    slots[slot] = (0, 0, 0);
    Ok(true)
}

/// One replay with nothing but the calls inside the clock; leaves the leaks in `slots`.
fn timed_pass(
    trace: &Trace,
    mr: &SharedResource,
    streams: &Streams,
    slots: &mut [(usize, usize, u32)],
) -> Result<Duration> {
    let started = Instant::now();
    for ev in &trace.events {
        let slot = ev.slot as usize;
        let stream = streams.handles[ev.stream as usize];
        match ev.action {
            Action::Allocate => match mr.allocate(ev.size, stream) {
                Ok(ptr) => slots[slot] = (ptr, ev.size, ev.stream),
                Err(e) if e.is_out_of_memory() => slots[slot] = (0, 0, 0),
                Err(e) => return Err(e),
            },
            Action::Free => {
                free_slot(mr, slots, slot, ev.size, stream)?;
            }
        }
    }
    synchronize_device(mr);
    Ok(started.elapsed())
}

/// The first pass: every memory figure, the timeline, the failures; the clock stops while the
/// footprint is sampled. Frees the leaks at the end.
fn figures_pass(
    trace: &Trace,
    mr: &SharedResource,
    options: &ReplayOptions,
    streams: &Streams,
    slots: &mut [(usize, usize, u32)],
    progress: &mut dyn FnMut(Progress),
) -> Result<Figures> {
    let n = trace.events.len();
    let rounding = options
        .rounding
        .clone()
        .unwrap_or(BlockRounding::Align(crate::resource::ALLOCATION_ALIGNMENT));
    let largest = options.largest_request.unwrap_or(usize::MAX);
    let measures_footprint = mr.report().map(|r| r.footprint()).is_some();
    let sample_stride = (n / SAMPLES).clamp(1, CHECK_EVERY);
    let timeline_stride = n
        .checked_div(options.timeline_points)
        .map_or(usize::MAX, |stride| stride.max(1));
    let mut f = Figures::default();
    // Bytes requested by the live allocations, and bytes of the blocks holding them.
    let mut in_use = 0u128;
    let mut blocks = 0u128;
    if options.timeline_points > 0 {
        f.timeline.push(TimelinePoint {
            event: 0,
            bytes_in_use: 0,
            footprint: mr.report().map(|r| r.footprint()).map(|f| f.held_bytes),
            beyond_device: options.device.as_ref().map(|d| d.beyond_device_bytes().0),
        });
    }
    // The most bytes the log has in use after each event (as logged, every allocation
    // succeeding): a new peak of the replay at event i is its last one when no later event
    // of the log has more in use (the replay's bytes in use never pass the log's).
    let later_max = later_in_use_max(trace);
    let mut last_full: Option<usize> = None;
    let mut progress_shown = false;
    let started = Instant::now();
    let mut segment = Instant::now();
    for (i, ev) in trace.events.iter().enumerate() {
        let slot = ev.slot as usize;
        let stream = streams.handles[ev.stream as usize];
        let mut new_peak = false;
        let mut grew = false;
        match ev.action {
            Action::Allocate => match mr.allocate(ev.size, stream) {
                Ok(ptr) => {
                    slots[slot] = (ptr, ev.size, ev.stream);
                    grew = true;
                    if ptr != 0 {
                        in_use += ev.size as u128;
                        blocks += rounding.block(ev.size) as u128;
                    }
                    if in_use > f.peak {
                        f.peak = in_use;
                        f.waste_at_peak = blocks.saturating_sub(in_use);
                        new_peak = true;
                    }
                }
                Err(e) if e.is_out_of_memory() => {
                    slots[slot] = (0, 0, 0);
                    f.failure_events.push(i);
                    f.failed_bytes += ev.size as u128;
                    if ev.size > largest {
                        f.unservable += 1;
                    }
                }
                Err(e) => return Err(e),
            },
            Action::Free => {
                if free_slot(mr, slots, slot, ev.size, stream)? {
                    in_use -= ev.size as u128;
                    blocks -= rounding.block(ev.size) as u128;
                }
            }
        }
        let done = i + 1;
        let regular = done % sample_stride == 0;
        let on_timeline = done % timeline_stride == 0 || (done == n && !f.timeline.is_empty());
        let check = done % CHECK_EVERY == 0;
        // The footprint can only grow on an allocation: sampling after each one makes the peak
        // footprint exact.
        if (measures_footprint && (grew || regular)) || on_timeline || check {
            // Stop the clock while sampling.
            f.timed += segment.elapsed();
            // The full footprint walks every stream's list that holds free memory (or every
            // arena): taken for the timeline, and at a new peak of bytes in use (for the
            // fragmentation there) only when it is the replay's last peak: no later event of
            // the log has more bytes in use. Every new peak before it would be replaced, and
            // taking the footprint at each made replay time quadratic in the streams holding
            // free blocks (issue 29). After a failed allocation the replay's bytes in use may
            // stay below the log's, so a peak that is the last one cannot be told: a new peak
            // is then also sampled when `sample_stride` events passed since the last full
            // footprint (the fragmentation at peak is exact for a replay without failures;
            // with failures, from at most `sample_stride` events before the peak). After any
            // other allocation only the bytes held are read (constant cost), which is all the
            // peak footprint needs.
            let last_peak = new_peak && later_max.get(i).map_or(true, |&m| u128::from(m) <= in_use);
            let strided = new_peak
                && !f.failure_events.is_empty()
                && last_full.map_or(true, |at| i - at >= sample_stride);
            let full = measures_footprint && (last_peak || strided || on_timeline);
            if full {
                last_full = Some(i);
            }
            let footprint = if full {
                mr.report().map(|r| r.footprint())
            } else {
                None
            };
            if let Some(fp) = footprint {
                f.peak_footprint = Some(f.peak_footprint.unwrap_or(0).max(fp.held_bytes));
                if new_peak {
                    f.fragmentation_at_peak = Some(fp.fragmentation());
                }
            } else if measures_footprint && grew {
                if let Some(held) = mr.report().map(|r| r.held_bytes()) {
                    f.peak_footprint = Some(f.peak_footprint.unwrap_or(0).max(held));
                }
            }
            if on_timeline {
                f.timeline.push(TimelinePoint {
                    event: done,
                    bytes_in_use: in_use,
                    footprint: footprint.map(|fp| fp.held_bytes),
                    beyond_device: options.device.as_ref().map(|d| d.beyond_device_bytes().0),
                });
            }
            if check && started.elapsed() >= PROGRESS_AFTER {
                progress(Progress {
                    done,
                    total: n,
                    elapsed: started.elapsed(),
                    repetitions: 0,
                });
                progress_shown = true;
            }
            segment = Instant::now();
        }
    }
    synchronize_device(mr);
    f.timed += segment.elapsed();
    if progress_shown {
        progress(Progress {
            done: n,
            total: n,
            elapsed: started.elapsed(),
            repetitions: 0,
        });
    }
    f.end = mr.report().map(|r| r.footprint());
    if let Some(end) = f.end {
        f.peak_footprint = Some(f.peak_footprint.unwrap_or(0).max(end.held_bytes));
    }
    if measures_footprint && f.fragmentation_at_peak.is_none() {
        f.fragmentation_at_peak = Some(0.0);
    }
    f.waste_at_end = blocks.saturating_sub(in_use);
    let (count, bytes, error) = free_live(mr, streams, slots);
    f.leaked_allocations = count;
    f.leaked_bytes = bytes;
    match error {
        Some(e) => Err(e),
        None => Ok(f),
    }
}
