//! The share rules of one GPU used by several processes: each one's soft share, and whom a
//! process that ran out asks for what. Pure functions of the ledger's figures (no I/O), so the
//! rules are tested against a model.
//!
//! - A process's soft share is the bytes it asked for (`soft_share`), or an equal part of what
//!   the others' asked shares leave of the device.
//! - A process that runs out asks the others to give back the memory their pools keep free
//!   (a trim: cheap, safe, nobody's work stops), those above their soft share first.
//! - Only when the trims cannot cover what is missing are processes asked to sleep (their live
//!   data to host memory, addresses kept), and only processes that declared themselves idle
//!   and whose live bytes are above their soft share (what they hold once trimmed), the one
//!   furthest above its share first. A process at
//!   or under its share is never asked to sleep. Nobody is asked to sleep when even every
//!   eligible sleep would not cover the shortfall (it would move data for nothing).
//! - A hard limit is never passed: an allocation that would take the process past its own is
//!   refused before anyone is asked.

use serde::{Deserialize, Serialize};

/// One process as the ledger shows it (the part of its entry the rules read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    /// Its process id.
    pub pid: u32,
    /// Bytes in use (held and not cached).
    pub live: u64,
    /// Bytes its pools keep free (a trim gives them back).
    pub cached: u64,
    /// The soft share it asked for, if any.
    pub soft_share: Option<u64>,
    /// Its hard limit, if any.
    pub hard_limit: Option<u64>,
    /// Whether it declared itself idle (its pools may be put to sleep).
    pub idle: bool,
    /// Bytes of its data asleep on the host now (not on the device).
    pub asleep: u64,
}

impl Holder {
    /// Bytes it holds of the device: live and cached.
    pub fn held(&self) -> u64 {
        self.live.saturating_add(self.cached)
    }
}

/// The soft share of each holder (same order) on a device of `total` bytes: its own where it
/// asked for one (at most the device), else an equal part of what the asked shares leave.
pub fn soft_shares(total: u64, holders: &[Holder]) -> Vec<u64> {
    let asked: u64 = holders
        .iter()
        .filter_map(|h| h.soft_share)
        .fold(0u64, |sum, s| sum.saturating_add(s.min(total)));
    let unasked = holders.iter().filter(|h| h.soft_share.is_none()).count() as u64;
    let each = total
        .saturating_sub(asked)
        .checked_div(unasked)
        .unwrap_or(0);
    holders
        .iter()
        .map(|h| h.soft_share.map_or(each, |s| s.min(total)))
        .collect()
}

/// One thing a process is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Give back the memory its pools keep free (about `bytes`).
    Trim {
        /// The process asked.
        pid: u32,
        /// What it keeps free, as published.
        bytes: u64,
    },
    /// Sleep: its live data to host memory (about `bytes` freed on the device).
    Sleep {
        /// The process asked.
        pid: u32,
        /// What it holds, as published.
        bytes: u64,
    },
}

/// Whom to ask, in order, for a shortfall.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// The steps, trims first.
    pub steps: Vec<Step>,
    /// Whether the steps together cover the shortfall (as published).
    pub covers: bool,
}

/// Why an allocation is refused before anyone is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HardLimitRefusal {
    /// The process's hard limit.
    pub limit: u64,
    /// What it holds now.
    pub held: u64,
    /// What it asked for.
    pub bytes: u64,
}

/// Whether `me` (one of `holders`) may take `bytes` more without passing its hard limit.
///
/// # Errors
/// The refusal, with the figures, when it would pass it.
pub fn within_hard_limit(me: &Holder, bytes: u64) -> Result<(), HardLimitRefusal> {
    match me.hard_limit {
        Some(limit) if me.held().saturating_add(bytes) > limit => Err(HardLimitRefusal {
            limit,
            held: me.held(),
            bytes,
        }),
        _ => Ok(()),
    }
}

/// Whom process `me` asks, in order, when `shortfall` bytes are missing on a device of `total`
/// bytes that `holders` (every process of the ledger, `me` included) share.
pub fn plan(total: u64, holders: &[Holder], me: u32, shortfall: u64) -> Plan {
    let shares = soft_shares(total, holders);
    let others: Vec<(&Holder, u64)> = holders
        .iter()
        .zip(shares)
        .filter(|(h, _)| h.pid != me)
        .collect();
    let excess = |h: &Holder, share: u64| h.held().saturating_sub(share);

    let mut trims: Vec<(&Holder, u64)> = others
        .iter()
        .copied()
        .filter(|(h, _)| h.cached > 0)
        .collect();
    // Above their share first (furthest first), then by what they keep; pid breaks ties.
    trims.sort_by(|(a, sa), (b, sb)| {
        excess(b, *sb)
            .cmp(&excess(a, *sa))
            .then(b.cached.cmp(&a.cached))
            .then(a.pid.cmp(&b.pid))
    });
    let mut steps: Vec<Step> = Vec::new();
    let mut covered = 0u64;
    for (h, _) in &trims {
        if covered >= shortfall {
            break;
        }
        steps.push(Step::Trim {
            pid: h.pid,
            bytes: h.cached,
        });
        covered = covered.saturating_add(h.cached);
    }
    if covered >= shortfall {
        return Plan {
            steps,
            covers: true,
        };
    }

    let mut sleepers: Vec<(&Holder, u64)> = others
        .iter()
        .copied()
        .filter(|(h, share)| h.idle && h.live > *share)
        .collect();
    // Every trim ran before (they did not cover): a process holds its live bytes, and sleeps
    // are ordered by how far those are above its share.
    sleepers.sort_by(|(a, sa), (b, sb)| {
        b.live
            .saturating_sub(*sb)
            .cmp(&a.live.saturating_sub(*sa))
            .then(a.pid.cmp(&b.pid))
    });
    // A sleep frees what the process holds beyond the cache a trim before it already counted.
    let mut sleeps = Vec::new();
    let mut with_sleeps = covered;
    for (h, _) in &sleepers {
        if with_sleeps >= shortfall {
            break;
        }
        let trimmed = if steps.contains(&Step::Trim {
            pid: h.pid,
            bytes: h.cached,
        }) {
            h.cached
        } else {
            0
        };
        let frees = h.held() - trimmed;
        sleeps.push(Step::Sleep {
            pid: h.pid,
            bytes: frees,
        });
        with_sleeps = with_sleeps.saturating_add(frees);
    }
    if with_sleeps >= shortfall {
        steps.extend(sleeps);
        Plan {
            steps,
            covers: true,
        }
    } else {
        // Moving data would not make room: only the trims run.
        Plan {
            steps,
            covers: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn holder(pid: u32, live: u64, cached: u64, idle: bool) -> Holder {
        Holder {
            pid,
            live,
            cached,
            idle,
            ..Holder::default()
        }
    }

    #[test]
    fn shares_split_what_asked_shares_leave() {
        let mut a = holder(1, 0, 0, false);
        a.soft_share = Some(60);
        let b = holder(2, 0, 0, false);
        let c = holder(3, 0, 0, false);
        assert_eq!(soft_shares(100, &[a, b, c]), vec![60, 20, 20]);
        let mut big = holder(4, 0, 0, false);
        big.soft_share = Some(500);
        assert_eq!(
            soft_shares(100, &[big, holder(5, 0, 0, false)]),
            vec![100, 0]
        );
    }

    #[test]
    fn trims_come_first_and_cover_without_sleeps() {
        let me = holder(1, 10, 0, false);
        let a = holder(2, 20, 30, true);
        let b = holder(3, 60, 10, true);
        let p = plan(120, &[me, a, b], 1, 25);
        assert!(p.covers);
        assert_eq!(
            p.steps,
            vec![
                Step::Trim { pid: 3, bytes: 10 },
                Step::Trim { pid: 2, bytes: 30 }
            ],
            "the one above its share (3: 70 of 40) first"
        );
    }

    #[test]
    fn only_idle_processes_above_their_share_sleep() {
        // Device 90: shares 30 each.
        let me = holder(1, 0, 0, false);
        let busy_big = holder(2, 50, 0, false);
        let idle_small = holder(3, 30, 0, true);
        let mut holders = vec![me, busy_big, idle_small];
        let p = plan(90, &holders, 1, 10);
        assert!(!p.covers && p.steps.is_empty(), "{p:?}");
        holders.push(holder(4, 45, 0, true)); // idle and big
        let p = plan(90, &holders, 1, 10);
        assert_eq!(p.steps, vec![Step::Sleep { pid: 4, bytes: 45 }]);
    }

    #[test]
    fn the_hard_limit_refuses_before_anyone_is_asked() {
        let mut me = holder(1, 70, 10, false);
        me.hard_limit = Some(100);
        assert!(within_hard_limit(&me, 20).is_ok());
        let e = within_hard_limit(&me, 21).unwrap_err();
        assert_eq!((e.limit, e.held, e.bytes), (100, 80, 21));
    }

    /// A model of the rules, written the long way: every eligible trim, then every eligible
    /// sleep, and what they could free.
    fn model_can_cover(total: u64, holders: &[Holder], me: u32, shortfall: u64) -> bool {
        let shares = soft_shares(total, holders);
        let mut free = 0u64;
        for (h, share) in holders.iter().zip(&shares) {
            if h.pid == me {
                continue;
            }
            free += h.cached;
            if h.idle && h.live > *share {
                free += h.live;
            }
        }
        free >= shortfall
    }

    fn holders() -> impl Strategy<Value = Vec<Holder>> {
        prop::collection::vec(
            (
                0u64..100,
                0u64..100,
                proptest::option::of(0u64..200),
                any::<bool>(),
            ),
            1..8,
        )
        .prop_map(|rows| {
            rows.into_iter()
                .enumerate()
                .map(|(i, (live, cached, share, idle))| Holder {
                    soft_share: share,
                    ..holder(i as u32 + 1, live, cached, idle)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn plans_follow_the_rules(hs in holders(), total in 1u64..400, shortfall in 0u64..300) {
            let me = 1;
            let p = plan(total, &hs, me, shortfall);
            let shares = soft_shares(total, &hs);
            let share_of = |pid: u32| shares[hs.iter().position(|h| h.pid == pid).unwrap()];
            let of = |pid: u32| hs.iter().find(|h| h.pid == pid).unwrap();
            let mut seen_sleep = false;
            let mut asked = std::collections::HashSet::new();
            for step in &p.steps {
                match *step {
                    Step::Trim { pid, bytes } => {
                        prop_assert!(!seen_sleep, "a trim after a sleep: {:?}", p);
                        prop_assert!(pid != me);
                        prop_assert!(bytes > 0 && bytes == of(pid).cached);
                        prop_assert!(asked.insert(("trim", pid)));
                    }
                    Step::Sleep { pid, .. } => {
                        seen_sleep = true;
                        let h = of(pid);
                        prop_assert!(pid != me);
                        prop_assert!(h.idle, "a busy process asked to sleep");
                        prop_assert!(h.live > share_of(pid), "a process within its share asked to sleep");
                        prop_assert!(asked.insert(("sleep", pid)));
                    }
                }
            }
            // Sleeps only where they make the plan cover; covering exactly when the model can.
            if seen_sleep {
                prop_assert!(p.covers);
            }
            prop_assert_eq!(p.covers, model_can_cover(total, &hs, me, shortfall));
            // Among sleeps, the furthest above its share first.
            let excesses: Vec<u64> = p.steps.iter().filter_map(|s| match s {
                Step::Sleep { pid, .. } => Some(of(*pid).live.saturating_sub(share_of(*pid))),
                Step::Trim { .. } => None,
            }).collect();
            prop_assert!(excesses.windows(2).all(|w| w[0] >= w[1]), "{:?}", excesses);
        }

        #[test]
        fn shares_never_exceed_the_device_unless_asked(hs in holders(), total in 1u64..400) {
            let shares = soft_shares(total, &hs);
            let unasked: u64 = hs.iter().zip(&shares).filter(|(h, _)| h.soft_share.is_none()).map(|(_, s)| *s).sum();
            let asked: u64 = hs.iter().zip(&shares).filter(|(h, _)| h.soft_share.is_some()).map(|(_, s)| *s).sum();
            prop_assert!(unasked <= total.saturating_sub(asked.min(total)));
            for (h, s) in hs.iter().zip(&shares) {
                prop_assert!(*s <= total);
                if let Some(asked) = h.soft_share { prop_assert_eq!(*s, asked.min(total)); }
            }
        }
    }
}
