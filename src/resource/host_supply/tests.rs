use super::*;
use proptest::prelude::*;

const MIB: usize = 1 << 20;

/// A supply of its own (the process's is shared by every test).
fn fresh() -> &'static HostPageSupply {
    Box::leak(Box::new(HostPageSupply::default()))
}

/// Writes a pattern over the pages and reads it back: real bytes.
fn write_and_check(pages: &HostPages, seed: u8) {
    // SAFETY: the pages are committed, `len()` bytes from `addr()`, and this lease is the
    // only user.
    let bytes = unsafe { std::slice::from_raw_parts_mut(pages.addr() as *mut u8, pages.len()) };
    for (i, b) in bytes.iter_mut().enumerate().step_by(4096) {
        *b = seed.wrapping_add(i as u8);
    }
    assert!(bytes
        .iter()
        .enumerate()
        .step_by(4096)
        .all(|(i, &b)| b == seed.wrapping_add(i as u8)));
}

#[test]
fn a_range_given_back_is_taken_again_ready() {
    let supply = fresh();
    let first = supply.take(PageSpec::plain(), 3 * MIB).unwrap();
    assert!(!first.was_ready());
    assert!(first.len() >= 3 * MIB);
    write_and_check(&first, 1);
    let addr = first.addr();
    drop(first);
    assert_eq!(supply.figures().free_ranges, 1);
    // A smaller take (at least half its size) is served by the free range too, ready.
    let again = supply.take(PageSpec::plain(), 2 * MIB).unwrap();
    assert!(again.was_ready());
    assert_eq!(again.addr(), addr);
    write_and_check(&again, 2);
    let f = supply.figures();
    assert_eq!((f.reused, f.made_ranges, f.free_ranges), (1, 1, 0));
    assert_eq!(f.leased_bytes, again.len());
    drop(again);
    // A take of less than half a free range's size does not hold it: it makes its own.
    let small = supply.take(PageSpec::plain(), MIB).unwrap();
    assert!(!small.was_ready() && small.len() < 3 * MIB);
}

#[test]
fn the_keep_limit_and_give_back_return_pages_to_the_os() {
    let supply = fresh();
    let a = supply.take(PageSpec::plain(), 2 * MIB).unwrap();
    let b = supply.take(PageSpec::plain(), 4 * MIB).unwrap();
    drop((a, b));
    // By default one copy's worth is kept: the largest range handed out (4 MiB) stays, the
    // smaller one goes.
    assert_eq!(supply.figures().free_bytes, 4 * MIB);
    assert_eq!(supply.figures().largest_leased, 4 * MIB);
    supply.set_keep_limit(Some(usize::MAX));
    let b = supply.take(PageSpec::plain(), 4 * MIB).unwrap();
    assert!(b.was_ready());
    let a = supply.take(PageSpec::plain(), 2 * MIB).unwrap();
    drop((a, b));
    assert_eq!(supply.figures().free_bytes, 6 * MIB);
    // Keeping 3 MiB: the 4 MiB range does not fit and goes, the 2 MiB one stays.
    assert_eq!(supply.give_back(3 * MIB), 4 * MIB);
    assert_eq!(supply.figures().free_bytes, 2 * MIB);
    supply.set_keep_limit(Some(0));
    let f = supply.figures();
    assert_eq!((f.free_bytes, f.given_back_bytes), (0, 8 * MIB as u64));
    // With a limit of 0, a returned range goes to the OS.
    drop(supply.take(PageSpec::plain(), MIB).unwrap());
    assert_eq!(supply.figures().free_ranges, 0);
    // A lease can ask for it too, whatever the limit.
    supply.set_keep_limit(None);
    let mut c = supply.take(PageSpec::plain(), MIB).unwrap();
    c.give_back_on_drop();
    drop(c);
    assert_eq!(supply.figures().free_ranges, 0);
}

#[test]
fn a_range_made_ahead_is_what_the_take_gets() {
    let supply = fresh();
    supply.prepare(PageSpec::plain(), 8 * MIB);
    // Asked again while it is made: nothing more is made.
    supply.prepare(PageSpec::plain(), 4 * MIB);
    let pages = supply.take(PageSpec::plain(), 8 * MIB).unwrap();
    assert!(pages.was_ready(), "the take waits for the range being made");
    supply.wait_prepared();
    let f = supply.figures();
    assert_eq!(
        (f.made_ranges, f.made_on_take, f.preparing_bytes),
        (1, 0, 0)
    );
    write_and_check(&pages, 3);
}

#[test]
fn more_than_the_host_has_is_refused_before_anything_is_touched() {
    let supply = fresh();
    let err = supply.take(PageSpec::plain(), 1 << 60).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    let f = supply.figures();
    assert_eq!((f.made_ranges, f.leased_bytes, f.free_bytes), (0, 0, 0));
    // Ahead of need: the failure leaves nothing behind.
    supply.prepare(PageSpec::plain(), 1 << 60);
    supply.wait_prepared();
    assert_eq!(supply.figures(), f);
}

#[test]
fn threads_take_and_return_disjoint_ranges() {
    let supply = fresh();
    // Every range kept: each thread's next take finds one ready.
    supply.set_keep_limit(Some(usize::MAX));
    let live = std::sync::Mutex::new(Vec::<(usize, usize)>::new());
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let live = &live;
            s.spawn(move || {
                for round in 0..20usize {
                    let pages = supply
                        .take(PageSpec::plain(), (1 + (round + t as usize) % 3) * MIB)
                        .unwrap();
                    let me = (pages.addr(), pages.len());
                    {
                        let mut l = live.lock().unwrap();
                        assert!(l.iter().all(|&(a, n)| a + n <= me.0 || me.0 + me.1 <= a));
                        l.push(me);
                    }
                    write_and_check(&pages, t);
                    live.lock().unwrap().retain(|&r| r != me);
                }
            });
        }
    });
    let f = supply.figures();
    assert_eq!(f.leased_bytes, 0);
    assert!(f.made_ranges <= 12, "ranges are reused: {f:?}");
}

/// The model of `over`: the largest ranges that fit in `keep` stay.
fn keep_largest(free: &mut Vec<usize>, keep: usize) {
    free.sort_unstable_by(|a, b| b.cmp(a));
    let mut kept = 0;
    free.retain(|&b| {
        let fits = kept + b <= keep;
        if fits {
            kept += b;
        }
        fits
    });
}

#[derive(Clone, Debug)]
enum Op {
    Take(usize),
    Drop(usize),
    GiveBack(usize),
    Keep(Option<usize>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..5).prop_map(Op::Take),
        3 => any::<usize>().prop_map(Op::Drop),
        1 => (0usize..6).prop_map(Op::GiveBack),
        1 => prop::option::of(0usize..6).prop_map(Op::Keep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Generated takes, returns, give-backs and limits against a model: leased bytes are the
    /// live leases', free bytes never pass the keep limit after a return, a take is ready
    /// exactly when a free range held it, and live leases never overlap.
    #[test]
    fn the_supply_matches_a_model(ops in prop::collection::vec(op(), 1..40)) {
        let supply = fresh();
        let mut leases: Vec<HostPages> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut keep: Option<usize> = None;
        let mut largest = 0usize;
        for op in ops {
            match op {
                Op::Take(mib) => {
                    let fits = free
                        .iter()
                        .copied()
                        .filter(|&b| b >= mib * MIB && b / 2 <= mib * MIB)
                        .min();
                    let pages = supply.take(PageSpec::plain(), mib * MIB).unwrap();
                    prop_assert_eq!(pages.was_ready(), fits.is_some());
                    largest = largest.max(pages.len());
                    if let Some(b) = fits {
                        let i = free.iter().position(|&x| x == b).unwrap();
                        free.swap_remove(i);
                    }
                    for l in &leases {
                        prop_assert!(l.addr() + l.len() <= pages.addr()
                            || pages.addr() + pages.len() <= l.addr());
                    }
                    leases.push(pages);
                }
                Op::Drop(i) if !leases.is_empty() => {
                    let pages = leases.swap_remove(i % leases.len());
                    free.push(pages.len());
                    drop(pages);
                    keep_largest(&mut free, keep.map_or(largest, |k| k * MIB));
                }
                Op::Drop(_) => {}
                Op::GiveBack(k) => {
                    supply.give_back(k * MIB);
                    keep_largest(&mut free, k * MIB);
                }
                Op::Keep(k) => {
                    keep = k;
                    supply.set_keep_limit(k.map(|k| k * MIB));
                    if let Some(k) = k {
                        keep_largest(&mut free, k * MIB);
                    }
                }
            }
            let f = supply.figures();
            prop_assert_eq!(f.leased_bytes, leases.iter().map(HostPages::len).sum::<usize>());
            prop_assert_eq!(f.free_bytes, free.iter().sum::<usize>());
        }
    }
}
