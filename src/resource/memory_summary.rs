//! Why an allocation ran out, in words: the resource chain with each holder's figures (held, in
//! use, free, the largest free block, fragmentation, and for a stream-ordered pool the free bytes
//! waiting on other streams' lists), the device's free and total memory, and one hint that fits
//! the case. Out-of-memory errors carry it after RMM's own text
//! ([`explain_out_of_memory`]), and `rrmm.memory_summary()` prints the same table
//! ([`memory_summary`]).

use super::graph::MAX_STACK_DEPTH;
use super::{MemoryResource, SharedResource};
use crate::cuda::Stream;
use crate::error::Error;
use crate::report::{human_bytes, Footprint, StreamFree};
use crate::resource::SpillFigures;
use std::collections::HashSet;
use std::fmt::Write;

/// One resource of a chain and the figures it holds itself (`None` for adaptors, which forward
/// their upstream's, and resources that keep none).
struct Row {
    depth: usize,
    name: &'static str,
    footprint: Option<Footprint>,
    /// The resource is a source of memory (a simulated device): its held bytes are its bytes
    /// in use, and its free bytes the device's, outside what it holds.
    source: bool,
    /// The free bytes by stream list, as seen from the requesting stream (out-of-memory
    /// reports only).
    stream_free: Option<StreamFree>,
    memory_info: Option<(usize, usize)>,
}

fn report_id(mr: &dyn MemoryResource) -> Option<usize> {
    mr.report()
        .map(|r| r as *const dyn crate::report::PoolReport as *const () as usize)
}

/// The chain from `top` down, depth first, each resource once, at most [`MAX_STACK_DEPTH`]
/// rows (a walk with its own stack: user-built graphs may be deep or cyclic); with the free bytes
/// by stream list as seen from `stream` when one is given.
fn rows(top: &SharedResource, stream: Option<Stream>) -> Vec<Row> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut todo = vec![(0usize, top.clone())];
    while let Some((depth, mr)) = todo.pop() {
        if out.len() >= MAX_STACK_DEPTH || !seen.insert(mr.identity()) {
            continue;
        }
        let ups = mr.upstreams();
        let own = report_id(&*mr);
        let forwarded = own.is_some() && ups.iter().any(|u| report_id(&**u) == own);
        let (footprint, stream_free, source) = match mr.report() {
            Some(r) if !forwarded && !r.busy() => (
                Some(r.footprint()),
                stream.and_then(|s| r.stream_free(s)),
                r.is_source(),
            ),
            _ => (None, None, false),
        };
        out.push(Row {
            depth,
            name: mr.name(),
            footprint,
            source,
            stream_free,
            memory_info: if ups.is_empty() {
                mr.memory_info()
            } else {
                None
            },
        });
        todo.extend(ups.into_iter().rev().map(|u| (depth + 1, u)));
    }
    out
}

impl Row {
    /// Bytes in use: a holder's held bytes less its free ones; a source's held bytes (its free
    /// bytes are the device's, not part of what it holds: issue 39, a simulated device with
    /// 1 GiB in use showed 0 B).
    fn in_use(&self) -> Option<usize> {
        let f = self.footprint?;
        Some(if self.source {
            f.held_bytes
        } else {
            f.held_bytes.saturating_sub(f.free_bytes)
        })
    }
}

fn write_rows(text: &mut String, rows: &[Row]) {
    for row in rows {
        let indent = "  ".repeat(row.depth.min(16));
        let _ = write!(text, "  {indent}{}", row.name);
        if let Some(f) = row.footprint {
            let _ = write!(
                text,
                ": held {}, in use {}, free {} (largest free block {}, {} free block(s), \
                 fragmentation {:.2})",
                human_bytes(f.held_bytes),
                human_bytes(row.in_use().unwrap_or(0)),
                human_bytes(f.free_bytes),
                human_bytes(f.largest_free_block),
                f.free_blocks,
                f.fragmentation(),
            );
        }
        if let Some(s) = row.stream_free {
            let _ = write!(
                text,
                "; of the free, on other streams' lists (reusable here after their work) {} \
                 in {} list(s)",
                human_bytes(s.other_streams),
                s.other_lists,
            );
        }
        if let Some((free, total)) = row.memory_info {
            let _ = write!(
                text,
                "; memory below it: {} free of {}",
                human_bytes(free),
                human_bytes(total)
            );
        }
        text.push('\n');
    }
}

/// The table of `rrmm.memory_summary()`: every resource of the chain from `top` with the
/// figures it holds, and the memory under the chain.
pub fn memory_summary(top: &SharedResource) -> String {
    let rows = rows(top, None);
    let mut text = String::from("resource chain (top first) and what each holds:\n");
    write_rows(&mut text, &rows);
    text
}

/// The one hint that fits: fragmentation, a pool at its maximum, a spill at its limit
/// (`spill`: the figures of the spilling pools under the chain), or the memory below full.
fn hint(rows: &[Row], requested: usize, message: &str, spill: Option<SpillFigures>) -> String {
    let holder = rows.iter().find_map(|r| r.footprint.map(|f| (r.name, f)));
    let below = rows.iter().rev().find_map(|r| r.memory_info);
    let waiting = rows.iter().find_map(|r| r.stream_free.map(|s| (r.name, s)));
    if let Some((name, s)) = waiting {
        if s.other_streams >= requested {
            return format!(
                "hint: the {name} has {} free on {} other stream(s)' lists, freed there and \
                 reusable on this stream once their work is done: free on the stream that \
                 allocates next, or synchronize those streams (release() merges them)",
                human_bytes(s.other_streams),
                s.other_lists
            );
        }
    }
    if let Some((name, f)) = holder {
        if f.free_bytes >= requested && f.largest_free_block < requested {
            return format!(
                "hint: fragmented: the {name} has {} free but no free block of {}; an expandable \
                 pool coalesces across growth (reinitialize(pool_allocator=\"expandable\")), and \
                 release()/trim() gives free blocks back",
                human_bytes(f.free_bytes),
                human_bytes(requested)
            );
        }
        if message.contains("larger than the pool's maximum") {
            return format!(
                "hint: the request is larger than the {name}'s maximum size: no growth can \
                 serve it; raise maximum_pool_size above {}, or use managed memory to go past \
                 the device (reinitialize(managed_memory=True, pool_allocator=True))",
                human_bytes(requested)
            );
        }
        if message.contains("not enough room to grow") {
            return format!(
                "hint: the {name} reached its maximum size ({} held): raise maximum_pool_size, \
                 or use managed memory to go past the device \
                 (reinitialize(managed_memory=True, pool_allocator=True))",
                human_bytes(f.held_bytes)
            );
        }
    }
    if message.contains("Exceeded memory limit") {
        return format!(
            "hint: a limiting adaptor's allocation_limit refused {}: raise the limit, or free \
             what its chain holds",
            human_bytes(requested)
        );
    }
    if let (Some(spill), Some((free, _))) = (spill, below.filter(|&(free, _)| free < requested)) {
        // The device is full and the spill's limit leaves too little host memory beside it.
        return format!(
            "hint: the spill to host memory reached its limit: {} of device memory free and {} \
             of the spill_to_host limit of {} left ({} spilled now) cannot hold {}; raise \
             spill_to_host (ExpandableMemoryResource(spill_to_host=...) or \
             reinitialize(pool_allocator=\"expandable\", spill_to_host=...); True takes what \
             the host has room for), or free what the pool holds (trim(), promote() after frees)",
            human_bytes(free),
            human_bytes(spill.limit.saturating_sub(spill.spilled)),
            human_bytes(spill.limit),
            human_bytes(spill.spilled),
            human_bytes(requested)
        );
    }
    if let Some((free, total)) = below.filter(|&(free, _)| free < requested) {
        // A source's held bytes are what the holders above it took from it: counted once.
        let holders = rows.iter().any(|r| r.footprint.is_some() && !r.source);
        let held: usize = rows
            .iter()
            .filter(|r| !(holders && r.source))
            .filter_map(|r| r.footprint.map(|f| f.held_bytes))
            .sum();
        return format!(
            "hint: the memory below is full: {} free of {}; this chain holds {}, the rest is \
             held elsewhere (other resources, other processes, the driver); free some \
             (release(), trim(), rrmm.mr.release_caches()) or let allocations go past the device \
             (reinitialize(managed_memory=True, pool_allocator=True))",
            human_bytes(free),
            human_bytes(total),
            human_bytes(held)
        );
    }
    match below {
        Some((free, total)) => format!(
            "hint: the memory below has {} free of {}, enough for the request: a resource of \
             the chain refused it (a limit, a callback or a fixed size)",
            human_bytes(free),
            human_bytes(total)
        ),
        None => {
            "hint: the resource refused the request (a limit or a callback said no)".to_string()
        }
    }
}

/// `err` with the chain's figures and a hint appended, when it is an out-of-memory error for
/// `requested` bytes from `top` on `stream`; any other error unchanged. RMM's text stays first,
/// so code that matches it keeps working.
pub fn explain_out_of_memory(
    err: Error,
    top: &SharedResource,
    requested: usize,
    stream: Stream,
) -> Error {
    match err {
        Error::OutOfMemory {
            requested: r,
            message,
        } if !message.contains("\nresource chain") => {
            let rows = rows(top, Some(stream));
            let mut text = message;
            let _ = write!(
                text,
                "\nrequest: {} ({requested} bytes)\nresource chain (top first) and what each \
                 holds:\n",
                human_bytes(requested)
            );
            write_rows(&mut text, &rows);
            let spill = super::sleep::stack::spill_figures(top);
            text.push_str(&hint(&rows, requested, &text, spill));
            Error::OutOfMemory {
                requested: r,
                message: text,
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::Stream;
    use crate::resource::SimulatedMemoryResource;
    use crate::suballocator::PoolMemoryResource;
    use std::sync::Arc;

    const MIB: usize = 1 << 20;

    fn sim(size: usize) -> SharedResource {
        Arc::new(SimulatedMemoryResource::new(size))
    }

    /// The figures of the row of `name` in a summary: (held, in use, free) as printed.
    fn row_figures(text: &str, name: &str) -> (String, String, String) {
        let line = text
            .lines()
            .find_map(|l| l.trim_start().strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("no {name} row in {text}"));
        let parts: Vec<&str> = line.splitn(3, ", ").collect();
        let figure = |part: &str, label: &str| {
            let rest = part.strip_prefix(label).unwrap_or_else(|| panic!("{line}"));
            rest.split(" (").next().unwrap().to_owned()
        };
        (
            figure(parts[0], "held "),
            figure(parts[1], "in use "),
            figure(parts[2], "free "),
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Issue 39: the "in use" figure of a simulated device is its bytes in use (charged to
        /// live allocations), whatever the device's size and the bytes held (it showed held
        /// less the device's free bytes: 0 B with 1 GiB in use); a pool over it shows its held
        /// bytes less its free ones; the chain's held bytes count the device's once.
        #[test]
        fn in_use_is_the_bytes_in_use_of_each_row(
            device_mib in 16usize..(80 << 10),
            requests in proptest::collection::vec(1usize..(4 << 30), 0..12),
            pooled: bool,
        ) {
            let sim = Arc::new(SimulatedMemoryResource::new(device_mib * MIB));
            let top: SharedResource = if pooled {
                Arc::new(PoolMemoryResource::new(sim.clone(), None, None).unwrap())
            } else {
                sim.clone()
            };
            let mut live = Vec::new();
            for bytes in requests {
                if let Ok(p) = top.allocate(bytes, Stream::DEFAULT) {
                    live.push((p, bytes));
                }
            }
            let text = memory_summary(&top);
            let in_use = human_bytes(sim.bytes_in_use());
            let free = human_bytes(device_mib * MIB - sim.bytes_in_use());
            proptest::prop_assert_eq!(row_figures(&text, "simulated"), (in_use.clone(), in_use, free));
            if pooled {
                let f = top.report().unwrap().footprint();
                let used: usize = live.iter().map(|&(_, b)| crate::resource::align_up(b, 256).unwrap()).sum();
                proptest::prop_assert_eq!(f.held_bytes - f.free_bytes, used);
                proptest::prop_assert_eq!(row_figures(&text, "pool").1, human_bytes(used));
            }
            // The hint's "this chain holds" counts the device's bytes once: the holder's rows
            // and the device's, as the chain reports them.
            let mut rows = rows(&top, None);
            for r in &mut rows {
                if r.source {
                    r.memory_info = Some((0, device_mib * MIB));
                }
            }
            let hint = hint(&rows, 1, "refused", None);
            let holds = if pooled { top.report().unwrap().footprint().held_bytes } else { sim.bytes_in_use() };
            let expected = format!("this chain holds {}", human_bytes(holds));
            proptest::prop_assert!(hint.contains(&expected), "{}", hint);
            for (p, bytes) in live {
                // SAFETY: allocated above with `bytes`, freed once.
                unsafe { top.deallocate(p, bytes, Stream::DEFAULT) }.unwrap();
            }
        }
    }

    #[test]
    fn a_pool_at_its_maximum_says_so() {
        let pool =
            PoolMemoryResource::new(sim(1024 * MIB), Some(256 * MIB), Some(512 * MIB)).unwrap();
        let top: SharedResource = Arc::new(pool);
        let _held = top.allocate(200 * MIB, Stream::DEFAULT).unwrap();
        let err = top.allocate(300 * MIB, Stream::DEFAULT).unwrap_err();
        let text = explain_out_of_memory(err, &top, 300 * MIB, Stream::DEFAULT).to_string();
        assert!(text.starts_with("std::bad_alloc: out_of_memory"), "{text}");
        assert!(text.contains("request: 300.00 MiB"), "{text}");
        assert!(text.contains("pool: held 256.00 MiB"), "{text}");
        assert!(
            text.contains("hint: the pool reached its maximum size"),
            "{text}"
        );
    }

    /// Issue 29: a request above the maximum (3 GiB on a 2 GiB maximum, 1 GiB held) was told
    /// the pool "reached its maximum size (1.00 GiB held)".
    #[test]
    fn a_request_above_the_maximum_says_so() {
        let pool = PoolMemoryResource::new(sim(16 << 30), Some(1 << 30), Some(2 << 30)).unwrap();
        let top: SharedResource = Arc::new(pool);
        let err = top.allocate(3 << 30, Stream::DEFAULT).unwrap_err();
        assert!(err.is_out_of_memory());
        let text = explain_out_of_memory(err, &top, 3 << 30, Stream::DEFAULT).to_string();
        assert!(
            text.contains("Maximum pool size exceeded"),
            "RMM's text first: {text}"
        );
        assert!(text.contains("larger than the pool's maximum"), "{text}");
        assert!(!text.contains("reached its maximum"), "{text}");
        assert!(
            text.contains("hint: the request is larger than the pool's maximum size"),
            "{text}"
        );
    }

    #[test]
    fn a_fragmented_pool_says_so() {
        let pool = PoolMemoryResource::new(sim(64 * MIB), Some(64 * MIB), Some(64 * MIB)).unwrap();
        let top: SharedResource = Arc::new(pool);
        let ptrs: Vec<usize> = (0..8)
            .map(|_| top.allocate(8 * MIB, Stream::DEFAULT).unwrap())
            .collect();
        for p in ptrs.iter().step_by(2) {
            // SAFETY: allocated above with 8 MiB, freed once.
            unsafe { top.deallocate(*p, 8 * MIB, Stream::DEFAULT) }.unwrap();
        }
        let err = top.allocate(16 * MIB, Stream::DEFAULT).unwrap_err();
        let text = explain_out_of_memory(err, &top, 16 * MIB, Stream::DEFAULT).to_string();
        assert!(text.contains("hint: fragmented"), "{text}");
        assert!(text.contains("largest free block 8.00 MiB"), "{text}");
        for p in ptrs.iter().skip(1).step_by(2) {
            // SAFETY: the other half, freed once.
            unsafe { top.deallocate(*p, 8 * MIB, Stream::DEFAULT) }.unwrap();
        }
    }

    #[test]
    fn a_full_device_says_what_is_free_and_held() {
        let top = sim(64 * MIB);
        let held = top.allocate(60 * MIB, Stream::DEFAULT).unwrap();
        let err = top.allocate(16 * MIB, Stream::DEFAULT).unwrap_err();
        let text = explain_out_of_memory(err, &top, 16 * MIB, Stream::DEFAULT).to_string();
        assert!(text.contains("hint: the memory below is full"), "{text}");
        assert!(text.contains("free of 64.00 MiB"), "{text}");
        // Explaining twice adds nothing; other errors pass unchanged.
        let again = explain_out_of_memory(Error::Logic("x".into()), &top, 1, Stream::DEFAULT);
        assert!(matches!(again, Error::Logic(_)));
        // SAFETY: allocated above, freed once.
        unsafe { top.deallocate(held, 60 * MIB, Stream::DEFAULT) }.unwrap();
        assert!(memory_summary(&top).contains("simulated"));
    }

    #[test]
    fn free_bytes_waiting_on_other_streams_are_counted_and_named() {
        let pool = PoolMemoryResource::new(sim(64 * MIB), Some(64 * MIB), Some(64 * MIB)).unwrap();
        let top: SharedResource = Arc::new(pool);
        // SAFETY: simulated memory records no events: any handle names a stream.
        let (a, b) = unsafe { (Stream::from_raw(0xa0), Stream::from_raw(0xb0)) };
        let p = top.allocate(32 * MIB, a).unwrap();
        // SAFETY: allocated above with 32 MiB on `a`, freed once there.
        unsafe { top.deallocate(p, 32 * MIB, a) }.unwrap();
        let report = top.report().unwrap();
        let seen_from_b = report.stream_free(b).unwrap();
        assert_eq!(seen_from_b.other_streams, 32 * MIB);
        assert_eq!(seen_from_b.other_lists, 1);
        assert_eq!(seen_from_b.this_stream, 0);
        assert_eq!(report.stream_free(a).unwrap().this_stream, 32 * MIB);
        // An out-of-memory report from `b` names them; the pool had merged every list before it
        // gave up, so by then none wait.
        let err = top.allocate(128 * MIB, b).unwrap_err();
        let text = explain_out_of_memory(err, &top, 128 * MIB, b).to_string();
        assert!(
            text.contains("on other streams' lists (reusable here after their work) 0 B in 0"),
            "{text}"
        );
        let waiting = rows(&top, Some(b));
        assert!(waiting
            .iter()
            .all(|r| r.stream_free.is_none_or(|s| s.other_streams == 0)));
    }

    #[test]
    fn the_hint_names_memory_waiting_on_other_streams() {
        let row = Row {
            depth: 0,
            name: "pool",
            footprint: Some(Footprint {
                held_bytes: 64 * MIB,
                free_bytes: 32 * MIB,
                largest_free_block: 32 * MIB,
                free_blocks: 1,
            }),
            source: false,
            stream_free: Some(StreamFree {
                this_stream: 0,
                other_streams: 32 * MIB,
                other_lists: 2,
            }),
            memory_info: None,
        };
        let text = hint(&[row], 16 * MIB, "out_of_memory", None);
        assert!(
            text.contains("32.00 MiB free on 2 other stream(s)' lists"),
            "{text}"
        );
    }

    #[test]
    fn a_limit_is_named_and_free_memory_below_is_not_called_full() {
        let below = sim(64 * MIB);
        let limited: SharedResource = Arc::new(crate::adaptor::LimitingResourceAdaptor::new(
            below.clone(),
            MIB,
        ));
        let err = limited.allocate(4 * MIB, Stream::DEFAULT).unwrap_err();
        let text = explain_out_of_memory(err, &limited, 4 * MIB, Stream::DEFAULT).to_string();
        assert!(
            text.contains("hint: a limiting adaptor's allocation_limit"),
            "{text}"
        );
        assert!(!text.contains("is full"), "{text}");
        let other = hint(
            &[Row {
                depth: 0,
                name: "simulated",
                footprint: None,
                source: true,
                stream_free: None,
                memory_info: Some((64 * MIB, 64 * MIB)),
            }],
            4 * MIB,
            "callback said no",
            None,
        );
        assert!(other.contains("enough for the request"), "{other}");
    }
}
