//! Replaying a compiled trace against a resource, with timing and memory figures.

use super::trace::{Action, Trace};
use crate::cuda::{OwnedStream, Stream};
use crate::error::{Error, Result};
use crate::resource::{Footprint, MemoryKind, SharedResource};
use std::time::{Duration, Instant};

/// Events between progress checks (and between regular footprint samples at most).
const CHECK_EVERY: usize = 4096;
/// Regular footprint samples per replay (besides one at every new peak of bytes in use).
const SAMPLES: usize = 1024;
/// Replays shorter than this show no progress.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// Options of [`replay`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayOptions {
    /// Points of the timeline to record for a plot (0: none).
    pub timeline_points: usize,
    /// Print a progress bar on standard error when the replay takes more than a second.
    pub progress: bool,
}

/// One point of a replay's timeline.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TimelinePoint {
    /// Events replayed so far.
    pub event: usize,
    /// Sum of the requested sizes of the live allocations.
    pub bytes_in_use: usize,
    /// The resource's footprint (`held_bytes`), where it reports one.
    pub footprint: Option<usize>,
}

/// The figures of one replay.
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
    /// Wall time of the replay in nanoseconds, without the time spent sampling footprints.
    pub total_ns: u64,
    /// `total_ns / events`.
    pub ns_per_event: f64,
    /// The most bytes in use at once (sum of live requested sizes).
    pub peak_bytes_in_use: usize,
    /// The largest footprint sampled (`Footprint::held_bytes`: a pool's size), where reported.
    pub peak_footprint: Option<usize>,
    /// Fragmentation (`1 - largest free block / free bytes`) when bytes in use peaked.
    pub fragmentation_at_peak: Option<f64>,
    /// Fragmentation after the last event (before leaks are freed).
    pub fragmentation_at_end: Option<f64>,
    /// The full footprint after the last event.
    pub footprint_at_end: Option<Footprint>,
    /// Allocations that failed with out of memory.
    pub failed_allocations: usize,
    /// Bytes those failed allocations asked for.
    pub failed_bytes: usize,
    /// Event indices of the failed allocations.
    pub failure_events: Vec<usize>,
    /// Allocations still live after the last event (freed after the report).
    pub leaked_allocations: usize,
    /// Bytes of those allocations.
    pub leaked_bytes: usize,
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
    /// Time since the replay started.
    pub elapsed: Duration,
}

/// The streams of a replay: log stream index -> handle; owns created CUDA streams.
struct Streams {
    handles: Vec<Stream>,
    owned: Vec<OwnedStream>,
}

fn map_streams(trace: &Trace, mr: &SharedResource) -> Result<Streams> {
    // Fake handles only where nothing passes them to the driver: simulated memory, or host
    // memory with no driver loaded (a pool over host memory records events on its streams).
    let real = match mr.kind() {
        MemoryKind::Simulated => false,
        MemoryKind::Host => crate::cuda::driver_available(),
        MemoryKind::Device | MemoryKind::Managed | MemoryKind::PinnedHost => true,
    };
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
/// Logged streams map to fake handles on simulated and host memory and to created streams on
/// device memory (stream 0 stays the default stream). Out of memory is counted, not fatal: the
/// matching free is skipped.
///
/// # Errors
/// Any error of the resource other than out of memory (after freeing what is live); creating
/// streams on a device.
///
/// # Time Complexity
/// O(events) calls to the resource.
pub fn replay(trace: &Trace, mr: &SharedResource, options: ReplayOptions) -> Result<ReplayReport> {
    if options.progress {
        let mut printer = ProgressPrinter::default();
        replay_with_progress(trace, mr, options, &mut |p| printer.show(p))
    } else {
        replay_with_progress(trace, mr, options, &mut |_| {})
    }
}

#[derive(Default)]
struct ProgressPrinter {
    shown: bool,
}

impl ProgressPrinter {
    fn show(&mut self, p: Progress) {
        use std::io::Write;
        let frac = if p.total == 0 {
            1.0
        } else {
            p.done as f64 / p.total as f64
        };
        let filled = (frac * 30.0) as usize;
        let bar: String = (0..30)
            .map(|i| if i < filled { '#' } else { '.' })
            .collect();
        let end = if p.done >= p.total { "\n" } else { "" };
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\rreplay [{bar}] {:5.1}% {}/{} events, {:.1}s{end}",
            frac * 100.0,
            p.done,
            p.total,
            p.elapsed.as_secs_f64()
        );
        let _ = err.flush();
        self.shown = true;
    }
}

/// [`replay`] with a progress callback, called every few thousand events once the replay has
/// run for a second, and once at the end if it was called before.
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
    let measures_footprint = mr.footprint().is_some();
    let sample_stride = (n / SAMPLES).clamp(1, CHECK_EVERY);
    let timeline_stride = n
        .checked_div(options.timeline_points)
        .map_or(usize::MAX, |stride| stride.max(1));
    // Per slot: (pointer, size, stream index); pointer 0 means not live (or failed).
    let mut slots: Vec<(usize, usize, u32)> = vec![(0, 0, 0); trace.slot_count];
    let mut in_use = 0usize;
    let mut peak = 0usize;
    let mut peak_footprint: Option<usize> = None;
    let mut fragmentation_at_peak = None;
    let mut failure_events = Vec::new();
    let mut failed_bytes = 0usize;
    let mut timeline = Vec::new();
    if options.timeline_points > 0 {
        timeline.push(TimelinePoint {
            event: 0,
            bytes_in_use: 0,
            footprint: mr.footprint().map(|f| f.held_bytes),
        });
    }
    let mut progress_shown = false;
    let started = Instant::now();
    let mut timed = Duration::ZERO;
    let mut segment = Instant::now();
    let mut error: Option<Error> = None;

    for (i, ev) in trace.events.iter().enumerate() {
        let slot = ev.slot as usize;
        let stream = streams.handles[ev.stream as usize];
        let mut new_peak = false;
        match ev.action {
            Action::Allocate => match mr.allocate(ev.size, stream) {
                Ok(ptr) => {
                    slots[slot] = (ptr, ev.size, ev.stream);
                    in_use += ev.size;
                    if in_use > peak {
                        peak = in_use;
                        new_peak = true;
                    }
                }
                Err(e) if e.is_out_of_memory() => {
                    slots[slot] = (0, 0, ev.stream);
                    failure_events.push(i);
                    failed_bytes += ev.size;
                }
                Err(e) => {
                    error = Some(e);
                    break;
                }
            },
            Action::Free => {
                let (ptr, _, _) = slots[slot];
                if ptr != 0 {
                    // SAFETY: `ptr` was allocated from `mr` for this slot with `ev.size` (the
                    // trace checks a free's size against its allocation) and is freed once; the
                    // replay does no work on the memory.
                    if let Err(e) = unsafe { mr.deallocate(ptr, ev.size, stream) } {
                        error = Some(e);
                        break;
                    }
                    slots[slot] = (0, 0, 0);
                    in_use -= ev.size;
                }
            }
        }
        let done = i + 1;
        let regular = done % sample_stride == 0;
        let on_timeline = done % timeline_stride == 0 || (done == n && !timeline.is_empty());
        let check = done % CHECK_EVERY == 0;
        if (measures_footprint && (new_peak || regular)) || on_timeline || check {
            // Stop the clock while sampling.
            timed += segment.elapsed();
            let footprint = if measures_footprint && (new_peak || regular || on_timeline) {
                mr.footprint()
            } else {
                None
            };
            if let Some(f) = footprint {
                peak_footprint = Some(peak_footprint.unwrap_or(0).max(f.held_bytes));
                if new_peak {
                    fragmentation_at_peak = Some(f.fragmentation());
                }
            }
            if on_timeline {
                timeline.push(TimelinePoint {
                    event: done,
                    bytes_in_use: in_use,
                    footprint: footprint.map(|f| f.held_bytes),
                });
            }
            if check && started.elapsed() >= PROGRESS_AFTER {
                progress(Progress {
                    done,
                    total: n,
                    elapsed: started.elapsed(),
                });
                progress_shown = true;
            }
            segment = Instant::now();
        }
    }
    // Stream-ordered work (asynchronous frees) is part of the replay's cost: wait for it inside the
    // timed region, as RMM's replay benchmark does.
    if matches!(mr.kind(), MemoryKind::Device | MemoryKind::Managed) {
        if let Ok(_ctx) = crate::cuda::ContextGuard::new(mr.device().unwrap_or(0)) {
            let _ = crate::cuda::context_synchronize();
        }
    }
    timed += segment.elapsed();
    if progress_shown {
        progress(Progress {
            done: n,
            total: n,
            elapsed: started.elapsed(),
        });
    }

    let end = mr.footprint();
    if let Some(f) = end {
        peak_footprint = Some(peak_footprint.unwrap_or(0).max(f.held_bytes));
    }
    // Leaks: what is still live.
    let mut leaked_allocations = 0;
    let mut leaked_bytes = 0;
    let mut cleanup_error = None;
    for &(ptr, size, stream) in &slots {
        if ptr != 0 {
            leaked_allocations += 1;
            leaked_bytes += size;
            // SAFETY: the slot still owns `ptr`, allocated from `mr` with `size`; freed once.
            if let Err(e) = unsafe { mr.deallocate(ptr, size, streams.handles[stream as usize]) } {
                cleanup_error.get_or_insert(e);
            }
        }
    }
    if !streams.owned.is_empty() {
        for s in &streams.owned {
            let _ = s.synchronize();
        }
    }
    if let Some(e) = error.or(cleanup_error) {
        return Err(e);
    }
    let total_ns = u64::try_from(timed.as_nanos()).unwrap_or(u64::MAX);
    Ok(ReplayReport {
        source: trace.source.clone(),
        resource: mr.name().to_string(),
        events: n,
        allocations: trace.allocations(),
        total_ns,
        ns_per_event: if n == 0 {
            0.0
        } else {
            total_ns as f64 / n as f64
        },
        peak_bytes_in_use: peak,
        peak_footprint,
        fragmentation_at_peak: if measures_footprint {
            Some(fragmentation_at_peak.unwrap_or(0.0))
        } else {
            None
        },
        fragmentation_at_end: end.map(|f| f.fragmentation()),
        footprint_at_end: end,
        failed_allocations: failure_events.len(),
        failed_bytes,
        failure_events,
        leaked_allocations,
        leaked_bytes,
        logged_failures: trace.logged_failures,
        parse_warnings: trace.warnings,
        timeline,
    })
}
