//! Sleep, wake, promotion and their figures for any stack: the pools under a resource whose
//! memory moves, reached through its [`Link`](crate::resource::Link) (no walk, no downcast).

use super::{ByteRange, DiscardFill, MovingPool, SleepCause, SleepEstimate, SleepPlan, SleepTag};
use crate::error::{Error, Result};
use crate::resource::host_pages::mapped::PromoteReport;
use crate::resource::{SharedResource, SpillFigures};
use std::sync::Arc;

/// The pools that can sleep under `mr` (itself, or below its adaptors and suballocators), from
/// its link, top first.
///
/// # Errors
/// [`Error::Logic`] naming `mr` when no pool under it can sleep.
pub fn sleep_targets(mr: &SharedResource) -> Result<Vec<Arc<dyn MovingPool>>> {
    let pools = mr.link().sleep.pools();
    if pools.is_empty() {
        return Err(Error::Logic(format!(
            "{}: sleep needs a pool on virtual memory, and this stack has none; build it with \
             rrmm.reinitialize(pool_allocator=\"expandable\") or over \
             rrmm.mr.ExpandableMemoryResource",
            mr.name()
        )));
    }
    Ok(pools.to_vec())
}

/// Resolves `discard` (addresses with the buffer's size where known) to the exact blocks of the
/// pools under `mr`: each pool's own share of a [`SleepPlan`]. Nothing is tagged.
///
/// # Errors
/// As [`Link::block_for_tag`](crate::resource::Link::block_for_tag), for the first address no
/// pool holds.
pub fn plan_discards(
    mr: &SharedResource,
    discard: &[(usize, Option<usize>)],
) -> Result<Vec<(usize, usize)>> {
    let link = mr.link();
    discard
        .iter()
        .map(|&(ptr, size)| link.block_for_tag(ptr, size).map(|(block, _)| block))
        .collect()
}

/// Tags the block of `ptr` (with the buffer's `size` where known) `tag` in the pool under `mr`
/// that holds it; returns the block's start.
///
/// # Errors
/// As [`Link::block_for_tag`](crate::resource::Link::block_for_tag).
pub fn tag(mr: &SharedResource, ptr: usize, size: Option<usize>, tag: SleepTag) -> Result<usize> {
    let (block, pool) = mr.link().block_for_tag(ptr, size)?;
    pool.tag(block, tag);
    Ok(block.0)
}

/// Offloads every pool under `mr` that can sleep with `plan` (its fill, this sleep's `discard`
/// ranges from [`plan_discards`], or `discard_all`); when one is refused, those offloaded before
/// it are woken again: a refused sleep of a stack changes nothing. Returns the figures summed.
///
/// # Errors
/// As [`sleep_targets`] and the pools' offloads.
pub fn offload_discarding(mr: &SharedResource, plan: SleepPlan) -> Result<SleepEstimate> {
    let pools = sleep_targets(mr)?;
    let mut total = SleepEstimate::default();
    for (i, pool) in pools.iter().enumerate() {
        match pool.offload(&plan) {
            Ok(e) => total = total.plus(e),
            Err(e) => {
                for done in &pools[..i] {
                    let _ = done.wake(Some(plan.cause));
                }
                return Err(e);
            }
        }
    }
    Ok(total)
}

/// [`offload_discarding`] with the persistent tags only.
///
/// # Errors
/// As [`offload_discarding`].
pub fn offload(mr: &SharedResource, fill: DiscardFill) -> Result<SleepEstimate> {
    offload_discarding(mr, SleepPlan::with_fill(fill))
}

/// Restores every pool under `mr` that is asleep, whoever put it to sleep.
///
/// # Errors
/// As [`sleep_targets`]; [`Error::Logic`] when none is asleep; the first wake's error (the
/// others are still tried, so one refusal leaves only its pool asleep).
pub fn restore(mr: &SharedResource) -> Result<()> {
    let pools = sleep_targets(mr)?;
    let mut first = None;
    let mut any = false;
    for pool in pools.iter().filter(|p| p.asleep()) {
        any = true;
        if let Err(e) = pool.wake(None) {
            first.get_or_insert(e);
        }
    }
    if !any {
        return Err(Error::Logic(format!(
            "{}: restore() of a pool that is awake (no offload() to undo)",
            mr.name()
        )));
    }
    first.map_or(Ok(()), Err)
}

/// Wakes the pools under `mr` that sleep for `cause`, after any transition in flight (an
/// offload for the ledger in flight is abandoned); the bytes of live data woken.
///
/// # Errors
/// The first wake's error (the others are still tried).
pub fn wake_for(mr: &SharedResource, cause: SleepCause) -> Result<usize> {
    let mut first = None;
    let mut woken = 0;
    for pool in mr.link().sleep.pools().iter() {
        let before = pool.movement();
        match pool.wake(Some(cause)) {
            Ok(true) if before.cause == Some(cause) => woken += before.offloaded_bytes,
            Ok(_) => {}
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    first.map_or(Ok(woken), Err)
}

/// Makes the host pages of the next sleep of every pool under `mr` ready ahead of need, in the
/// background; returns the bytes asked for.
///
/// # Errors
/// As [`sleep_targets`]; where a pool's memory cannot be copied to the host.
pub fn prepare(mr: &SharedResource) -> Result<usize> {
    sleep_targets(mr)?
        .iter()
        .try_fold(0usize, |sum, p| Ok(sum + p.prepare()?))
}

/// Keeps the next sleep's host pages ready as every pool under `mr` grows (`on`); returns the
/// bytes asked for now.
///
/// # Errors
/// As [`sleep_targets`]; where a pool's memory cannot be copied to the host.
pub fn keep_ready(mr: &SharedResource, on: bool) -> Result<usize> {
    sleep_targets(mr)?
        .iter()
        .try_fold(0usize, |sum, p| Ok(sum + p.keep_ready(on)?))
}

/// Moves the pages spilled to the host of every pool under `mr` (those in `range` where
/// given) back to device memory at the same addresses, at most `limit` bytes in all; the
/// figures summed. A stack with no pool on virtual memory has nothing spilled: an empty report.
///
/// # Errors
/// [`Error::InvalidArgument`] (`buffer`) for a range whose start no pool under `mr` holds in a
/// live allocation (a stack with such pools: a pointer of another resource, or one freed);
/// as the pools' promotions.
pub fn promote(
    mr: &SharedResource,
    range: Option<ByteRange>,
    limit: Option<usize>,
) -> Result<PromoteReport> {
    let link = mr.link();
    if let Some((addr, _)) = range {
        if !link.sleep.is_empty() && link.sleep.block_at(addr).is_none() {
            return Err(Error::invalid(
                "buffer",
                format!(
                    "{addr:#x} is not inside a live allocation of the expandable pool(s) \
                     below, so it has no pages to promote; pass a buffer allocated from this \
                     resource (or no buffer: every spilled page)"
                ),
            ));
        }
    }
    let mut total = PromoteReport::default();
    let mut budget = limit;
    for pool in link.sleep.pools().iter() {
        let report = pool.promote(range, budget)?;
        budget = budget.map(|b| b.saturating_sub(report.promoted));
        total = total.plus(report);
    }
    Ok(total)
}

/// A safe point for every pool under `mr` (no work runs on their memory until this returns,
/// by the caller's contract): each moves its spilled pages back as far as the device has room,
/// where its auto promotion allows; the figures summed.
///
/// # Errors
/// The first pool's promotion error (the pools before it moved what they moved).
pub fn promote_at_safe_point(mr: &SharedResource) -> Result<PromoteReport> {
    let mut total = PromoteReport::default();
    for pool in mr.link().sleep.pools().iter() {
        total = total.plus(pool.promote_at_safe_point()?);
    }
    Ok(total)
}

/// The spill figures summed over the pools under `mr` that spill to host pages; `None` where
/// none does.
pub fn spill_figures(mr: &SharedResource) -> Option<SpillFigures> {
    mr.link()
        .sleep
        .pools()
        .iter()
        .filter_map(|p| p.spill_figures())
        .reduce(SpillFigures::plus)
}

/// Whether any pool under `mr` is asleep (false when there is none).
pub fn asleep(mr: &SharedResource) -> bool {
    mr.link().asleep()
}

/// The sleep estimate summed over the pools under `mr`.
///
/// # Errors
/// As [`sleep_targets`].
pub fn sleep_estimate(mr: &SharedResource) -> Result<SleepEstimate> {
    Ok(sleep_targets(mr)?
        .iter()
        .map(|p| p.estimate(&SleepPlan::default()))
        .fold(SleepEstimate::default(), SleepEstimate::plus))
}
