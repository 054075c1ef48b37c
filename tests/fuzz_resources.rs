//! A long-running fuzz of every suballocator and adaptor on simulated (and host) memory: random
//! sequences of allocations, frees on any stream, and bad frees (double, bogus, wrong size),
//! checked against a shadow model. Outside CI (`#[ignore]`); run it with
//!
//! ```text
//! RRMM_FUZZ_CASES=20000 cargo test --release --test fuzz_resources -- --ignored --nocapture
//! ```
//!
//! (`RRMM_FUZZ_CASES` cases per stack, default 256; `RRMM_FUZZ_STACK=name` runs the stacks whose
//! name contains `name` only; `RRMM_FUZZ_ALL_BAD_FREES=1` also sends bad frees to stacks marked
//! as not checking them (none today).)
//!
//! Checked after every operation: a non-zero request gives a non-null pointer aligned as
//! promised; no two live allocations overlap; a bad free is an error and changes nothing that a
//! later operation can see (the pointer stays live or stays freed); an error of a valid
//! operation is out of memory only. With host memory, every live allocation keeps its own
//! bytes (a pattern written at allocation is intact when it is freed). At the end everything is
//! freed, the stack is dropped and the simulated device is empty again.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rrmm::{
    AlignedResourceAdaptor, ArenaMemoryResource, BinningMemoryResource, CheckedResourceAdaptor,
    FailureCallbackResourceAdaptor, FixedSizeMemoryResource, LimitingResourceAdaptor,
    LoggingResourceAdaptor, MemoryResource, PoolMemoryResource, PrefetchResourceAdaptor,
    SharedResource, SimulatedMemoryResource, StatisticsResourceAdaptor, Stream,
    SystemMemoryResource, TrackingResourceAdaptor,
};
use std::collections::BTreeMap;
use std::sync::Arc;

const DEVICE: usize = 64 << 20;
const STREAMS: usize = 4;

fn stream(i: usize) -> Stream {
    match i % STREAMS {
        0 => Stream::DEFAULT,
        1 => Stream::PER_THREAD,
        // SAFETY: a key only: simulated and host memory without stream events never pass it
        // to the driver (host stacks use the default streams only, see `Stack::host`).
        i => unsafe { Stream::from_raw(0x1000 * i) },
    }
}

#[derive(Clone, Debug)]
enum Op {
    Alloc { bytes: usize, stream: usize },
    Free { pick: usize, stream: usize },
    DoubleFree { pick: usize },
    BogusFree { pick: usize, offset: usize },
    WrongSizeFree { pick: usize, bytes: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let bytes = prop_oneof![
        4 => 1usize..4096,
        3 => 4096usize..(256 << 10),
        1 => (256usize << 10)..(4 << 20),
        1 => Just(0usize),
    ];
    prop_oneof![
        8 => (bytes, 0..STREAMS).prop_map(|(bytes, stream)| Op::Alloc { bytes, stream }),
        6 => (any::<usize>(), 0..STREAMS).prop_map(|(pick, stream)| Op::Free { pick, stream }),
        1 => any::<usize>().prop_map(|pick| Op::DoubleFree { pick }),
        1 => (any::<usize>(), 1usize..64).prop_map(|(pick, offset)| Op::BogusFree { pick, offset }),
        1 => (any::<usize>(), 1usize..(1 << 20)).prop_map(|(pick, bytes)| Op::WrongSizeFree { pick, bytes }),
    ]
}

/// One resource stack under test.
struct Stack {
    name: &'static str,
    build: fn(SharedResource) -> rrmm::Result<SharedResource>,
    /// Whether the stack reports double and bogus frees (else they are not sent).
    checks_frees: bool,
    /// Over host memory (real bytes: patterns are written and checked; default streams only).
    host: bool,
    /// Alignment of requests of 1024 bytes or more.
    big_alignment: usize,
    /// Whether wrong-size frees are sent. Off for statistics over the pool: the pool checks a
    /// free's size only up to its 256-byte rounding, and statistics keeps its own figures per
    /// size, so a wrong size of the same rounding that the pool accepts skews them (and a later
    /// right free is refused).
    wrong_sizes: bool,
}

fn pool(up: SharedResource) -> rrmm::Result<SharedResource> {
    Ok(Arc::new(PoolMemoryResource::new(
        up,
        Some(1 << 20),
        Some(32 << 20),
    )?))
}

fn stacks() -> Vec<Stack> {
    let s = |name, build, checks_frees| Stack {
        name,
        build,
        checks_frees,
        host: false,
        big_alignment: 256,
        wrong_sizes: true,
    };
    vec![
        s("simulated", Ok, true),
        s("pool", pool, true),
        s(
            "fixed_size",
            |up| Ok(Arc::new(FixedSizeMemoryResource::new(up, 64 << 10, 8)?)),
            true,
        ),
        // Binning routes a free by its size: a bin's block freed with a size above every bin
        // reaches the pool, which must refuse it also where the pointer starts a bin's chunk.
        s(
            "binning(pool)",
            |up| {
                Ok(Arc::new(BinningMemoryResource::new(
                    pool(up)?,
                    Some(10),
                    Some(16),
                )?))
            },
            true,
        ),
        s(
            "arena",
            |up| {
                Ok(Arc::new(ArenaMemoryResource::new(
                    up,
                    Some(48 << 20),
                    false,
                )?))
            },
            true,
        ),
        s(
            "managed cache",
            |up| {
                Ok(Arc::new(rrmm::ManagedMemoryResource::over(
                    up,
                    Some(8 << 20),
                )))
            },
            true,
        ),
        s(
            "checked(simulated)",
            |up| Ok(Arc::new(CheckedResourceAdaptor::new(up))),
            true,
        ),
        s(
            "limiting(pool)",
            |up| Ok(Arc::new(LimitingResourceAdaptor::new(pool(up)?, 24 << 20))),
            true,
        ),
        s(
            "tracking(simulated)",
            |up| Ok(Arc::new(TrackingResourceAdaptor::new(up, false))),
            true,
        ),
        Stack {
            wrong_sizes: false,
            ..s(
                "statistics(pool)",
                |up| Ok(Arc::new(StatisticsResourceAdaptor::new(pool(up)?))),
                true,
            )
        },
        Stack {
            big_alignment: 4096,
            ..s(
                "aligned(pool)",
                |up| {
                    Ok(Arc::new(AlignedResourceAdaptor::new(
                        pool(up)?,
                        4096,
                        1024,
                    )?))
                },
                true,
            )
        },
        s(
            "failure_callback(pool)",
            |up| {
                Ok(Arc::new(FailureCallbackResourceAdaptor::new(
                    pool(up)?,
                    Box::new(|_| Ok(false)),
                )))
            },
            true,
        ),
        s(
            "logging(pool)",
            |up| {
                let path =
                    std::env::temp_dir().join(format!("rrmm_fuzz_{}.csv", std::process::id()));
                Ok(Arc::new(LoggingResourceAdaptor::new(
                    pool(up)?,
                    &path.to_string_lossy(),
                    false,
                )?))
            },
            true,
        ),
        s(
            "prefetch(pool)",
            |up| Ok(Arc::new(PrefetchResourceAdaptor::new(pool(up)?))),
            true,
        ),
        Stack {
            host: true,
            ..s(
                "tracking(checked(system))",
                |_| {
                    let system: SharedResource = Arc::new(SystemMemoryResource::new());
                    Ok(Arc::new(TrackingResourceAdaptor::new(
                        Arc::new(CheckedResourceAdaptor::new(system)),
                        false,
                    )))
                },
                true,
            )
        },
        Stack {
            host: true,
            ..s(
                "system",
                |_| Ok(Arc::new(SystemMemoryResource::new())),
                true,
            )
        },
    ]
}

struct Live {
    bytes: usize,
    stream: usize,
    tag: u8,
}

/// Writes `tag` at the first and last byte of a host allocation.
fn stamp(ptr: usize, bytes: usize, tag: u8) {
    // SAFETY: `ptr` is a live host allocation of `bytes` (> 0) bytes that this test owns.
    unsafe {
        *(ptr as *mut u8) = tag;
        *((ptr + bytes - 1) as *mut u8) = tag;
    }
}

fn stamped(ptr: usize, bytes: usize) -> (u8, u8) {
    // SAFETY: as in `stamp`.
    unsafe { (*(ptr as *const u8), *((ptr + bytes - 1) as *const u8)) }
}

fn nth_key<V>(map: &BTreeMap<usize, V>, pick: usize) -> Option<usize> {
    (!map.is_empty()).then(|| *map.keys().nth(pick % map.len()).unwrap_or(&0))
}

fn run_case(stack: &Stack, ops: &[Op], all_bad: bool) -> Result<(), TestCaseError> {
    let device = Arc::new(SimulatedMemoryResource::new(DEVICE));
    let mr = (stack.build)(device.clone()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut live: BTreeMap<usize, Live> = BTreeMap::new();
    let mut freed: Vec<(usize, usize)> = Vec::new();
    let mut tag = 0u8;
    let send_bad = stack.checks_frees || all_bad;
    let st = |i: usize| {
        if stack.host {
            Stream::DEFAULT
        } else {
            stream(i)
        }
    };
    for op in ops {
        match *op {
            Op::Alloc { bytes, stream } => match mr.allocate(bytes, st(stream)) {
                Ok(0) => prop_assert_eq!(bytes, 0, "null for a non-zero request"),
                Ok(ptr) => {
                    prop_assert!(bytes > 0, "a pointer for zero bytes");
                    let align = if bytes >= 1024 {
                        stack.big_alignment
                    } else {
                        256
                    };
                    prop_assert_eq!(ptr % align, 0, "alignment of {:#x}", ptr);
                    if let Some((&p, l)) = live.range(..ptr + bytes).next_back() {
                        prop_assert!(
                            p + l.bytes <= ptr,
                            "{:#x}+{} overlaps live {:#x}+{}",
                            ptr,
                            bytes,
                            p,
                            l.bytes
                        );
                    }
                    tag = tag.wrapping_add(1).max(1);
                    if stack.host {
                        stamp(ptr, bytes, tag);
                    }
                    freed.retain(|&(p, _)| p != ptr);
                    live.insert(ptr, Live { bytes, stream, tag });
                }
                Err(e) => prop_assert!(e.is_out_of_memory(), "allocate({}): {}", bytes, e),
            },
            Op::Free { pick, stream } => {
                let Some(ptr) = nth_key(&live, pick) else {
                    continue;
                };
                let l = live.remove(&ptr).unwrap_or(Live {
                    bytes: 0,
                    stream: 0,
                    tag: 0,
                });
                if stack.host {
                    prop_assert_eq!(stamped(ptr, l.bytes), (l.tag, l.tag), "bytes of {:#x}", ptr);
                }
                // Free on the allocation's stream or another one (both are valid).
                let on = if stream % 2 == 0 { l.stream } else { stream };
                // SAFETY: `ptr` is live with `l.bytes` in the model and freed once; nothing
                // uses it.
                let r = unsafe { mr.deallocate(ptr, l.bytes, st(on)) };
                prop_assert!(r.is_ok(), "free of live {:#x}: {:?}", ptr, r);
                freed.push((ptr, l.bytes));
            }
            Op::DoubleFree { pick } if send_bad => {
                if freed.is_empty() {
                    continue;
                }
                let (ptr, bytes) = freed[pick % freed.len()];
                // SAFETY: the stack checks frees (`checks_frees`): a double free is reported.
                let r = unsafe { mr.deallocate(ptr, bytes, Stream::DEFAULT) };
                prop_assert!(r.is_err(), "double free of {:#x} accepted", ptr);
            }
            Op::BogusFree { pick, offset } if send_bad => {
                // An address inside a live block, or past the device when nothing is live.
                let ptr = match nth_key(&live, pick) {
                    Some(p) => p + 256 * offset,
                    None => DEVICE * 4 + 256 * offset,
                };
                if live.contains_key(&ptr) {
                    continue;
                }
                // SAFETY: the stack checks frees: a pointer it never handed out is reported.
                let r = unsafe { mr.deallocate(ptr, 256, Stream::DEFAULT) };
                prop_assert!(r.is_err(), "bogus free of {:#x} accepted", ptr);
            }
            Op::WrongSizeFree { pick, bytes } if send_bad && stack.wrong_sizes => {
                let Some(ptr) = nth_key(&live, pick) else {
                    continue;
                };
                let right = live[&ptr].bytes;
                if bytes == right {
                    continue;
                }
                // SAFETY: the stack checks frees; a resource that checks the size only up to its
                // rounding (pool, simulated: 256 bytes) may accept it, which then frees the
                // block.
                let r = unsafe { mr.deallocate(ptr, bytes, st(live[&ptr].stream)) };
                match r {
                    Err(e) => {
                        prop_assert!(matches!(e, rrmm::Error::Logic(_)), "wrong-size free: {}", e)
                    }
                    Ok(()) => {
                        let l = live.remove(&ptr).unwrap_or(Live {
                            bytes: 0,
                            stream: 0,
                            tag: 0,
                        });
                        if stack.host {
                            prop_assert!(
                                false,
                                "host stack accepted a wrong size ({} for {})",
                                bytes,
                                l.bytes
                            );
                        }
                        freed.push((ptr, right));
                    }
                }
            }
            _ => {}
        }
    }
    for (ptr, l) in std::mem::take(&mut live) {
        if stack.host {
            prop_assert_eq!(stamped(ptr, l.bytes), (l.tag, l.tag), "bytes of {:#x}", ptr);
        }
        // SAFETY: live in the model, freed once.
        let r = unsafe { mr.deallocate(ptr, l.bytes, st(l.stream)) };
        prop_assert!(r.is_ok(), "final free of {:#x}: {:?}", ptr, r);
    }
    drop(mr);
    prop_assert_eq!(
        device.bytes_in_use(),
        0,
        "the device is not empty after the drop"
    );
    Ok(())
}

#[test]
#[ignore = "long fuzz run; RRMM_FUZZ_CASES=N cargo test --release --test fuzz_resources -- --ignored"]
fn fuzz_every_stack() {
    let cases: u32 = std::env::var("RRMM_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256);
    let all_bad = std::env::var_os("RRMM_FUZZ_ALL_BAD_FREES").is_some();
    let (mut total, mut ran) = (0u64, 0usize);
    let only = std::env::var("RRMM_FUZZ_STACK").unwrap_or_default();
    let mut failures = Vec::new();
    for stack in stacks().into_iter().filter(|s| s.name.contains(&only)) {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let started = std::time::Instant::now();
        let result = runner.run(&proptest::collection::vec(op(), 1..400), |ops| {
            run_case(&stack, &ops, all_bad)
        });
        total += u64::from(cases);
        ran += 1;
        match result {
            Ok(()) => println!(
                "{:<28} {cases} cases ok in {:.1?}",
                stack.name,
                started.elapsed()
            ),
            Err(e) => {
                println!("{:<28} FAILED: {e}", stack.name);
                failures.push(format!("{}: {e}", stack.name));
            }
        }
    }
    println!("fuzz: {total} cases over {ran} stacks");
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A short version that runs in CI: 16 cases per stack.
#[test]
fn fuzz_smoke() {
    for stack in stacks() {
        let mut runner = TestRunner::new(Config {
            cases: 16,
            failure_persistence: None,
            ..Config::default()
        });
        let result = runner.run(&proptest::collection::vec(op(), 1..200), |ops| {
            run_case(&stack, &ops, false)
        });
        assert!(result.is_ok(), "{}: {:?}", stack.name, result.err());
    }
}
