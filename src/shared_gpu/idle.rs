//! Idle and busy, sleep and wake: a process declared idle may be asked to put its expandable
//! pools to sleep ([`Member::sleep_for`], on the member's worker thread,
//! [`super::answering`]); declared busy again, what the ledger put to sleep wakes
//! ([`Member::set_idle`]). The one place of the ledger's sleep and wake semantics.

use super::entry::{now, Event};
use super::member::Member;
use super::rules;
use crate::error::{Error, Result};
use crate::resource::sleep::{DiscardFill, SleepPlan, Sleeper};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Member {
    /// Declares the process idle (its pools may be put to sleep when others need the memory)
    /// or busy (pools the ledger put to sleep wake now); the bytes woken.
    ///
    /// # Errors
    /// The first wake's error (the pool stays asleep and wakes at its next use).
    pub fn set_idle(&self, idle: bool) -> Result<u64> {
        self.idle.store(idle, Ordering::Release);
        self.dirty.store(true, Ordering::Release);
        let mut woken = 0;
        let mut first = None;
        if !idle {
            let slept: Vec<(Arc<dyn Sleeper>, u64)> = self.slept.lock().drain(..).collect();
            let started = Instant::now();
            for (pool, bytes) in slept {
                if !pool.asleep() {
                    continue;
                }
                if pool.wake_for_use() {
                    woken += bytes;
                } else {
                    first.get_or_insert_with(|| {
                        Error::Logic("shared GPU: a pool put to sleep could not wake yet".into())
                    });
                    self.slept.lock().push((pool, bytes));
                }
            }
            if woken > 0 {
                self.record(Event {
                    at: now(),
                    kind: "woke".into(),
                    peer: 0,
                    bytes: woken,
                    given: woken,
                    seconds: started.elapsed().as_secs_f64(),
                    note: String::new(),
                });
            }
        }
        self.publish();
        first.map_or(Ok(woken), Err)
    }

    /// Bytes the ledger's sleeps keep on the host now (pools woken since are forgotten).
    pub(super) fn asleep_bytes(&self) -> u64 {
        let mut slept = self.slept.lock();
        slept.retain(|(pool, _)| pool.asleep());
        slept.iter().map(|(_, b)| *b).sum()
    }

    /// Answers a request to sleep: only when idle and above its share (checked here, whatever
    /// the asker thought); the bytes freed, or why none.
    pub(super) fn sleep_for(&self) -> (u64, String) {
        if !self.idle() {
            return (0, "busy (not declared idle)".into());
        }
        let mut given = self.give();
        let holders = self.holders(&self.dir.list(self.total));
        let shares = rules::soft_shares(self.total, &holders);
        let (Some(me), Some(&share)) = (holders.last(), shares.last()) else {
            return (given, String::new());
        };
        if me.live <= share {
            return (
                given,
                format!("at or under its soft share ({} of {share} bytes)", me.live),
            );
        }
        let Some(resource) = self.resource.lock().clone() else {
            return (given, "no pool of this process can sleep".into());
        };
        let sleepers = resource.link().sleep.sleepers().to_vec();
        if sleepers.is_empty() {
            return (
                given,
                "its pools cannot sleep (only the expandable pool can)".into(),
            );
        }
        let plan = SleepPlan {
            wake_on_use: true,
            ..SleepPlan::with_fill(DiscardFill::Undefined)
        };
        let mut note = String::new();
        for pool in sleepers {
            if pool.asleep() {
                continue;
            }
            match pool.offload(&plan) {
                Ok(estimate) => {
                    given += estimate.released_bytes as u64;
                    self.slept.lock().push((
                        pool,
                        (estimate.copied_bytes + estimate.discarded_bytes) as u64,
                    ));
                }
                Err(e) => note = format!("a pool could not sleep: {e}"),
            }
        }
        (given, note)
    }
}
