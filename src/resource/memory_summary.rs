//! Why an allocation ran out, in words: the resource chain with each holder's figures (held, in
//! use, free, the largest free block, fragmentation), the device's free and total memory, and
//! one hint that fits the case. Out-of-memory errors carry it after RMM's own text
//! ([`explain_out_of_memory`]), and `rrmm.memory_summary()` prints the same table
//! ([`memory_summary`]).

use super::graph::MAX_STACK_DEPTH;
use super::{MemoryResource, SharedResource};
use crate::error::Error;
use crate::report::{human_bytes, Footprint};
use std::collections::HashSet;
use std::fmt::Write;

/// One resource of a chain and the figures it holds itself (`None` for adaptors, which forward
/// their upstream's, and resources that keep none).
struct Row {
    depth: usize,
    name: &'static str,
    footprint: Option<Footprint>,
    memory_info: Option<(usize, usize)>,
}

fn report_id(mr: &dyn MemoryResource) -> Option<usize> {
    mr.report()
        .map(|r| r as *const dyn crate::report::PoolReport as *const () as usize)
}

/// The chain from `top` down, depth first, each resource once, at most [`MAX_STACK_DEPTH`]
/// rows (a walk with its own stack: user-built graphs may be deep or cyclic).
fn rows(top: &SharedResource) -> Vec<Row> {
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
        let footprint = match mr.report() {
            Some(r) if !forwarded && !r.busy() => Some(r.footprint()),
            _ => None,
        };
        out.push(Row {
            depth,
            name: mr.name(),
            footprint,
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
                human_bytes(f.held_bytes.saturating_sub(f.free_bytes)),
                human_bytes(f.free_bytes),
                human_bytes(f.largest_free_block),
                f.free_blocks,
                f.fragmentation(),
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
    let rows = rows(top);
    let mut text = String::from("resource chain (top first) and what each holds:\n");
    write_rows(&mut text, &rows);
    text
}

/// The one hint that fits: fragmentation, a pool at its maximum, or the memory below full.
fn hint(rows: &[Row], requested: usize, message: &str) -> String {
    let holder = rows.iter().find_map(|r| r.footprint.map(|f| (r.name, f)));
    let below = rows.iter().rev().find_map(|r| r.memory_info);
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
        if message.contains("Maximum pool size exceeded") || message.contains("maximum") {
            return format!(
                "hint: the {name} reached its maximum size ({} held): raise maximum_pool_size, \
                 or use managed memory to go past the device \
                 (reinitialize(managed_memory=True, pool_allocator=True))",
                human_bytes(f.held_bytes)
            );
        }
    }
    if let Some((free, total)) = below {
        let held: usize = rows
            .iter()
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
    "hint: the resource refused the request (a limit or a callback said no)".to_string()
}

/// `err` with the chain's figures and a hint appended, when it is an out-of-memory error for
/// `requested` bytes from `top`; any other error unchanged. RMM's text stays first, so code that
/// matches it keeps working.
pub fn explain_out_of_memory(err: Error, top: &SharedResource, requested: usize) -> Error {
    match err {
        Error::OutOfMemory {
            requested: r,
            message,
        } if !message.contains("\nresource chain") => {
            let rows = rows(top);
            let mut text = message;
            let _ = write!(
                text,
                "\nrequest: {} ({requested} bytes)\nresource chain (top first) and what each \
                 holds:\n",
                human_bytes(requested)
            );
            write_rows(&mut text, &rows);
            text.push_str(&hint(&rows, requested, &text));
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

    #[test]
    fn a_pool_at_its_maximum_says_so() {
        let pool =
            PoolMemoryResource::new(sim(1024 * MIB), Some(256 * MIB), Some(512 * MIB)).unwrap();
        let top: SharedResource = Arc::new(pool);
        let err = top.allocate(600 * MIB, Stream::DEFAULT).unwrap_err();
        let text = explain_out_of_memory(err, &top, 600 * MIB).to_string();
        assert!(text.starts_with("std::bad_alloc: out_of_memory"), "{text}");
        assert!(text.contains("request: 600.00 MiB"), "{text}");
        assert!(text.contains("pool: held 256.00 MiB"), "{text}");
        assert!(
            text.contains("hint: the pool reached its maximum size"),
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
        let text = explain_out_of_memory(err, &top, 16 * MIB).to_string();
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
        let text = explain_out_of_memory(err, &top, 16 * MIB).to_string();
        assert!(text.contains("hint: the memory below is full"), "{text}");
        assert!(text.contains("free of 64.00 MiB"), "{text}");
        // Explaining twice adds nothing; other errors pass unchanged.
        let again = explain_out_of_memory(Error::Logic("x".into()), &top, 1);
        assert!(matches!(again, Error::Logic(_)));
        // SAFETY: allocated above, freed once.
        unsafe { top.deallocate(held, 60 * MIB, Stream::DEFAULT) }.unwrap();
        assert!(memory_summary(&top).contains("simulated"));
    }
}
