//! The arena's state as text, for `dump_log_on_failure` and for reports.

use super::global::GlobalArena;
use super::local::LocalArena;
use super::ArenaKey;
use std::fmt::Write;

/// Where the dump goes when `RMM_ARENA_DUMP` does not say: this file in the current directory.
pub const DEFAULT_DUMP_FILE: &str = "rrmm_arena_memory_dump.log";

/// The environment variable naming the dump file.
pub const DUMP_ENV: &str = "RMM_ARENA_DUMP";

fn percent_fragmented(free: usize, largest: usize) -> f64 {
    if free == 0 {
        0.0
    } else {
        (1.0 - largest as f64 / free as f64) * 100.0
    }
}

/// The global arena's free ranges and every arena's superblocks, one item per line.
pub(super) fn report(
    requested: Option<usize>,
    global: &GlobalArena,
    arenas: &[(ArenaKey, &LocalArena)],
) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = write_report(&mut s, requested, global, arenas);
    s
}

fn write_report(
    s: &mut String,
    requested: Option<usize>,
    global: &GlobalArena,
    arenas: &[(ArenaKey, &LocalArena)],
) -> std::fmt::Result {
    let line = "**************************************************";
    if let Some(bytes) = requested {
        writeln!(s, "{line}")?;
        writeln!(s, "Ran out of memory trying to allocate {bytes} bytes.")?;
        writeln!(s, "{line}")?;
    }
    let (base, size) = global.extent();
    let (free, largest) = (global.free_bytes(), global.largest_free());
    let ranges = global.free_ranges();
    writeln!(s, "Global arena:")?;
    writeln!(s, "  Arena size: {size} bytes at {base:#x}")?;
    writeln!(
        s,
        "  Free: {free} bytes in {} ranges, largest {largest} bytes, fragmentation {:.2}%",
        ranges.len(),
        percent_fragmented(free, largest)
    )?;
    for (i, (start, len)) in ranges.iter().enumerate() {
        writeln!(
            s,
            "    Free range {i}: start={start:#x}, end={:#x}, size={len}",
            start + len
        )?;
    }
    let (large, large_bytes) = global.large_blocks();
    writeln!(s, "  Large blocks: {large}, {large_bytes} bytes")?;
    writeln!(s, "Arenas: {}", arenas.len())?;
    for (key, arena) in arenas {
        let name = match key {
            ArenaKey::Thread(t) => format!("per-thread arena (thread {t})"),
            ArenaKey::Stream(h) => format!("per-stream arena (stream {h:#x})"),
        };
        let superblocks = arena.superblocks();
        writeln!(
            s,
            "  {name}: {} superblocks, {} bytes held, {} bytes free, {} live blocks",
            superblocks.len(),
            arena.held_bytes(),
            arena.free_bytes(),
            arena.live_blocks()
        )?;
        for (i, sb) in superblocks.iter().enumerate() {
            writeln!(
                s,
                "    Superblock {i}: start={:#x}, end={:#x}, size={}, empty={}, free={}, \
                 free blocks={}, largest free={}",
                sb.start,
                sb.start + sb.size,
                sb.size,
                if sb.is_empty() { "T" } else { "F" },
                sb.free_bytes,
                sb.free_blocks,
                sb.largest_free
            )?;
        }
    }
    Ok(())
}
