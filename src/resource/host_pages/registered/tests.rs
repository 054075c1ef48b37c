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

#[test]
fn a_copy_spans_the_ranges_made_as_its_need_grew() {
    let supply = fresh();
    let spec = PageSpec::plain();
    // A need that grows: each ask makes only what the ranges before lack.
    assert_eq!(supply.prepare_total(spec, 4 * MIB), 4 * MIB);
    supply.wait_prepared();
    assert_eq!(supply.prepare_total(spec, 10 * MIB), 6 * MIB);
    supply.wait_prepared();
    assert_eq!(supply.prepare_total(spec, 9 * MIB), 0, "held already");
    let f = supply.figures();
    assert_eq!(
        (f.made_ranges, f.free_bytes, f.ready_target),
        (2, 10 * MIB, 10 * MIB)
    );
    let copy = supply.take_spanning(spec, 9 * MIB).unwrap();
    assert_eq!(copy.len(), 2, "both ranges");
    assert!(copy.iter().all(HostPages::was_ready));
    for (i, pages) in copy.iter().enumerate() {
        write_and_check(pages, i as u8);
    }
    drop(copy);
    // One copy's worth (the ready target) stays: nothing given back.
    let f = supply.figures();
    assert_eq!((f.free_bytes, f.given_back_bytes), (10 * MIB, 0));
    // A larger need takes both and makes only the rest.
    let copy = supply.take_spanning(spec, 13 * MIB).unwrap();
    assert_eq!(copy.iter().map(HostPages::len).sum::<usize>(), 13 * MIB);
    assert_eq!(copy.iter().filter(|p| !p.was_ready()).count(), 1);
    assert_eq!(supply.figures().made_bytes, 13 * MIB as u64);
}

/// A supply of its own holding ranges made ahead for the totals asked in turn (each made and
/// waited for but the last, which may still be being made).
fn grown(totals: &[usize]) -> (&'static HostPageSupply, PageSpec) {
    let (supply, spec) = (fresh(), PageSpec::plain());
    for (i, &total) in totals.iter().enumerate() {
        supply.prepare_total(spec, total);
        if i + 1 < totals.len() {
            supply.wait_prepared();
        }
    }
    (supply, spec)
}

#[test]
fn a_copy_waits_for_the_ranges_being_made_for_it() {
    let (supply, spec) = grown(&[3 * MIB, 8 * MIB]);
    let copy = supply.take_spanning(spec, 8 * MIB).unwrap();
    assert!(
        copy.iter().all(HostPages::was_ready),
        "waited, made nothing"
    );
    assert_eq!(supply.figures().made_on_take, 0);
}

#[test]
fn a_host_copy_maps_its_offsets_across_ranges() {
    use crate::resource::HostCopy;
    let (supply, spec) = grown(&[2 * MIB, 5 * MIB]);
    supply.wait_prepared();
    let copy = HostCopy::take(supply, Some(spec), 5 * MIB).unwrap();
    let HostCopy::Supplied(ranges) = &copy else {
        panic!("pages")
    };
    assert_eq!(ranges.len(), 2);
    let (a, b) = (&ranges[0], &ranges[1]);
    // A piece across the boundary is two spans, each in its range.
    let spans = copy.host_spans(a.len() - 100, 300);
    assert_eq!(
        spans,
        Some(vec![(a.addr() + a.len() - 100, 100), (b.addr(), 200)])
    );
    assert_eq!(
        copy.host_spans(a.len() + 7, 5),
        Some(vec![(b.addr() + 7, 5)])
    );
    assert_eq!(copy.len(), 5 * MIB);
    assert_eq!(
        HostCopy::take(supply, None, 9).unwrap().host_spans(3, 4),
        None,
        "no host memory behind simulated pages"
    );
}

#[derive(Clone, Debug)]
enum Op {
    Take(usize),
    TakeSpanning(usize),
    PrepareTotal(usize),
    Drop(usize),
    GiveBack(usize),
    Keep(Option<usize>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..5).prop_map(Op::Take),
        2 => (1usize..12).prop_map(Op::TakeSpanning),
        1 => (1usize..12).prop_map(Op::PrepareTotal),
        3 => any::<usize>().prop_map(Op::Drop),
        1 => (0usize..6).prop_map(Op::GiveBack),
        1 => prop::option::of(0usize..6).prop_map(Op::Keep),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    /// Generated takes (of one range or over several), ranges made ahead, returns, give-backs
    /// and limits against a model: leased bytes are the live leases', free bytes never pass the
    /// keep limit after a return, a take is ready exactly when free ranges held it, one made
    /// ahead or taken over several ranges makes only what is lacking, and live leases never
    /// overlap.
    #[test]
    fn the_supply_matches_a_model(ops in prop::collection::vec(op(), 1..40)) {
        let supply = fresh();
        let spec = PageSpec::plain();
        let mut leases: Vec<Vec<HostPages>> = Vec::new();
        let mut free: Vec<usize> = Vec::new();
        let mut keep: Option<usize> = None;
        let (mut largest, mut target) = (0usize, 0usize);
        let single_fit = |free: &[usize], bytes: usize| {
            free.iter().copied().filter(|&b| b >= bytes && b / 2 <= bytes).min()
        };
        for op in ops {
            match op {
                Op::Take(mib) => {
                    let fits = single_fit(&free, mib * MIB);
                    let pages = supply.take(spec, mib * MIB).unwrap();
                    prop_assert_eq!(pages.was_ready(), fits.is_some());
                    largest = largest.max(pages.len());
                    if let Some(b) = fits {
                        let i = free.iter().position(|&x| x == b).unwrap();
                        free.swap_remove(i);
                    }
                    leases.push(vec![pages]);
                }
                Op::TakeSpanning(mib) => {
                    let bytes = mib * MIB;
                    let pages = supply.take_spanning(spec, bytes).unwrap();
                    let mut want: Vec<usize> = Vec::new();
                    if let Some(b) = single_fit(&free, bytes) {
                        let i = free.iter().position(|&x| x == b).unwrap();
                        want.push(free.swap_remove(i));
                    } else {
                        free.sort_unstable_by(|a, b| b.cmp(a));
                        while want.iter().sum::<usize>() < bytes && !free.is_empty() {
                            want.push(free.remove(0));
                        }
                        let lacking = bytes.saturating_sub(want.iter().sum());
                        if lacking > 0 {
                            want.push(lacking);
                        }
                    }
                    let mut got: Vec<usize> = pages.iter().map(HostPages::len).collect();
                    got.sort_unstable();
                    want.sort_unstable();
                    prop_assert_eq!(&got, &want);
                    prop_assert!(got.iter().sum::<usize>() >= bytes);
                    largest = largest.max(got.iter().sum());
                    leases.push(pages);
                }
                Op::PrepareTotal(mib) => {
                    let total = mib * MIB;
                    let lacking = total.saturating_sub(free.iter().sum());
                    prop_assert_eq!(supply.prepare_total(spec, total), lacking);
                    supply.wait_prepared();
                    if lacking > 0 {
                        free.push(lacking);
                    }
                    target = target.max(total);
                }
                Op::Drop(i) if !leases.is_empty() => {
                    for pages in leases.swap_remove(i % leases.len()) {
                        free.push(pages.len());
                        drop(pages);
                        keep_largest(&mut free, keep.map_or(largest.max(target), |k| k * MIB));
                    }
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
            let live: Vec<&HostPages> = leases.iter().flatten().collect();
            prop_assert_eq!(f.leased_bytes, live.iter().map(|p| p.len()).sum::<usize>());
            prop_assert_eq!(f.free_bytes, free.iter().sum::<usize>());
            for (i, a) in live.iter().enumerate() {
                for b in &live[i + 1..] {
                    prop_assert!(a.addr() + a.len() <= b.addr() || b.addr() + b.len() <= a.addr());
                }
            }
        }
    }
}
