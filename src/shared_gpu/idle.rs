//! Idle and busy, sleep and wake: a process declared idle may be asked to put its expandable
//! pools to sleep ([`Member::sleep_for`], on the member's worker thread,
//! [`super::answering`]); declared busy again, what the ledger put to sleep wakes
//! ([`Member::set_idle`]). The one place of the ledger's sleep and wake semantics.
//!
//! The ledger keeps no copy of what it put to sleep: the pools do (their movement state, cause
//! [`SleepCause::Ledger`]), found through the member's resource and the process's index of
//! sleeping pools ([`index::pools_asleep`]), so joining again, or a resource set meanwhile,
//! forgets nothing. The ledger's sleep is abandoned, every byte in place, once the process is
//! busy again (its plan reads the idle flag between chunks), and a declaration of busy returns
//! only once the sleep in flight is done or abandoned and every pool asleep for the ledger is
//! awake again.

use super::entry::{now, Event};
use super::member::Member;
use super::rules;
use crate::error::Result;
use crate::resource::sleep::{index, MovingPool, SleepCause, SleepPlan};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Member {
    /// Declares the process idle (its pools may be put to sleep when others need the memory)
    /// or busy: then a sleep for the ledger in flight is abandoned, and every pool asleep for
    /// the ledger wakes before this returns; the bytes woken.
    ///
    /// # Errors
    /// The first wake's error (that pool stays asleep with its data on the host, and wakes at
    /// its next use or the next declaration of busy).
    pub fn set_idle(&self, idle: bool) -> Result<u64> {
        self.idle.store(idle, Ordering::SeqCst);
        self.dirty.store(true, Ordering::Release);
        let mut woken = 0u64;
        let mut first = None;
        if !idle {
            // A sleep in flight reads the flag between its chunks and gives up; wait for it.
            let _ordered = self.moving.lock();
            let started = Instant::now();
            for pool in self.ledger_pools() {
                let before = pool.movement();
                match pool.wake(Some(SleepCause::Ledger)) {
                    Ok(true) if before.cause == Some(SleepCause::Ledger) => {
                        woken += before.offloaded_bytes as u64;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        first.get_or_insert(e);
                    }
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

    /// The pools the ledger may have put to sleep: those under the member's resource, and any
    /// other of its place asleep for the ledger (a resource set since), each once.
    fn ledger_pools(&self) -> Vec<Arc<dyn MovingPool>> {
        let mut pools: Vec<Arc<dyn MovingPool>> = self
            .resource
            .lock()
            .clone()
            .map(|r| r.link().sleep.pools().to_vec())
            .unwrap_or_default();
        for p in index::pools_asleep(self.place, SleepCause::Ledger) {
            if !pools.iter().any(|q| q.identity() == p.identity()) {
                pools.push(p);
            }
        }
        pools
    }

    /// Bytes of live data the ledger's sleeps keep on the host now (the pools' own figures).
    pub(super) fn asleep_bytes(&self) -> u64 {
        self.ledger_pools()
            .iter()
            .map(|p| p.movement())
            .filter(|m| m.cause == Some(SleepCause::Ledger))
            .map(|m| m.offloaded_bytes as u64)
            .sum()
    }

    /// Answers a request to sleep: only when idle and above its share (checked here, whatever
    /// the asker thought); the bytes freed, or why none. Each pool's offload is abandoned (every
    /// byte in place) once the process is busy again.
    pub(super) fn sleep_for(&self) -> (u64, String) {
        let _ordered = self.moving.lock();
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
        let pools = resource.link().sleep.pools();
        if pools.is_empty() {
            return (
                given,
                "its pools cannot sleep (only the expandable pool can)".into(),
            );
        }
        let idle = self.idle.clone();
        let plan = SleepPlan::for_ledger(Arc::new(move || idle.load(Ordering::SeqCst)));
        let mut note = String::new();
        for pool in pools.iter() {
            if pool.asleep() {
                continue;
            }
            match pool.offload(&plan) {
                Ok(estimate) => given += estimate.released_bytes as u64,
                Err(e) => note = format!("a pool could not sleep: {e}"),
            }
        }
        (given, note)
    }
}
